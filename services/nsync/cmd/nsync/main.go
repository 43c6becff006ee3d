// Command nsync runs Gavel's nsync: the bridge from a platform's apps, stacks and placement
// pools to the BBS.
//
//	nsync -config nsync.json
//	nsync -listen :8895 -tls-cert nsync.crt -tls-key nsync.key -tls-ca ca.crt \
//	    -bbs-address bbs:8889 -bbs-cert nsync-bbs.crt -bbs-key nsync-bbs.key -bbs-ca ca.crt \
//	    -etcd-endpoints https://etcd:2379 -etcd-cert … \
//	    -stacks '{"cflinuxfs4":"preloaded:cflinuxfs4"}'
package main

import (
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/services/nsync"
)

func main() { servicemain.Main("nsync", run) }

func run(args []string) error {
	cfg := nsync.Default()
	fs := servicemain.NewFlagSet("nsync")
	cfg.Flags(fs)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("nsync", cfg.Log)
	stopTracing, err := servicemain.StartTracing(logger, "nsync", cfg.Tracing)
	if err != nil {
		return err
	}
	defer stopTracing()
	etcd, err := cfg.Etcd.Connect(logger.Named("etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	conn, err := bbsclient.Dial(cfg.Config)
	if err != nil {
		return err
	}
	defer conn.Close()
	svc, err := nsync.New(cfg, logger, etcd, bbsv1.NewBBSServiceClient(conn))
	if err != nil {
		return err
	}
	return servicemain.ServeUntilSignal(logger, "nsync", svc)
}
