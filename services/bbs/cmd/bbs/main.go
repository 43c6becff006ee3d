// Command bbs runs Gavel's BBS: the API of record over etcd.
//
//	bbs -config bbs.json
//	bbs -listen :8889 -etcd-endpoints https://etcd-0:2379 -tls-cert bbs.crt -tls-key bbs.key -tls-ca ca.crt \
//	    -etcd-cert bbs-etcd.crt -etcd-key bbs-etcd.key -etcd-ca etcd-ca.crt
package main

import (
	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/services/bbs"
)

func main() { servicemain.Main("bbs", run) }

func run(args []string) error {
	cfg := bbs.Default()
	fs := servicemain.NewFlagSet("bbs")
	fs.StringVar(&cfg.ListenAddress, "listen", cfg.ListenAddress, "gRPC listen address")
	config.TLSFlags(fs, &cfg.TLS, "tls", "insecure", "server (also presented to the auctioneer and reps)")
	fs.Var(config.List{Values: &cfg.EtcdEndpoints}, "etcd-endpoints", "comma-separated etcd client URLs")
	config.TLSFlags(fs, &cfg.EtcdTLS, "etcd", "etcd-insecure", "etcd client")
	fs.StringVar(&cfg.AuctioneerAddress, "auctioneer-address", "", "auctioneer gRPC address for placing new work; several comma-separated addresses of HA auctioneers: the leader among them is followed")
	fs.Var(&cfg.ConvergenceInterval, "convergence-interval", "time between convergence passes of the leader")
	fs.Var(&cfg.UnclaimedTimeout, "unclaimed-timeout", "re-auction instances UNCLAIMED (and retry pending tasks and callbacks) after this long")
	fs.Var(&cfg.ClaimedTimeout, "claimed-timeout", "unclaim and re-auction instances CLAIMED this long on a present cell without being reported running")
	fs.Var(&cfg.EtcdUnreachableTimeout, "etcd-unreachable-timeout", "answer a write Unavailable (never made) when etcd cannot be reached for this long")
	fs.Var(&cfg.WriteTimeout, "write-timeout", "answer a write sent to etcd but not confirmed this long DeadlineExceeded (may have been made)")
	fs.Var(&cfg.PendingTaskTimeout, "pending-task-timeout", "fail tasks not started within this long")
	fs.Var(&cfg.CompletedTaskTimeout, "completed-task-timeout", "delete completed tasks not resolved within this long")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "serve Prometheus /metrics on this address (empty: off)")
	fs.Var(transform.Flag{Plugins: &cfg.Transformers}, "transformer", "transformer plugin NAME=SOCKET[,kinds=desired_lrp+task][,timeout=2s][,failure_policy=fail|ignore][,check_determinism=true][,max_concurrency=32]; repeat for a chain, in order (see docs/plugins.md)")
	config.LogFlags(fs, &cfg.Log)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("bbs", cfg.Log)
	etcd, err := etcdx.Connect(cfg.EtcdEndpoints, cfg.EtcdTLS, logger.Named("etcd"))
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
