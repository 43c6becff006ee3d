package cni

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fakeBin returns a directory holding empty executables with the given names: enough for
// Validate, which only looks plugins up.
func fakeBin(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestValidate(t *testing.T) {
	all := fakeBin(t, "bridge", "host-local", "portmap", "loopback")
	noPortmap := fakeBin(t, "bridge", "host-local", "loopback")
	operator := t.TempDir()
	if err := os.WriteFile(filepath.Join(operator, "10-net.conflist"),
		[]byte(`{"cniVersion":"1.0.0","name":"gavel","plugins":[{"type":"bridge"},{"type":"acme-networker"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, "10-net.conflist"), []byte(`{"name":"gavel","plugins":[`), 0o644); err != nil {
		t.Fatal(err)
	}
	base := func(mod func(*Config)) Config {
		c := Default()
		c.ConfDir = filepath.Join(t.TempDir(), "absent")
		c.BinDirs = []string{all}
		mod(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none means valid
	}{
		{name: "default chain, all plugins", cfg: base(func(*Config) {})},
		{name: "plugin found in a later dir", cfg: base(func(c *Config) { c.BinDirs = []string{noPortmap, all} })},
		{name: "missing plugin named", cfg: base(func(c *Config) { c.BinDirs = []string{noPortmap} }),
			want: []string{`plugin "portmap"`, "the generated default", noPortmap, "containernetworking-plugins"}},
		{name: "operator's plugin named", cfg: base(func(c *Config) { c.ConfDir = operator }),
			want: []string{`plugin "acme-networker"`, operator}},
		{name: "operator's config must parse", cfg: base(func(c *Config) { c.ConfDir = broken }),
			want: []string{`load network "gavel"`, broken}},
		{name: "bad subnet", cfg: base(func(c *Config) { c.Subnet = "10.255.0.0" }), want: []string{`subnet "10.255.0.0"`}},
		{name: "IPv6 subnet", cfg: base(func(c *Config) { c.Subnet = "fd00::/64" }), want: []string{"not an IPv4 CIDR"}},
		{name: "tiny subnet", cfg: base(func(c *Config) { c.Subnet = "10.255.0.0/31" }), want: []string{"room for no container"}},
		{name: "long bridge", cfg: base(func(c *Config) { c.Bridge = "gavel0123456789ab" }), want: []string{"bridge name"}},
		{name: "empty fields", cfg: base(func(c *Config) { c.NetworkName, c.BinDirs, c.IfName, c.CacheDir = "", nil, "", "" }),
			want: []string{"network name is empty", "no plugin directories", "interface name is empty", "cache directory is empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate passed, want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestDefaultConfList(t *testing.T) {
	c := Default()
	c.IPAMDataDir = "/var/lib/gavel/ipam"
	b, err := DefaultConfList(c)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal([]byte(`{
		"cniVersion": "1.0.0",
		"name": "gavel",
		"plugins": [
			{"type": "bridge", "bridge": "gavel0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
			 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.255.0.0/16"}]],
			          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "/var/lib/gavel/ipam"}},
			{"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
		]}`), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("generated chain\n got %s\nwant %v", b, want)
	}
}

func TestCheckRequest(t *testing.T) {
	ok := AttachRequest{ContainerID: "c", NetnsPath: "/run/netns/x", Ports: []uint32{8080}}
	for _, tc := range []struct {
		name string
		mod  func(*AttachRequest)
		want string
	}{
		{name: "valid", mod: func(*AttachRequest) {}},
		{name: "no ports", mod: func(r *AttachRequest) { r.Ports = nil }},
		{name: "given host ports", mod: func(r *AttachRequest) { r.HostPorts = []uint32{61000} }},
		{name: "no container ID", mod: func(r *AttachRequest) { r.ContainerID = "" }, want: "empty container ID"},
		{name: "no netns", mod: func(r *AttachRequest) { r.NetnsPath = "" }, want: "empty network namespace"},
		{name: "host ports short", mod: func(r *AttachRequest) { r.HostPorts = []uint32{} }, want: "0 host ports for 1"},
		{name: "port zero", mod: func(r *AttachRequest) { r.Ports = []uint32{0} }, want: "container port 0 out of range"},
		{name: "port too big", mod: func(r *AttachRequest) { r.Ports = []uint32{70000} }, want: "container port 70000"},
		{name: "port twice", mod: func(r *AttachRequest) { r.Ports = []uint32{80, 80} }, want: "given twice"},
		{name: "host port too big", mod: func(r *AttachRequest) { r.HostPorts = []uint32{65536} }, want: "host port 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.mod(&r)
			err := checkRequest(r)
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("checkRequest: %v, want %q", err, tc.want)
			}
		})
	}
}
