// Command routeemitter runs Gavel's route-emitter: it follows the BBS and serves the routing
// table to routers.
//
//	routeemitter -config routeemitter.json
//	routeemitter -listen :8893 -tls-cert re.crt -tls-key re.key -tls-ca ca.crt \
//	    -bbs-address bbs:8889 -bbs-cert re-bbs.crt -bbs-key re-bbs.key -bbs-ca ca.crt
package main

import (
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/services/routeemitter"
)

func main() { servicemain.Main("routeemitter", run) }

func run(args []string) error {
	cfg := routeemitter.Default()
	fs := servicemain.NewFlagSet("routeemitter")
	cfg.Flags(fs)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("routeemitter", cfg.Log)
	stopTracing, err := servicemain.StartTracing(logger, "routeemitter", cfg.Tracing)
	if err != nil {
		return err
	}
	defer stopTracing()
	conn, err := bbsclient.Dial(cfg.Config)
	if err != nil {
		return err
	}
	defer conn.Close()
	svc, err := routeemitter.New(cfg, logger, bbsv1.NewBBSServiceClient(conn))
	if err != nil {
		return err
	}
	return servicemain.ServeUntilSignal(logger, "routeemitter", svc, "table_id", svc.TableID())
}
