package integration

import (
	"flag"
	"testing"

	"github.com/gavel-sched/gavel/services/auctioneer"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/nsync"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/routeemitter"
	"github.com/gavel-sched/gavel/services/router"
)

// TestFlagNamesKept: every flag each command had before its flags moved to its Config.Flags is
// still registered (deployments and docs use them).
func TestFlagNamesKept(t *testing.T) {
	bind := func(flags func(*flag.FlagSet)) *flag.FlagSet {
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		flags(fs)
		return fs
	}
	auctioneerCfg, bbsCfg, nsyncCfg, repCfg := auctioneer.Default(), bbs.Default(), nsync.Default(), rep.Default()
	emitterCfg, routerCfg := routeemitter.Default(), router.Default()
	for _, tc := range []struct {
		service string
		flags   *flag.FlagSet
		names   []string
	}{
		{"auctioneer", bind(auctioneerCfg.Flags), []string{"listen", "tls-cert", "tls-key", "tls-ca", "insecure", "bbs-address", "bbs-cert", "bbs-key", "bbs-ca", "bbs-insecure", "bbs-server-name", "rep-cert", "rep-key", "rep-ca", "rep-insecure", "etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca", "etcd-insecure", "log-level", "log-format", "batch-interval", "cell-state-timeout", "cell-state-max-age", "perform-timeout", "max-inflight-starts", "lock-ttl", "metrics-address"}},
		{"bbs", bind(bbsCfg.Flags), []string{"listen", "tls-cert", "tls-key", "tls-ca", "insecure", "etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca", "etcd-insecure", "log-level", "log-format", "auctioneer-address", "convergence-interval", "unclaimed-timeout", "claimed-timeout", "etcd-unreachable-timeout", "write-timeout", "pending-task-timeout", "completed-task-timeout", "metrics-address", "transformer", "lock-ttl"}},
		{"nsync", bind(nsyncCfg.Flags), []string{"listen", "tls-cert", "tls-key", "tls-ca", "insecure", "bbs-address", "bbs-cert", "bbs-key", "bbs-ca", "bbs-insecure", "bbs-server-name", "etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca", "etcd-insecure", "log-level", "log-format", "stacks", "plugin", "bulk-interval", "domain-ttl", "restart-timeout", "route-drain", "lock-ttl", "metrics-address"}},
		{"rep", bind(repCfg.Flags), []string{"cell-id", "zone", "tags", "preloaded-rootfses", "supported-root-fs-providers", "memory-mb", "disk-mb", "containers", "backend", "listen", "advertise-address", "cell-address", "tls-cert", "tls-key", "tls-ca", "insecure", "bbs-address", "bbs-cert", "bbs-key", "bbs-ca", "bbs-insecure", "bbs-server-name", "etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca", "etcd-insecure", "log-level", "log-format", "lease-ttl", "port-range", "work-dir", "run-as-user", "chroot-preloaded", "insecure-registries", "on-create-hooks", "on-destroy-hooks", "sim-start-latency", "sim-crash-rate", "containerd-socket", "containerd-namespace", "containerd-runtime", "cni-conf-dir", "cni-bin-dir", "bulk-interval", "evacuation-timeout", "metrics-address"}},
		{"routeemitter", bind(emitterCfg.Flags), []string{"listen", "tls-cert", "tls-key", "tls-ca", "insecure", "bbs-address", "bbs-cert", "bbs-key", "bbs-ca", "bbs-insecure", "bbs-server-name", "log-level", "log-format", "sync-interval", "metrics-address"}},
		{"router", bind(routerCfg.Flags), []string{"http", "https", "https-cert", "https-key", "https-redirect-port", "admin", "routeemitter-address", "routeemitter-cert", "routeemitter-key", "routeemitter-ca", "routeemitter-insecure", "tcp-bind", "backend-dial-timeout", "backend-response-timeout", "udp-session-idle-timeout", "log-level", "log-format"}},
	} {
		for _, name := range tc.names {
			if tc.flags.Lookup(name) == nil {
				t.Errorf("%s: flag -%s is gone", tc.service, name)
			}
		}
	}
}
