package rep_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/services/rep"
)

func validConfig() rep.Config {
	c := rep.Default()
	c.CellID = "cell-1"
	c.TLS.Insecure = true
	c.BBSTLS.Insecure = true
	c.EtcdTLS.Insecure = true
	return c
}

func TestConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rep.json")
	body := `{"cell_id": "cell-z1-0", "zone": "z1", "tags": ["Staging", "skynet"],
	  "preloaded_rootfses": {"cflinuxfs4": "/var/gavel/cflinuxfs4"}, "supported_rootfs_providers": ["docker"],
	  "capacity": {"memory_mb": 2048, "disk_mb": 8192, "containers": 20}, "backend": "sim",
	  "lease_ttl": "3s", "bulk_interval": "5s", "sim": {"start_latency": "2s", "crash_rate": 0.01, "log_interval": "1s"},
	  "logs": {"max_file_bytes": 65536, "retention": "10m"}, "metrics": {"sample_interval": "2s"},
	  "hooks": {"timeout": "5s"}, "port_range": "62000-62099",
	  "oci": {"containerd_socket": "/run/k3s/containerd.sock", "namespace": "cells"}}`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c := validConfig()
	if err := c.LoadFile(path); err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if c.CellID != "cell-z1-0" || c.Capacity.Containers != 20 || time.Duration(c.LeaseTTL) != 3*time.Second ||
		time.Duration(c.Sim.StartLatency) != 2*time.Second || c.Sim.CrashRate != 0.01 || c.PreloadedRootfses["cflinuxfs4"] == "" ||
		c.Logs.MaxFileBytes != 65536 || time.Duration(c.Logs.Retention) != 10*time.Minute || time.Duration(c.Metrics.SampleInterval) != 2*time.Second {
		t.Fatalf("loaded %+v", c)
	}
	o := rep.BackendOptions(c)
	if o.PortRangeStart != 62000 || o.PortRangeEnd != 62099 || o.SimStartLatency != 2*time.Second || o.SimLogInterval != time.Second || o.CellAddress != "127.0.0.1" ||
		o.OCI.ContainerdSocket != "/run/k3s/containerd.sock" || o.OCI.Namespace != "cells" || o.OCI.Runtime != "io.containerd.runc.v2" {
		t.Fatalf("backend options %+v", o)
	}
	if err := c.LoadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Fatal("LoadFile of a missing file succeeded")
	}
}

func TestConfigValidate(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "hook")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		mod  func(*rep.Config)
		want string // substring of the error; "" means valid
	}{
		{"default", func(*rep.Config) {}, ""},
		{"upper-case tags are fine", func(c *rep.Config) { c.Tags = []string{"Staging"} }, ""},
		{"no cell id", func(c *rep.Config) { c.CellID = "" }, "cell_id"},
		{"long tag", func(c *rep.Config) { c.Tags = []string{strings.Repeat("x", 64)} }, "placement_tags[0]"},
		{"tag with comma", func(c *rep.Config) { c.Tags = []string{"a,b"} }, "placement_tags[0]"},
		{"preloaded without path", func(c *rep.Config) { c.PreloadedRootfses = map[string]string{"x": ""} }, "preloaded_rootfses"},
		{"bad provider", func(c *rep.Config) { c.SupportedRootfsProviders = []string{"1docker"} }, "rootfs_providers[0]"},
		{"zero capacity", func(c *rep.Config) { c.Capacity.Containers = 0 }, "capacity"},
		{"unknown backend", func(c *rep.Config) { c.Backend = "garden" }, "backend"},
		{"bad advertise address", func(c *rep.Config) { c.AdvertiseAddress = "nohost" }, "advertise_address"},
		{"no bbs", func(c *rep.Config) { c.BBSAddress = "" }, "bbs_address"},
		{"tls files missing", func(c *rep.Config) { c.TLS.Insecure = false }, "tls"},
		{"short lease", func(c *rep.Config) { c.LeaseTTL = rep.Duration(time.Millisecond) }, "lease_ttl"},
		{"bad port range", func(c *rep.Config) { c.PortRange = "62000-61000" }, "port_range"},
		{"missing hook", func(c *rep.Config) { c.Hooks.OnCreate = []string{"/does/not/exist"} }, "hooks.on_create[0]"},
		{"hook not executable", func(c *rep.Config) { c.Hooks.OnDestroy = []string{notExec} }, "hooks.on_destroy[0]"},
		{"crash rate", func(c *rep.Config) { c.Sim.CrashRate = 2 }, "sim.crash_rate"},
		{"sim log interval", func(c *rep.Config) { c.Sim.LogInterval = -1 }, "sim.log_interval"},
		{"sim host", func(c *rep.Config) { c.Backend, c.Sim.Cells, c.ListenAddress = rep.BackendSim, 100, "127.0.0.1:0" }, ""},
		{"sim host of process cells", func(c *rep.Config) { c.Sim.Cells, c.ListenAddress = 100, "127.0.0.1:0" }, "sim.cells 100 needs backend"},
		{"sim host on one port", func(c *rep.Config) { c.Backend, c.Sim.Cells, c.ListenAddress = rep.BackendSim, 2, "127.0.0.1:1800" }, "listen_address host:0"},
		{"sim host with metrics", func(c *rep.Config) {
			c.Backend, c.Sim.Cells, c.ListenAddress, c.MetricsAddress = rep.BackendSim, 2, "127.0.0.1:0", "127.0.0.1:0"
		}, "metrics_address must be empty"},
		{"negative sim cells", func(c *rep.Config) { c.Sim.Cells = -1 }, "sim.cells"},
		{"log file bound", func(c *rep.Config) { c.Logs.MaxFileBytes = 100 }, "logs.max_file_bytes"},
		{"log retention", func(c *rep.Config) { c.Logs.Retention = 0 }, "logs.retention"},
		{"metrics sample interval", func(c *rep.Config) { c.Metrics.SampleInterval = rep.Duration(time.Millisecond) }, "metrics.sample_interval"},
		{"bulk interval", func(c *rep.Config) { c.BulkInterval = 0 }, "bulk_interval"},
		{"log level", func(c *rep.Config) { c.Log.Level = "loud" }, "log"},
		{"image gc", func(c *rep.Config) { c.OCI.ImageGCUnusedFor = -1 }, "oci.image_gc_unused_for"},
		{"image gc off", func(c *rep.Config) { c.OCI.ImageGCUnusedFor = 0 }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mod(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestConfigValidateOCI: a rep with -backend oci refuses to start when containerd's socket or
// runc is missing, naming what is missing.
func TestConfigValidateOCI(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "containerd.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	notSocket := filepath.Join(dir, "file")
	if err := os.WriteFile(notSocket, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fakeRunc := filepath.Join(dir, "bin", "runc")
	if err := os.MkdirAll(filepath.Dir(fakeRunc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fakeRunc, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		path string // PATH, where runc is looked up
		mod  func(*rep.Config)
		want string // substring of the error; "" means valid
	}{
		{"socket and runc", filepath.Dir(fakeRunc), func(*rep.Config) {}, ""},
		{"no containerd", filepath.Dir(fakeRunc), func(c *rep.Config) { c.OCI.ContainerdSocket = filepath.Join(dir, "none.sock") }, "containerd socket"},
		{"not a socket", filepath.Dir(fakeRunc), func(c *rep.Config) { c.OCI.ContainerdSocket = notSocket }, "is not a socket"},
		{"no runc", t.TempDir(), func(*rep.Config) {}, "runc"},
		{"no namespace", filepath.Dir(fakeRunc), func(c *rep.Config) { c.OCI.Namespace = "" }, "oci.namespace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", tc.path)
			c := validConfig()
			c.Backend = rep.BackendOCI
			c.OCI.ContainerdSocket = socket
			tc.mod(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestLeaseTTLFor(t *testing.T) {
	for _, tc := range []struct {
		cells int
		want  time.Duration
	}{
		{0, rep.DefaultLeaseTTL},
		{1000, rep.DefaultLeaseTTL},
		{1666, rep.DefaultLeaseTTL},
		{1667, 11 * time.Second},
		{5000, 30 * time.Second},
		{100000, 600 * time.Second},
	} {
		got := rep.LeaseTTLFor(tc.cells)
		if got != tc.want {
			t.Errorf("LeaseTTLFor(%d) = %s, want %s", tc.cells, got, tc.want)
		}
		if rate := rep.RenewalsPerSecond(tc.cells, got); rate > rep.MaxRenewalsPerSecond {
			t.Errorf("LeaseTTLFor(%d) = %s: %.0f renewals/s, over %d", tc.cells, got, rate, rep.MaxRenewalsPerSecond)
		}
	}
}
