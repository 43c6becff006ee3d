package auctioneer_test

import (
	"flag"
	"testing"

	"github.com/gavel-sched/gavel/services/auctioneer"
)

// TestFlagNamesKept: every flag the command had before its flags moved to Config.Flags is
// still there (deployments and docs use them).
func TestFlagNamesKept(t *testing.T) {
	c := auctioneer.Default()
	fs := flag.NewFlagSet("auctioneer", flag.ContinueOnError)
	c.Flags(fs)
	for _, name := range []string{"listen", "tls-cert", "tls-key", "tls-ca", "insecure", "bbs-address", "bbs-cert", "bbs-key", "bbs-ca", "bbs-insecure", "bbs-server-name", "rep-cert", "rep-key", "rep-ca", "rep-insecure", "etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca", "etcd-insecure", "log-level", "log-format", "batch-interval", "cell-state-timeout", "cell-state-max-age", "perform-timeout", "max-inflight-starts", "lock-ttl", "metrics-address"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s is gone", name)
		}
	}
}
