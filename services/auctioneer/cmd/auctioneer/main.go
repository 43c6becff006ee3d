// Command auctioneer runs Gavel's placement service. Several may run; the one elected through
// etcd places work, the others stand by.
//
//	auctioneer -config auctioneer.json
//	auctioneer -listen :8890 -bbs-address bbs:8889 -etcd-endpoints https://etcd-0:2379 \
//	    -tls-cert auctioneer.crt -tls-key auctioneer.key -tls-ca ca.crt \
//	    -bbs-cert auctioneer-client.crt -bbs-key auctioneer-client.key -bbs-ca ca.crt \
//	    -rep-cert auctioneer-client.crt -rep-key auctioneer-client.key -rep-ca ca.crt \
//	    -etcd-cert auctioneer-etcd.crt -etcd-key auctioneer-etcd.key -etcd-ca etcd-ca.crt
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/auctioneer"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "auctioneer:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cfg := auctioneer.Default()
	fs := flag.NewFlagSet("auctioneer", flag.ContinueOnError)
	fs.String("config", "", "JSON config file (see services/auctioneer/README.md); flags override it")
	fs.StringVar(&cfg.ListenAddress, "listen", cfg.ListenAddress, "gRPC listen address")
	tlsFlags(fs, &cfg.TLS, "tls", "server", "CA that client certificates must chain to")
	fs.BoolVar(&cfg.TLS.Insecure, "insecure", false, "serve plaintext gRPC (development only)")
	fs.StringVar(&cfg.BBSAddress, "bbs-address", cfg.BBSAddress, "BBS gRPC address, or several comma-separated BBS addresses")
	tlsFlags(fs, &cfg.BBSTLS, "bbs", "BBS client", "BBS CA")
	fs.BoolVar(&cfg.BBSTLS.Insecure, "bbs-insecure", false, "talk plaintext to the BBS (development only)")
	tlsFlags(fs, &cfg.RepTLS, "rep", "rep client", "rep CA")
	fs.BoolVar(&cfg.RepTLS.Insecure, "rep-insecure", false, "talk plaintext to reps (development only)")
	fs.Var(config.List{Values: &cfg.EtcdEndpoints}, "etcd-endpoints", "comma-separated etcd client URLs")
	tlsFlags(fs, &cfg.EtcdTLS, "etcd", "etcd client", "etcd CA")
	fs.BoolVar(&cfg.EtcdTLS.Insecure, "etcd-insecure", false, "talk plaintext to etcd (development only)")
	fs.Var(&cfg.BatchInterval, "batch-interval", "batch window between auction rounds")
	fs.Var(&cfg.CellStateTimeout, "cell-state-timeout", "timeout of each cell's State call")
	fs.Var(&cfg.PerformTimeout, "perform-timeout", "timeout of each cell's Perform call")
	fs.IntVar(&cfg.MaxInflightStarts, "max-inflight-starts", cfg.MaxInflightStarts, "most containers starting at once (0: unlimited)")
	fs.Var(&cfg.LockTTL, "lock-ttl", "leader election lease TTL")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "serve Prometheus metrics at http://ADDRESS/metrics (empty: none)")
	fs.StringVar(&cfg.Log.Level, "log-level", cfg.Log.Level, "trace|debug|info|warn|error")
	fs.StringVar(&cfg.Log.Format, "log-format", cfg.Log.Format, "text|json")
	if err := config.Parse(fs, args, "config", cfg.LoadFile); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}

	logger := logging.New("auctioneer", cfg.Log)
	etcdTLS, err := cfg.EtcdTLS.ClientTLS()
	if err != nil {
		return fmt.Errorf("etcd tls: %w", err)
	}
	etcd, err := etcdx.NewClient(etcdx.Config{Endpoints: cfg.EtcdEndpoints, TLS: etcdTLS}, logger.Named("etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	bbsConn, err := grpcx.DialMulti(cfg.BBSTargets(), grpcx.ClientConfig{TLS: cfg.BBSTLS})
	if err != nil {
		return fmt.Errorf("bbs client: %w", err)
	}
	defer bbsConn.Close()
	svc, err := auctioneer.New(cfg, logger, etcd, bbsv1.NewBBSServiceClient(bbsConn))
	if err != nil {
		return err
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	return lifecycle.Run(ctx, logger, lifecycle.Member{Name: "auctioneer", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
		return svc.Run(ctx, func() {
			logger.Info("auctioneer serving", "address", svc.Addr().String())
			ready()
		})
	})})
}

// tlsFlags binds -<prefix>-cert, -<prefix>-key and -<prefix>-ca to t.
func tlsFlags(fs *flag.FlagSet, t *tlsx.Config, prefix, who, ca string) {
	fs.StringVar(&t.CertFile, prefix+"-cert", "", who+" certificate (PEM)")
	fs.StringVar(&t.KeyFile, prefix+"-key", "", who+" key (PEM)")
	fs.StringVar(&t.CAFile, prefix+"-ca", "", ca+" (PEM)")
}
