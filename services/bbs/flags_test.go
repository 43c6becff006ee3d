package bbs_test

import (
	"flag"
	"testing"

	"github.com/gavel-sched/gavel/services/bbs"
)

// TestFlagNamesKept: every flag the command had before its flags moved to Config.Flags is
// still there (deployments and docs use them).
func TestFlagNamesKept(t *testing.T) {
	c := bbs.Default()
	fs := flag.NewFlagSet("bbs", flag.ContinueOnError)
	c.Flags(fs)
	for _, name := range []string{"listen", "tls-cert", "tls-key", "tls-ca", "insecure", "etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca", "etcd-insecure", "log-level", "log-format", "auctioneer-address", "convergence-interval", "unclaimed-timeout", "claimed-timeout", "etcd-unreachable-timeout", "write-timeout", "pending-task-timeout", "completed-task-timeout", "metrics-address", "transformer", "lock-ttl"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s is gone", name)
		}
	}
}
