package auctioneer_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/auctioneer"
)

func insecureDefault() auctioneer.Config {
	c := auctioneer.Default()
	for _, t := range []*tlsx.Config{&c.TLS, &c.BBSTLS, &c.RepTLS, &c.EtcdTLS} {
		t.Insecure = true
	}
	return c
}

func TestConfigDefaultsAndFile(t *testing.T) {
	c := auctioneer.Default()
	if time.Duration(c.BatchInterval) != 50*time.Millisecond || time.Duration(c.CellStateTimeout) != 2*time.Second || c.MaxInflightStarts != 3000 {
		t.Fatalf("defaults %+v", c)
	}
	if err := insecureDefault().Validate(); err != nil {
		t.Fatalf("insecure default invalid: %v", err)
	}
	path := filepath.Join(t.TempDir(), "auctioneer.json")
	if err := os.WriteFile(path, []byte(`{"listen_address": ":9999", "batch_interval": "200ms", "cell_state_timeout": "5s",
		"max_inflight_starts": 50, "bbs_address": "bbs:8889", "etcd_endpoints": ["http://etcd:2379"], "log": {"level": "debug"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if c.ListenAddress != ":9999" || time.Duration(c.BatchInterval) != 200*time.Millisecond || time.Duration(c.CellStateTimeout) != 5*time.Second ||
		c.MaxInflightStarts != 50 || c.BBSAddress != "bbs:8889" || c.Log.Level != "debug" || time.Duration(c.PerformTimeout) != 10*time.Second {
		t.Fatalf("loaded %+v", c)
	}
	if err := os.WriteFile(path, []byte(`{"batch_interval": 50}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.LoadFile(path); err == nil || !strings.Contains(err.Error(), "duration") {
		t.Fatalf("numeric duration accepted: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*auctioneer.Config)
		want   string
	}{
		{"no listen address", func(c *auctioneer.Config) { c.ListenAddress = "" }, "listen_address"},
		{"no bbs", func(c *auctioneer.Config) { c.BBSAddress = "" }, "bbs_address"},
		{"no etcd", func(c *auctioneer.Config) { c.EtcdEndpoints = nil }, "etcd_endpoints"},
		{"rep tls incomplete", func(c *auctioneer.Config) { c.RepTLS = tlsx.Config{CertFile: "c"} }, "rep_tls"},
		{"zero batch interval", func(c *auctioneer.Config) { c.BatchInterval = 0 }, "batch_interval"},
		{"zero state timeout", func(c *auctioneer.Config) { c.CellStateTimeout = 0 }, "cell_state_timeout"},
		{"zero perform timeout", func(c *auctioneer.Config) { c.PerformTimeout = 0 }, "perform_timeout"},
		{"negative in-flight limit", func(c *auctioneer.Config) { c.MaxInflightStarts = -1 }, "max_inflight_starts"},
		{"short lock ttl", func(c *auctioneer.Config) { c.LockTTL = auctioneer.Duration(time.Millisecond) }, "lock_ttl"},
		{"bad log level", func(c *auctioneer.Config) { c.Log.Level = "loud" }, "log"},
	}
	for _, tc := range tests {
		c := insecureDefault()
		tc.change(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	if _, err := auctioneer.New(auctioneer.Config{}, nil, nil, nil); err == nil {
		t.Error("New accepted an empty config")
	}
}
