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
	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/services/nsync"
)

func main() { servicemain.Main("nsync", run) }

func run(args []string) error {
	cfg := nsync.Default()
	fs := servicemain.NewFlagSet("nsync")
	fs.StringVar(&cfg.ListenAddress, "listen", cfg.ListenAddress, "gRPC listen address")
	config.TLSFlags(fs, &cfg.TLS, "tls", "insecure", "server")
	bbsclient.Flags(fs, &cfg.Config)
	fs.Var(config.List{Values: &cfg.EtcdEndpoints}, "etcd-endpoints", "comma-separated etcd client URLs (nsync's records)")
	config.TLSFlags(fs, &cfg.EtcdTLS, "etcd", "etcd-insecure", "etcd client")
	fs.Var(config.JSONMap{Values: &cfg.Stacks}, "stacks", `stacks as JSON name→rootfs URI, e.g. '{"cflinuxfs4":"preloaded:cflinuxfs4"}'`)
	fs.Var(transform.Flag{Plugins: &cfg.Plugins}, "plugin", "transformer plugin NAME=SOCKET[,kinds=desired_lrp+task][,timeout=2s][,failure_policy=fail|ignore][,check_determinism=true][,max_concurrency=32] run on what nsync builds; repeat for a chain, in order (see docs/plugins.md)")
	fs.Var(&cfg.BulkInterval, "bulk-interval", "time between bulk passes of the leader")
	fs.Var(&cfg.DomainTTL, "domain-ttl", "how long cf-apps stays fresh after a complete bulk pass")
	fs.Var(&cfg.RestartTimeout, "restart-timeout", "how long a restart waits for the new version to run")
	fs.Var(&cfg.RouteDrain, "route-drain", "how long a restarted app's old version runs unrouted before it is removed")
	fs.Var(&cfg.LockTTL, "lock-ttl", "lease of the bulk loop's leadership")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "serve Prometheus /metrics on this address (empty: off)")
	config.LogFlags(fs, &cfg.Log)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("nsync", cfg.Log)
	etcd, err := etcdx.Connect(cfg.EtcdEndpoints, cfg.EtcdTLS, logger.Named("etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	conn, err := bbsclient.Dial(cfg.Config)
	if err != nil {
		return err
	}
	defer conn.Close()
	svc, err := nsync.New(cfg, logger, etcd, bbsv1.NewBBSServiceClient(conn), nil)
	if err != nil {
		return err
	}
	return servicemain.ServeUntilSignal(logger, "nsync", svc)
}
