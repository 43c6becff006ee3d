package routeemitter_test

import (
	"flag"
	"testing"

	"github.com/gavel-sched/gavel/services/routeemitter"
)

// TestFlagNamesKept: every flag the command had before its flags moved to Config.Flags is
// still there (deployments and docs use them).
func TestFlagNamesKept(t *testing.T) {
	c := routeemitter.Default()
	fs := flag.NewFlagSet("routeemitter", flag.ContinueOnError)
	c.Flags(fs)
	for _, name := range []string{"listen", "tls-cert", "tls-key", "tls-ca", "insecure", "bbs-address", "bbs-cert", "bbs-key", "bbs-ca", "bbs-insecure", "bbs-server-name", "log-level", "log-format", "sync-interval", "metrics-address"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s is gone", name)
		}
	}
}
