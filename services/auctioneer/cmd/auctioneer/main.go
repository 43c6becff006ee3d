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
	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/services/auctioneer"
)

func main() { servicemain.Main("auctioneer", run) }

func run(args []string) error {
	cfg := auctioneer.Default()
	fs := servicemain.NewFlagSet("auctioneer")
	fs.StringVar(&cfg.ListenAddress, "listen", cfg.ListenAddress, "gRPC listen address")
	config.TLSFlags(fs, &cfg.TLS, "tls", "insecure", "server")
	bbsclient.Flags(fs, &cfg.Config)
	config.TLSFlags(fs, &cfg.RepTLS, "rep", "rep-insecure", "rep client")
	fs.Var(config.List{Values: &cfg.EtcdEndpoints}, "etcd-endpoints", "comma-separated etcd client URLs")
	config.TLSFlags(fs, &cfg.EtcdTLS, "etcd", "etcd-insecure", "etcd client")
	fs.Var(&cfg.BatchInterval, "batch-interval", "batch window between auction rounds")
	fs.Var(&cfg.CellStateTimeout, "cell-state-timeout", "timeout of each cell's State call")
	fs.Var(&cfg.CellStateMaxAge, "cell-state-max-age", "how long a cell's last known state (from its last Perform or State) stands in for a State call (0: ask every round)")
	fs.Var(&cfg.PerformTimeout, "perform-timeout", "timeout of each cell's Perform call")
	fs.IntVar(&cfg.MaxInflightStarts, "max-inflight-starts", cfg.MaxInflightStarts, "most containers starting at once (0: unlimited)")
	fs.Var(&cfg.LockTTL, "lock-ttl", "leader election lease TTL")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "serve Prometheus metrics at http://ADDRESS/metrics (empty: none)")
	config.LogFlags(fs, &cfg.Log)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("auctioneer", cfg.Log)
	etcd, err := etcdx.Connect(cfg.EtcdEndpoints, cfg.EtcdTLS, logger.Named("etcd"))
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
