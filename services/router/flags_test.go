package router_test

import (
	"flag"
	"testing"

	"github.com/gavel-sched/gavel/services/router"
)

// TestFlagNamesKept: every flag the command had before its flags moved to Config.Flags is
// still there (deployments and docs use them).
func TestFlagNamesKept(t *testing.T) {
	c := router.Default()
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	c.Flags(fs)
	for _, name := range []string{"http", "https", "https-cert", "https-key", "https-redirect-port", "admin", "routeemitter-address", "routeemitter-cert", "routeemitter-key", "routeemitter-ca", "routeemitter-insecure", "tcp-bind", "backend-dial-timeout", "backend-response-timeout", "udp-session-idle-timeout", "log-level", "log-format"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s is gone", name)
		}
	}
}
