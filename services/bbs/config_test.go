package bbs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/pkg/transform"
)

func TestConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bbs.json")
	body := `{
  "listen_address": ":8889",
  "tls": {"cert_file": "bbs.crt", "key_file": "bbs.key", "ca_file": "ca.crt"},
  "etcd_endpoints": ["https://etcd-0:2379"],
  "etcd_tls": {"insecure": true},
  "log": {"level": "debug", "format": "json"},
  "bookmark_interval": "3s"
}`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	if err := cfg.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if cfg.TLS.CertFile != "bbs.crt" || cfg.TLS.CAFile != "ca.crt" || !cfg.EtcdTLS.Insecure || cfg.Log.Format != "json" ||
		time.Duration(cfg.BookmarkInterval) != 3*time.Second || cfg.MaxInstances != Default().MaxInstances {
		t.Fatalf("loaded %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no tls choice", func(c *Config) {}, "tls:"},
		{"no listen", func(c *Config) { c.ListenAddress = "" }, "listen_address"},
		{"no etcd", func(c *Config) { c.EtcdEndpoints = nil }, "etcd_endpoints"},
		{"max instances", func(c *Config) { c.MaxInstances = 0 }, "max_instances"},
		{"bad log level", func(c *Config) { c.Log.Level = "loud" }, "log:"},
		{"bookmark", func(c *Config) { c.BookmarkInterval = 0 }, "bookmark_interval"},
		{"convergence interval", func(c *Config) { c.ConvergenceInterval = 0 }, "convergence_interval"},
		{"unclaimed timeout", func(c *Config) { c.UnclaimedTimeout = -1 }, "unclaimed_timeout"},
		{"claimed timeout", func(c *Config) { c.ClaimedTimeout = 0 }, "claimed_timeout"},
		{"pending task timeout", func(c *Config) { c.PendingTaskTimeout = 0 }, "pending_task_timeout"},
		{"completed task timeout", func(c *Config) { c.CompletedTaskTimeout = 0 }, "completed_task_timeout"},
		{"transformer name", func(c *Config) { c.Transformers = []transform.PluginConfig{{Name: "Net_1", Socket: "/s"}} }, `transformers[0]: transformer "Net_1": name "Net_1" must be a lower-case DNS subdomain`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			if tt.name != "no tls choice" {
				c.TLS.Insecure, c.EtcdTLS.Insecure = true, true
			}
			tt.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
