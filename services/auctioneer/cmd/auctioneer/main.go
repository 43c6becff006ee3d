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
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/services/auctioneer"
)

func main() { servicemain.Main("auctioneer", run) }

func run(args []string) error {
	cfg := auctioneer.Default()
	fs := servicemain.NewFlagSet("auctioneer")
	cfg.Flags(fs)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("auctioneer", cfg.Log)
	stopTracing, err := servicemain.StartTracing(logger, "auctioneer", cfg.Tracing)
	if err != nil {
		return err
	}
	defer stopTracing()
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
	svc, err := auctioneer.New(cfg, logger, etcd, bbsv1.NewBBSServiceClient(bbsConn))
	if err != nil {
		return err
	}
	return servicemain.ServeUntilSignal(logger, "auctioneer", svc)
}
