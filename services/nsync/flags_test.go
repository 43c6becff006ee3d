package nsync_test

import (
	"flag"
	"testing"

	"github.com/gavel-sched/gavel/services/nsync"
)

// TestFlagNamesKept: every flag the command had before its flags moved to Config.Flags is
// still there (deployments and docs use them).
func TestFlagNamesKept(t *testing.T) {
	c := nsync.Default()
	fs := flag.NewFlagSet("nsync", flag.ContinueOnError)
	c.Flags(fs)
	for _, name := range []string{"listen", "tls-cert", "tls-key", "tls-ca", "insecure", "bbs-address", "bbs-cert", "bbs-key", "bbs-ca", "bbs-insecure", "bbs-server-name", "etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca", "etcd-insecure", "log-level", "log-format", "stacks", "plugin", "bulk-interval", "domain-ttl", "restart-timeout", "route-drain", "lock-ttl", "metrics-address"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s is gone", name)
		}
	}
}
