package nsync

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/pkg/transform"
)

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		c := Default()
		c.TLS, c.BBSTLS, c.EtcdTLS = tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}
		return c
	}
	tests := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"default with plaintext", func(*Config) {}, ""},
		{"no stacks", func(c *Config) { c.Stacks = nil }, "stacks: at least one stack"},
		{"upper-case stack", func(c *Config) { c.Stacks = map[string]string{"CFLinuxFS4": "preloaded:cflinuxfs4"} }, "lower case"},
		{"bad rootfs", func(c *Config) { c.Stacks = map[string]string{"x": "no-scheme"} }, "stacks[x]"},
		{"domain ttl not above the interval", func(c *Config) { c.DomainTTL = c.BulkInterval }, "domain_ttl"},
		{"no bbs", func(c *Config) { c.BBSAddress = "" }, "bbs_address"},
		{"encryption active label without key", func(c *Config) {
			c.Encryption = sealing.Config{ActiveKeyLabel: "k2", Keys: []sealing.KeyFile{{Label: "k1", File: "/k1.key"}}}
		}, `encryption.active_key_label "k2" has no key`},
		{"no etcd", func(c *Config) { c.EtcdEndpoints = nil }, "etcd_endpoints"},
		{"zero drain", func(c *Config) { c.RouteDrain = 0 }, "route_drain must be positive"},
		{"tls missing", func(c *Config) { c.TLS = tlsx.Config{} }, "tls:"},
		{"unknown role", func(c *Config) { c.Authz.Roles = map[string]string{"spiffe://x/ops": "operator"} }, `authz: roles: spiffe://x/ops: unknown role "operator"`},
		{"bad plugin name", func(c *Config) { c.Plugins = []transform.PluginConfig{{Name: "Net_1", Socket: "/s"}} }, `plugins: transformers[0]: transformer "Net_1": name "Net_1" must be a lower-case DNS subdomain`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.edit(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nsync.json")
	if err := os.WriteFile(path, []byte(`{"stacks":{"lucid64":"preloaded:lucid64"},"bulk_interval":"5s","route_drain":"1s"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if c.Stacks["lucid64"] != "preloaded:lucid64" || len(c.Stacks) != 1 || time.Duration(c.BulkInterval) != 5*time.Second || time.Duration(c.RouteDrain) != time.Second {
		t.Fatalf("loaded %+v", c)
	}
}
