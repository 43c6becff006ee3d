// Command rep runs Gavel's cell agent: it registers the cell in etcd, serves State/Perform to
// the auctioneer and runs work through an executor backend.
//
//	rep -config rep.json
//	rep --cell-id cell-z1-0 --zone z1 --tags staging,skynet \
//	    --preloaded-rootfses '{"cflinuxfs4":"/var/gavel/rootfs/cflinuxfs4"}' \
//	    --supported-root-fs-providers docker --memory-mb 8192 --disk-mb 65536 --containers 250 \
//	    --backend process --listen :1800 --bbs-address bbs:8889 --etcd-endpoints https://etcd-0:2379 ...
//
// With --backend sim --sim-cells N it is a sim host for scale runs: N simulated cells in one
// process (cell-id-0000 on), each a whole rep with its own listener, presence and identity
// ({cell} in the certificate paths), stopped at once by SIGINT or SIGTERM:
//
//	rep --backend sim --sim-cells 100 --cell-id rack-3 --listen 127.0.0.1:0 //	    --tls-cert pki/rep/{cell}.crt --tls-key pki/rep/{cell}.key ...
//
// SIGTERM and SIGUSR1 evacuate the cell (its instances are started elsewhere before they stop)
// and then exit; SIGINT, or a second SIGTERM, exits at once (rep.Service.ServeUntilSignal).
package main

import (
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/services/rep"
)

func main() { servicemain.Main("rep", run) }

func run(args []string) error {
	cfg := rep.Default()
	fs := servicemain.NewFlagSet("rep")
	cfg.Flags(fs)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("rep", cfg.Log).With("cell_id", cfg.CellID)
	stopTracing, err := servicemain.StartTracing(logger, "rep", cfg.Tracing)
	if err != nil {
		return err
	}
	defer stopTracing()
	if cfg.Sim.Cells > 1 {
		host, err := rep.NewSimHost(cfg, logger)
		if err != nil {
			return err
		}
		return host.ServeUntilSignal()
	}
	etcd, err := cfg.Etcd.Connect(logger.Named("etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	bbsConn, err := bbsclient.Dial(cfg.Config)
	if err != nil {
		return err // bbsclient.Dial names the BBS client
	}
	defer bbsConn.Close()
	svc, err := rep.New(cfg, logger, etcd, bbsv1.NewBBSServiceClient(bbsConn))
	if err != nil {
		return err
	}
	return svc.ServeUntilSignal()
}
