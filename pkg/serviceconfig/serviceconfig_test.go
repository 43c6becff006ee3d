package serviceconfig

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/pkg/config"
)

// svcConfig embeds every part, as a service's Config does.
type svcConfig struct {
	Base
	Etcd
	Election
	Own string `json:"own"`
}

func defaults() svcConfig {
	return svcConfig{Base: DefaultBase("127.0.0.1:1"), Etcd: DefaultEtcd(), Election: DefaultElection()}
}

func TestPartsSitAtTheTopLevelOfTheFile(t *testing.T) {
	body := `{"listen_address": ":9", "tls": {"insecure": true}, "log": {"level": "debug"},
	  "metrics_address": ":10", "etcd_endpoints": ["https://e:2379"], "etcd_tls": {"insecure": true},
	  "lock_ttl": "3s", "own": "x"}`
	c := defaults()
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatal(err)
	}
	if c.ListenAddress != ":9" || !c.TLS.Insecure || c.Log.Level != "debug" || c.Log.Format != "text" ||
		c.MetricsAddress != ":10" || !reflect.DeepEqual(c.EtcdEndpoints, []string{"https://e:2379"}) ||
		!c.EtcdTLS.Insecure || time.Duration(c.LockTTL) != 3*time.Second || c.Own != "x" {
		t.Fatalf("loaded %+v", c)
	}
	if err := errorsOf(c); err != "" {
		t.Fatalf("valid configuration refused: %s", err)
	}
}

func TestFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(`{"listen_address": ":9", "lock_ttl": "3s"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := defaults()
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	fs.String("config", "", "")
	BaseFlags(fs, &c.Base, "")
	EtcdFlags(fs, &c.Etcd)
	ElectionFlags(fs, &c.Election)
	args := []string{"-config", path, "-insecure", "-metrics-address", ":10", "-log-level", "debug",
		"-etcd-endpoints", "a,b", "-etcd-insecure", "-lock-ttl", "5s"}
	if err := config.Parse(fs, args, "config", func(p string) error { return config.LoadJSON(p, &c) }); err != nil {
		t.Fatal(err)
	}
	if c.ListenAddress != ":9" || !c.TLS.Insecure || c.MetricsAddress != ":10" || c.Log.Level != "debug" ||
		!reflect.DeepEqual(c.EtcdEndpoints, []string{"a", "b"}) || !c.EtcdTLS.Insecure || time.Duration(c.LockTTL) != 5*time.Second {
		t.Fatalf("parsed %+v", c)
	}
	for _, name := range []string{"tls-cert", "tls-key", "tls-ca", "listen", "log-format", "etcd-cert", "etcd-key", "etcd-ca"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s not registered", name)
		}
	}
}

func TestValidate(t *testing.T) {
	valid := func() svcConfig {
		c := defaults()
		c.TLS.Insecure, c.EtcdTLS.Insecure = true, true
		return c
	}
	tests := []struct {
		name string
		mod  func(*svcConfig)
		want string
	}{
		{"valid", func(*svcConfig) {}, ""},
		{"no listen", func(c *svcConfig) { c.ListenAddress = "" }, "listen_address is required"},
		{"no tls choice", func(c *svcConfig) { c.TLS.Insecure = false }, "tls: "},
		{"metrics over tls without tls", func(c *svcConfig) { c.MetricsTLS = true }, "metrics_tls: needs tls"},
		{"bad log", func(c *svcConfig) { c.Log.Level = "loud" }, "log: "},
		{"no etcd", func(c *svcConfig) { c.EtcdEndpoints = nil }, "etcd_endpoints: at least one endpoint is required"},
		{"no etcd tls choice", func(c *svcConfig) { c.EtcdTLS.Insecure = false }, "etcd_tls: "},
		{"short lease", func(c *svcConfig) { c.LockTTL = config.Duration(time.Millisecond) }, "lock_ttl must be at least 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mod(&c)
			got := errorsOf(c)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("errors %q, want %q", got, tt.want)
			}
		})
	}
}

func errorsOf(c svcConfig) string {
	var out []string
	for _, err := range []error{c.Base.Validate(), c.Etcd.Validate(), c.Election.Validate()} {
		if err != nil {
			out = append(out, err.Error())
		}
	}
	return strings.Join(out, "; ")
}

func TestContenderID(t *testing.T) {
	a, b := ContenderID("10.0.0.1:8889"), ContenderID("10.0.0.1:8889")
	if a == b {
		t.Fatal("two contenders got the same id")
	}
	if parts := strings.Split(a, "/"); len(parts) != 3 || parts[0] == "" || parts[1] != "10.0.0.1:8889" || len(parts[2]) != 36 {
		t.Fatalf("id %q is not HOST/ADDRESS/UUID", a)
	}
}
