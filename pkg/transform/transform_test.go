package transform_test

import (
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gavel-sched/gavel/pkg/config"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// serve serves p on a fresh UNIX socket until the test ends; onConn, when set, sees every new
// connection.
func serve(t testing.TB, p *plugin.Plugin, onConn func()) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gvtf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, p.Name+".sock")
	l, err := plugin.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p.Handler(), ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew && onConn != nil {
			onConn()
		}
	}}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return path
}

func addProperty(name, key, value string) *plugin.Plugin {
	return &plugin.Plugin{Name: name, Version: "1", DesiredLRP: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
		if d.Properties == nil {
			d.Properties = map[string]string{}
		}
		d.Properties[key] = value
		return d, nil
	}}
}

func lrp() *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: "web", Domain: "apps", Rootfs: "preloaded:cflinuxfs4", Instances: 1,
		MemoryMb: 64, DiskMb: 64, Ports: []uint32{8080},
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
	}
}

func TestPluginConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		c    transform.PluginConfig
		want string // "" is valid
	}{
		{"minimal", transform.PluginConfig{Name: "net", Socket: "/s"}, ""},
		{"dotted", transform.PluginConfig{Name: "net.example.com", Socket: "/s", Kinds: []string{"task"}, FailurePolicy: "ignore"}, ""},
		{"upper case", transform.PluginConfig{Name: "Net", Socket: "/s"}, `transformer "Net": name "Net" must be a lower-case DNS subdomain (e.g. "networking" or "net.example.com")`},
		{"underscore", transform.PluginConfig{Name: "my_net", Socket: "/s"}, `transformer "my_net": name "my_net" must be a lower-case DNS subdomain (e.g. "networking" or "net.example.com")`},
		{"no socket", transform.PluginConfig{Name: "net"}, `transformer "net": socket is required`},
		{"kind", transform.PluginConfig{Name: "net", Socket: "/s", Kinds: []string{"pod"}}, `transformer "net": kinds: unknown kind "pod" (want "desired_lrp" or "task")`},
		{"policy", transform.PluginConfig{Name: "net", Socket: "/s", FailurePolicy: "retry"}, `transformer "net": failure_policy "retry" must be "fail" or "ignore"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate()
			if got := errString(err); got != tt.want {
				t.Errorf("Validate: %q, want %q", got, tt.want)
			}
		})
	}
	err := transform.ValidateChain([]transform.PluginConfig{{Name: "a", Socket: "/a"}, {Name: "a", Socket: "/b"}})
	if got, want := errString(err), `transformers[1]: name "a" is used twice`; got != want {
		t.Errorf("ValidateChain: %q, want %q", got, want)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestFlagRoundTrip(t *testing.T) {
	var got []transform.PluginConfig
	f := transform.Flag{Plugins: &got}
	for _, s := range []string{"net=/run/net.sock", "filter=/run/f.sock,kinds=desired_lrp+task,timeout=500ms,failure_policy=ignore,check_determinism=true,max_concurrency=4"} {
		if err := f.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	want := []transform.PluginConfig{
		{Name: "net", Socket: "/run/net.sock"},
		{Name: "filter", Socket: "/run/f.sock", Kinds: []string{"desired_lrp", "task"}, Timeout: transform.PluginConfig{}.WithDefaults().Timeout / 4,
			FailurePolicy: "ignore", CheckDeterminism: true, MaxConcurrency: 4},
	}
	if f.String() != "net=/run/net.sock filter=/run/f.sock,kinds=desired_lrp+task,timeout=500ms,failure_policy=ignore,check_determinism=true,max_concurrency=4" {
		t.Errorf("String: %s", f.String())
	}
	var again []transform.PluginConfig
	if err := (transform.Flag{Plugins: &again}).Set(f.String()); err != nil {
		t.Fatal(err)
	}
	for _, list := range [][]transform.PluginConfig{got, again} {
		if len(list) != 2 || list[0].Name != want[0].Name || list[1].Timeout != want[1].Timeout || !list[1].CheckDeterminism || list[1].MaxConcurrency != 4 || strings.Join(list[1].Kinds, ",") != "desired_lrp,task" {
			t.Errorf("parsed %+v, want %+v", list, want)
		}
	}
	for _, bad := range []string{"net", "net=/s,colour=red", "Net=/s", "net=/s,timeout=soon"} {
		if err := f.Set(bad); err == nil {
			t.Errorf("Set(%q) succeeded", bad)
		}
	}
}

// TestFlagsOverFile: flags add plugins to the config file's list and replace those of the same
// name, however config.Parse re-applies them after loading the file.
func TestFlagsOverFile(t *testing.T) {
	dir := t.TempDir()
	withList := filepath.Join(dir, "with.json")
	without := filepath.Join(dir, "without.json")
	if err := os.WriteFile(withList, []byte(`{"transformers":[{"name":"a","socket":"/a"},{"name":"b","socket":"/b"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(without, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"flags only", []string{"-transformer", "b=/b2", "-transformer", "c=/c"}, "b=/b2 c=/c"},
		{"file only", []string{"-config", withList}, "a=/a b=/b"},
		{"flags over file", []string{"-transformer", "b=/b2,failure_policy=ignore", "-config", withList, "-transformer", "c=/c"}, "a=/a b=/b2,failure_policy=ignore c=/c"},
		{"file without the key", []string{"-config", without, "-transformer", "c=/c"}, "c=/c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg struct {
				Transformers []transform.PluginConfig `json:"transformers"`
			}
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.String("config", "", "")
			fs.Var(transform.Flag{Plugins: &cfg.Transformers}, "transformer", "")
			if err := config.Parse(fs, tt.args, "config", func(p string) error { return config.LoadJSON(p, &cfg) }); err != nil {
				t.Fatal(err)
			}
			if got := (transform.Flag{Plugins: &cfg.Transformers}).String(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEmptyChainPassesThrough(t *testing.T) {
	c, err := transform.Load(ctxT(t), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := lrp()
	for _, chain := range []*transform.Chain{c, nil} {
		out, err := chain.DesiredLRP(ctxT(t), in)
		if err != nil || out != in {
			t.Errorf("DesiredLRP through an empty chain: %p %v, want the same object", out, err)
		}
		task := &modelsv1.Task{TaskGuid: "t"}
		if got, err := chain.Task(ctxT(t), task); err != nil || got != task {
			t.Errorf("Task through an empty chain: %v %v", got, err)
		}
		if err := chain.Close(); err != nil {
			t.Error(err)
		}
	}
}

// TestConnectionsAreReused: sequential calls share one connection to the plugin.
func TestConnectionsAreReused(t *testing.T) {
	var conns atomic.Int64
	socket := serve(t, addProperty("net", "k", "v"), func() { conns.Add(1) })
	c, err := transform.Load(ctxT(t), []transform.PluginConfig{{Name: "net", Socket: socket, CheckDeterminism: true}}, logtest.New(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 50 {
		out, err := c.DesiredLRP(ctxT(t), lrp())
		if err != nil || out.GetProperties()["k"] != "v" {
			t.Fatalf("DesiredLRP: %v %v", out, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for describe and 100 sequential calls, want 1", n)
	}
}

// TestMetrics: calls, errors by class and latency, per plugin and kind.
func TestMetrics(t *testing.T) {
	var fail atomic.Bool
	p := &plugin.Plugin{Name: "net", DesiredLRP: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
		if fail.Load() {
			return nil, &plugin.Error{Message: "no", External: true}
		}
		return d, nil
	}}
	reg := prometheus.NewRegistry()
	c, err := transform.Load(ctxT(t), []transform.PluginConfig{{Name: "net", Socket: serve(t, p, nil)}}, logtest.New(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DesiredLRP(ctxT(t), lrp()); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	_, err = c.DesiredLRP(ctxT(t), lrp())
	var te *transform.Error
	if !errors.As(err, &te) || te.Class != transform.ClassExternal || rpcerr.Code(err).String() != "InvalidArgument" {
		t.Fatalf("external error: %v (%T), want a ClassExternal *transform.Error mapping to InvalidArgument", err, err)
	}
	if got := metric(t, reg, "gavel_transform_calls_total", map[string]string{"plugin": "net", "kind": "desired_lrp"}); got != 2 {
		t.Errorf("calls_total %v, want 2", got)
	}
	if got := metric(t, reg, "gavel_transform_errors_total", map[string]string{"plugin": "net", "kind": "desired_lrp", "class": "external"}); got != 1 {
		t.Errorf("errors_total{class=external} %v, want 1", got)
	}
	if got := metric(t, reg, "gavel_transform_call_duration_seconds", map[string]string{"plugin": "net", "kind": "desired_lrp"}); got != 2 {
		t.Errorf("call_duration_seconds count %v, want 2", got)
	}
	// A second chain on the same registry shares the series instead of failing.
	c2, err := transform.Load(ctxT(t), []transform.PluginConfig{{Name: "net", Socket: serve(t, p, nil)}}, logtest.New(t), reg)
	if err != nil {
		t.Fatalf("second chain on one registry: %v", err)
	}
	c2.Close()
}

// metric is the value of a counter, or the sample count of a histogram, with exactly the
// given labels.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

// TestPluginAnswers: the plugin package's describe and error answers.
func TestPluginAnswers(t *testing.T) {
	p := &plugin.Plugin{Name: "net", Version: "2.1", Task: func(_ context.Context, task *modelsv1.Task) (*modelsv1.Task, error) {
		switch task.GetTaskGuid() {
		case "external":
			return nil, &plugin.Error{Message: "bad label", External: true}
		case "retriable":
			return nil, &plugin.Error{Message: "try later", Retriable: true}
		case "plain":
			return nil, errors.New("broken")
		}
		return task, nil
	}}
	socket := serve(t, p, nil)
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	defer client.CloseIdleConnections()
	tests := []struct {
		method, path, body string
		status             int
		answer             string
	}{
		{"GET", "/describe", "", 200, `{"name":"net","kinds":["task"],"version":"2.1"}`},
		{"POST", "/transform/task", `{"taskGuid":"ok"}`, 200, `{"taskGuid":"ok"}`},
		{"POST", "/transform/task", `{"taskGuid":"external"}`, 422, `{"error":"bad label","external":true,"retriable":false}`},
		{"POST", "/transform/task", `{"taskGuid":"retriable"}`, 503, `{"error":"try later","external":false,"retriable":true}`},
		{"POST", "/transform/task", `{"taskGuid":"plain"}`, 500, `{"error":"broken","external":false,"retriable":false}`},
		{"POST", "/transform/task", `{"taskGuid":`, 500, `{"error":"parse request: `},
		{"POST", "/transform/desired_lrp", `{}`, 404, ``},
	}
	for _, tt := range tests {
		req, _ := http.NewRequestWithContext(ctxT(t), tt.method, "http://net"+tt.path, strings.NewReader(tt.body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		_, _ = io.Copy(&sb, resp.Body)
		resp.Body.Close()
		got := strings.ReplaceAll(sb.String(), " ", "")
		if resp.StatusCode != tt.status || !strings.HasPrefix(got, strings.ReplaceAll(tt.answer, " ", "")) {
			t.Errorf("%s %s %s: %d %s, want %d %s", tt.method, tt.path, tt.body, resp.StatusCode, sb.String(), tt.status, tt.answer)
		}
	}
}
