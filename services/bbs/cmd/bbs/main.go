// Command bbs runs Gavel's BBS: the API of record over etcd.
//
//	bbs -config bbs.json
//	bbs -listen :8889 -etcd-endpoints https://etcd-0:2379 -tls-cert bbs.crt -tls-key bbs.key -tls-ca ca.crt \
//	    -etcd-cert bbs-etcd.crt -etcd-key bbs-etcd.key -etcd-ca etcd-ca.crt
package main

import (
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/services/bbs"
)

func main() { servicemain.Main("bbs", run) }

func run(args []string) error {
	cfg := bbs.Default()
	fs := servicemain.NewFlagSet("bbs")
	cfg.Flags(fs)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("bbs", cfg.Log)
	stopTracing, err := servicemain.StartTracing(logger, "bbs", cfg.Tracing)
	if err != nil {
		return err
	}
	defer stopTracing()
	etcd, err := cfg.Etcd.Connect(logger.Named("etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	svc, err := bbs.New(cfg, logger, etcd)
	if err != nil {
		return err
	}
	return servicemain.ServeUntilSignal(logger, "bbs", svc)
}
