package rep_test

import (
	"flag"
	"testing"

	"github.com/gavel-sched/gavel/services/rep"
)

// TestFlagNamesKept: every flag the command had before its flags moved to Config.Flags is
// still there (deployments and docs use them).
func TestFlagNamesKept(t *testing.T) {
	c := rep.Default()
	fs := flag.NewFlagSet("rep", flag.ContinueOnError)
	c.Flags(fs)
	for _, name := range []string{"cell-id", "zone", "tags", "preloaded-rootfses", "supported-root-fs-providers", "memory-mb", "disk-mb", "containers", "backend", "listen", "advertise-address", "cell-address", "tls-cert", "tls-key", "tls-ca", "insecure", "bbs-address", "bbs-cert", "bbs-key", "bbs-ca", "bbs-insecure", "bbs-server-name", "etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca", "etcd-insecure", "log-level", "log-format", "lease-ttl", "port-range", "work-dir", "run-as-user", "chroot-preloaded", "insecure-registries", "on-create-hooks", "on-destroy-hooks", "sim-start-latency", "sim-crash-rate", "bulk-interval", "evacuation-timeout", "metrics-address"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s is gone", name)
		}
	}
}
