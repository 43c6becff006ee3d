package router

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

func TestConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "router.json")
	body := `{
  "http_address": ":80",
  "https_address": ":443",
  "https_cert_file": "router.crt",
  "https_key_file": "router.key",
  "routeemitter_address": "route-emitter:8893",
  "routeemitter_tls": {"cert_file": "c.crt", "key_file": "c.key", "ca_file": "ca.crt"},
  "tcp_bind_address": "10.0.0.5",
  "backend_dial_timeout": "2s",
  "udp_session_idle_timeout": "1m",
  "log": {"level": "debug", "format": "json"}
}`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	if err := cfg.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTPSAddress != ":443" || cfg.RouteEmitterTLS.CAFile != "ca.crt" || cfg.TCPBindAddress != "10.0.0.5" ||
		time.Duration(cfg.BackendDialTimeout) != 2*time.Second || time.Duration(cfg.UDPSessionIdleTimeout) != time.Minute ||
		cfg.AdminAddress != Default().AdminAddress || cfg.Log.Format != "json" {
		t.Fatalf("loaded %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.LoadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Fatal("missing file loaded")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no emitter", func(c *Config) { c.RouteEmitterAddress = "" }, "routeemitter_address is required"},
		{"no tls choice", func(c *Config) { c.RouteEmitterTLS.Insecure = false }, "routeemitter_tls:"},
		{"bad http", func(c *Config) { c.HTTPAddress = "8080" }, "http_address"},
		{"https without cert", func(c *Config) { c.HTTPSAddress = ":8443" }, "must be set together"},
		{"cert without https", func(c *Config) { c.HTTPSCertFile = "x.crt" }, "must be set together"},
		{"redirect port", func(c *Config) { c.HTTPSRedirectPort = 70000 }, "https_redirect_port"},
		{"bind not an ip", func(c *Config) { c.TCPBindAddress = "localhost" }, "tcp_bind_address"},
		{"dial timeout", func(c *Config) { c.BackendDialTimeout = 0 }, "backend_dial_timeout"},
		{"response timeout", func(c *Config) { c.BackendResponseTimeout = -1 }, "backend_response_timeout"},
		{"backoff order", func(c *Config) { c.ReconnectMaxBackoff = Duration(time.Millisecond) }, "reconnect_max_backoff"},
		{"idle conns", func(c *Config) { c.BackendMaxIdleConnsPerHost = 0 }, "backend_max_idle_conns_per_host"},
		{"udp sessions", func(c *Config) { c.UDPMaxSessions = 0 }, "udp_max_sessions"},
		{"log", func(c *Config) { c.Log.Level = "loud" }, "log:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.RouteEmitterAddress, c.RouteEmitterTLS.Insecure = "127.0.0.1:1", true
			if err := c.Validate(); err != nil {
				t.Fatalf("base config invalid: %v", err)
			}
			tt.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestNewRejectsMissingCertificate(t *testing.T) {
	cfg := testConfig("127.0.0.1:1")
	cfg.HTTPSAddress = "127.0.0.1:0"
	cfg.HTTPSCertFile, cfg.HTTPSKeyFile = filepath.Join(t.TempDir(), "no.crt"), filepath.Join(t.TempDir(), "no.key")
	if _, err := New(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "client is required") {
		t.Fatalf("New without client: %v", err)
	}
	if _, err := New(cfg, nil, routeemitterv1.NewRouteEmitterServiceClient(nil)); err == nil || !strings.Contains(err.Error(), "https certificate") {
		t.Fatalf("New with a missing certificate: %v", err)
	}
}
