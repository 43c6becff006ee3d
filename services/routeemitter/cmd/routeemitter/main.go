// Command routeemitter runs Gavel's route-emitter: it follows the BBS and serves the routing
// table to routers.
//
//	routeemitter -config routeemitter.json
//	routeemitter -listen :8893 -tls-cert re.crt -tls-key re.key -tls-ca ca.crt \
//	    -bbs-address bbs:8889 -bbs-cert re-bbs.crt -bbs-key re-bbs.key -bbs-ca ca.crt
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/config"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/services/routeemitter"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "routeemitter:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cfg := routeemitter.Default()
	fs := flag.NewFlagSet("routeemitter", flag.ContinueOnError)
	fs.String("config", "", "JSON config file (see services/routeemitter/README.md); flags override it")
	fs.StringVar(&cfg.ListenAddress, "listen", cfg.ListenAddress, "gRPC listen address")
	config.TLSFlags(fs, &cfg.TLS, "tls", "insecure", "server")
	bbsclient.Flags(fs, &cfg.Config)
	fs.Var(&cfg.SyncInterval, "sync-interval", "how often the whole BBS is listed again")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "serve Prometheus metrics at http://ADDRESS/metrics (empty: none)")
	config.LogFlags(fs, &cfg.Log)
	if err := config.Parse(fs, args, "config", cfg.LoadFile); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}

	logger := logging.New("routeemitter", cfg.Log)
	conn, err := bbsclient.Dial(cfg.Config)
	if err != nil {
		return err
	}
	defer conn.Close()
	svc, err := routeemitter.New(cfg, logger, bbsv1.NewBBSServiceClient(conn))
	if err != nil {
		return err
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	return lifecycle.Run(ctx, logger, lifecycle.Member{Name: "routeemitter", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
		return svc.Run(ctx, func() {
			logger.Info("route-emitter serving", "address", svc.Addr().String(), "table_id", svc.TableID())
			ready()
		})
	})})
}
