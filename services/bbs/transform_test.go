package bbs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// socketPath is a fresh socket path short enough for a UNIX socket (108 bytes).
func socketPath(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gvtf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, name+".sock")
}

// servePlugin serves p on a fresh UNIX socket until the test ends and returns the socket.
func servePlugin(t testing.TB, p *plugin.Plugin) string {
	t.Helper()
	return serveHandler(t, p.Name, p.Handler())
}

// serveHandler serves any handler (a misbehaving plugin) on a fresh UNIX socket.
func serveHandler(t testing.TB, name string, h http.Handler) string {
	t.Helper()
	path := socketPath(t, name)
	l, err := plugin.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return path
}

func lrpPlugin(name string, fn func(ctx context.Context, lrp *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error)) *plugin.Plugin {
	return &plugin.Plugin{Name: name, Version: "test", DesiredLRP: fn}
}

// propertyPlugin adds the property name=yes to desired LRPs.
func propertyPlugin(name string) *plugin.Plugin {
	return lrpPlugin(name, func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
		if d.Properties == nil {
			d.Properties = map[string]string{}
		}
		d.Properties[name] = "yes"
		return d, nil
	})
}

func withTransformers(plugins ...transform.PluginConfig) func(*bbs.Config) {
	return func(c *bbs.Config) { c.Transformers = plugins }
}

func storedLRP(t *testing.T, env *bbstest.Env, guid string) *modelsv1.DesiredLRP {
	t.Helper()
	resp, err := env.Client.DesiredLRPByProcessGuid(ctxT(t), &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: guid})
	if err != nil {
		t.Fatalf("DesiredLRPByProcessGuid %s: %v", guid, err)
	}
	return resp.GetDesiredLrp()
}

// withoutTag drops the modification tag the BBS sets, to compare a stored LRP with the desired.
func withoutTag(d *modelsv1.DesiredLRP) *modelsv1.DesiredLRP {
	d = proto.Clone(d).(*modelsv1.DesiredLRP)
	d.ModificationTag = nil
	return d
}

// wantRefused checks the exact gRPC code and message of a refused request and that nothing
// was stored (the etcd revision did not move).
func wantRefused(t *testing.T, env *bbstest.Env, before int64, err error, code codes.Code, msg string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || st.Message() != msg {
		t.Errorf("got %v %q\nwant %v %q", st.Code(), st.Message(), code, msg)
	}
	if after := storeRevision(t, env); after != before {
		t.Errorf("etcd revision moved from %d to %d: a refused request stored something", before, after)
	}
}

// TestTransformerContract runs each misbehaviour of the plugin contract through DesireLRP
// over a real BBS, etcd and plugin socket: the exact error and nothing stored.
func TestTransformerContract(t *testing.T) {
	const guid = "web"
	taskAnswer := []byte(`{"taskGuid":"web","domain":"apps","definition":{"rootfs":"preloaded:cflinuxfs4"}}`)
	var nonce atomic.Int64
	tests := []struct {
		name    string
		fn      func(ctx context.Context, lrp *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error)
		raw     http.HandlerFunc // a handler for /transform/desired_lrp instead of fn
		timeout time.Duration
		check   bool
		code    codes.Code
		msg     string
		field   string // the BadRequest field of an InvalidArgument
	}{
		{
			name: "changes the guid",
			fn: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				d.ProcessGuid = "web-2"
				return d, nil
			},
			code: codes.FailedPrecondition,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): invalid answer: desired_lrp.process_guid: changed from "web" to "web-2"; a transformer may not change it`,
		},
		{
			name: "changes the domain",
			fn: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				d.Domain = "other"
				return d, nil
			},
			code: codes.FailedPrecondition,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): invalid answer: desired_lrp.domain: changed from "apps" to "other"; a transformer may not change it`,
		},
		{
			name: "changes the rootfs",
			fn: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				d.Rootfs = "preloaded:lucid64"
				return d, nil
			},
			code: codes.FailedPrecondition,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): invalid answer: desired_lrp.rootfs: is immutable: changed from "preloaded:cflinuxfs4" to "preloaded:lucid64"`,
		},
		{
			name: "changes the ports",
			fn: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				d.Ports = append(d.Ports, 9090)
				return d, nil
			},
			code: codes.FailedPrecondition,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): invalid answer: desired_lrp.ports: is immutable: changed from [8080] to [8080 9090]`,
		},
		{
			name: "changes the placement constraint",
			fn: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				d.PlacementConstraint = &modelsv1.PlacementConstraint{Require: []string{"gpu"}}
				return d, nil
			},
			code: codes.FailedPrecondition,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): invalid answer: desired_lrp.placement_constraint: is immutable: changed from {require: [], disallow: []} to {require: ["gpu"], disallow: []}`,
		},
		{
			name: "returns another kind",
			raw: func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write(taskAnswer)
			},
			code: codes.Internal,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): answered a task where a desired_lrp was expected`,
		},
		{
			name: "returns invalid JSON",
			raw: func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(`{"processGuid": "web",`))
			},
			code: codes.Internal,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): answer is not a desired_lrp in protojson: `,
		},
		{
			name: "returns a model that fails validation",
			fn: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				d.Properties[""] = "x"
				d.MemoryMb = -1
				return d, nil
			},
			code: codes.FailedPrecondition,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): invalid answer: desired_lrp.memory_mb: must not be negative, got -1; desired_lrp.properties[""]: key must not be empty`,
		},
		{
			name: "hangs past its timeout",
			fn: func(ctx context.Context, _ *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			},
			timeout: 200 * time.Millisecond,
			code:    codes.Unavailable,
			msg:     `desire lrp web: transformer "evil" (desired_lrp): no answer within the timeout of 200ms`,
		},
		{
			name: "answers an external error",
			fn: func(context.Context, *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				return nil, &plugin.Error{Message: `label "app_guid" is required`, External: true}
			},
			code:  codes.InvalidArgument,
			msg:   `desire lrp web: transformer "evil" (desired_lrp): label "app_guid" is required`,
			field: "desired_lrp",
		},
		{
			name: "answers a retriable error",
			fn: func(context.Context, *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				return nil, &plugin.Error{Message: "network database unreachable", Retriable: true}
			},
			code: codes.Unavailable,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): network database unreachable (retriable)`,
		},
		{
			name: "answers a plain error",
			fn: func(context.Context, *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				return nil, errors.New("out of network ids")
			},
			code: codes.FailedPrecondition,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): out of network ids`,
		},
		{
			name: "answers an error without the error answer",
			raw: func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "boom", http.StatusBadGateway)
			},
			code: codes.Internal,
			msg:  `desire lrp web: transformer "evil" (desired_lrp): answered HTTP 502 without an error answer {"error","external","retriable"}: "boom"`,
		},
		{
			name: "is not deterministic",
			fn: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
				d.Properties["nonce"] = fmt.Sprint(nonce.Add(1))
				return d, nil
			},
			check: true,
			code:  codes.FailedPrecondition,
			msg:   `desire lrp web: transformer "evil" (desired_lrp): not deterministic: two calls with the same desired_lrp answered different desired_lrp.properties`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := lrpPlugin("evil", tt.fn)
			var socket string
			if tt.raw != nil {
				mux := http.NewServeMux()
				mux.Handle("GET "+plugin.PathDescribe, p.Handler())
				mux.HandleFunc("POST "+plugin.PathDesiredLRP, tt.raw)
				p.DesiredLRP = func(context.Context, *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) { return nil, nil }
				socket = serveHandler(t, "evil", mux)
			} else {
				socket = servePlugin(t, p)
			}
			env := bbstest.Start(t, withTransformers(transform.PluginConfig{
				Name: "evil", Socket: socket, Kinds: []string{plugin.KindDesiredLRP},
				Timeout: bbs.Duration(tt.timeout), CheckDeterminism: tt.check,
			}))
			before := storeRevision(t, env)
			_, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp(guid, 2)})
			msg := tt.msg
			if strings.HasSuffix(msg, "protojson: ") { // the parser's own words follow
				if m := status.Convert(err).Message(); strings.HasPrefix(m, msg) && strings.HasSuffix(m, `"{\"processGuid\": \"web\","`) {
					msg = m
				}
			}
			wantRefused(t, env, before, err, tt.code, msg)
			if tt.field != "" {
				wantBadRequestField(t, err, tt.field)
			}
			if _, err := env.Client.DesiredLRPByProcessGuid(ctxT(t), &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: guid}); status.Code(err) != codes.NotFound {
				t.Errorf("DesiredLRPByProcessGuid after a refused desire: %v, want NotFound", err)
			}
		})
	}
}

func wantBadRequestField(t *testing.T, err error, field string) {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if v.GetField() == field {
					return
				}
			}
		}
	}
	t.Errorf("error %v has no BadRequest violation of %q", err, field)
}

// TestTransformerHangsUnderIgnore: a plugin that hangs past its timeout under failure policy
// ignore lets the original object be stored.
func TestTransformerHangsUnderIgnore(t *testing.T) {
	socket := servePlugin(t, lrpPlugin("slow", func(ctx context.Context, _ *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}))
	env := bbstest.Start(t, withTransformers(transform.PluginConfig{
		Name: "slow", Socket: socket, Timeout: bbs.Duration(200 * time.Millisecond), FailurePolicy: transform.PolicyIgnore,
	}))
	want := lrp("web", 1)
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: want}); err != nil {
		t.Fatalf("DesireLRP under ignore: %v", err)
	}
	if got := withoutTag(storedLRP(t, env, "web")); !proto.Equal(got, want) {
		t.Errorf("stored %v\nwant the original %v", got, want)
	}
}

// TestTransformerStartup: a plugin that is absent, or whose describe answer does not match its
// configuration, stops the BBS at start-up with a message naming the plugin and the socket,
// unless its policy is ignore. Nothing is written to etcd either way.
func TestTransformerStartup(t *testing.T) {
	taskOnly := &plugin.Plugin{Name: "net", Task: func(_ context.Context, task *modelsv1.Task) (*modelsv1.Task, error) { return task, nil }}
	taskSocket := servePlugin(t, taskOnly)
	otherName := servePlugin(t, lrpPlugin("networking", func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) { return d, nil }))
	absent := socketPath(t, "absent")
	tests := []struct {
		name   string
		plugin transform.PluginConfig
		msg    string
	}{
		{"absent", transform.PluginConfig{Name: "net", Socket: absent},
			fmt.Sprintf(`transformers: transformer "net" (describe): describe at %s: dial unix %s: connect: no such file or directory`, absent, absent)},
		{"describe names the wrong kinds", transform.PluginConfig{Name: "net", Socket: taskSocket, Kinds: []string{plugin.KindDesiredLRP}},
			fmt.Sprintf(`transformers: transformer "net" (describe): describe at %s: the plugin lists kinds [task] but is configured for [desired_lrp]: it does not transform "desired_lrp"`, taskSocket)},
		{"describe names another plugin", transform.PluginConfig{Name: "net", Socket: otherName},
			fmt.Sprintf(`transformers: transformer "net" (describe): describe at %s: the plugin names itself "networking", configured as "net"`, otherName)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := bbstest.Start(t)
			before := storeRevision(t, env)
			cfg := env.Config
			cfg.Transformers = []transform.PluginConfig{tt.plugin}
			_, err := bbs.New(cfg, logtest.New(t), env.Etcd)
			if err == nil || err.Error() != tt.msg {
				t.Errorf("bbs.New: %v\nwant %s", err, tt.msg)
			}
			if after := storeRevision(t, env); after != before {
				t.Errorf("etcd revision moved from %d to %d", before, after)
			}

			// Under ignore the BBS starts and stores what it is given.
			ignored := tt.plugin
			ignored.FailurePolicy = transform.PolicyIgnore
			ienv := bbstest.StartOn(t, env.Etcd, withTransformers(ignored))
			want := lrp("web", 1)
			if _, err := ienv.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: want}); err != nil {
				t.Fatalf("DesireLRP under ignore: %v", err)
			}
			if got := withoutTag(storedLRP(t, ienv, "web")); !proto.Equal(got, want) {
				t.Errorf("stored %v\nwant the original %v", got, want)
			}
		})
	}

	t.Run("ignored absent plugin is described once it appears", func(t *testing.T) {
		late := socketPath(t, "late")
		env := bbstest.Start(t, withTransformers(transform.PluginConfig{Name: "late", Socket: late, FailurePolicy: transform.PolicyIgnore}))
		if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp("before", 1)}); err != nil {
			t.Fatal(err)
		}
		if got := storedLRP(t, env, "before").GetProperties()["late"]; got != "" {
			t.Errorf("property from an absent plugin: %q", got)
		}
		l, err := plugin.Listen(late)
		if err != nil {
			t.Fatal(err)
		}
		p := lrpPlugin("late", func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
			d.Properties["late"] = "yes"
			return d, nil
		})
		srv := &http.Server{Handler: p.Handler()}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp("after", 1)}); err != nil {
			t.Fatal(err)
		}
		if got := storedLRP(t, env, "after").GetProperties()["late"]; got != "yes" {
			t.Errorf("property from the plugin that appeared: %q, want yes", got)
		}
	})
}

// TestTransformerChainInOrder: three plugins run in configured order, each seeing the previous
// one's answer; the last answer is stored, on desire and on update (over the merged result).
func TestTransformerChainInOrder(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]string{} // plugin -> the "chain" property it received, per call
	var sockets []transform.PluginConfig
	for _, name := range []string{"first", "second", "third"} {
		p := lrpPlugin(name, func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
			mu.Lock()
			seen[name] = append(seen[name], d.GetProperties()["chain"])
			mu.Unlock()
			if d.Properties == nil {
				d.Properties = map[string]string{}
			}
			d.Properties["chain"] = strings.TrimPrefix(d.Properties["chain"]+","+name, ",")
			// Derived from a mutable field, to show the update path transforms the merged LRP.
			d.Properties["tier-"+name] = d.GetLabels()["tier"]
			return d, nil
		})
		sockets = append(sockets, transform.PluginConfig{Name: name, Socket: servePlugin(t, p)})
	}
	env := bbstest.Start(t, withTransformers(sockets...))
	in := lrp("web", 1)
	in.Properties = nil
	in.Labels["tier"] = "front"
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: in}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"chain": "first,second,third", "tier-first": "front", "tier-second": "front", "tier-third": "front"}
	got := storedLRP(t, env, "web")
	if fmt.Sprint(got.GetProperties()) != fmt.Sprint(want) {
		t.Errorf("stored properties %v, want %v", got.GetProperties(), want)
	}
	mu.Lock()
	if fmt.Sprint(seen) != fmt.Sprint(map[string][]string{"first": {""}, "second": {"first"}, "third": {"first,second"}}) {
		t.Errorf("each plugin received %v, want the previous one's answer", seen)
	}
	mu.Unlock()

	// The update's merged result runs through the chain: the new label shows in the plugins'
	// properties, and the chain starts over the stored properties.
	resp, err := env.Client.UpdateDesiredLRP(ctxT(t), &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web",
		Update: &modelsv1.DesiredLRPUpdate{Labels: &modelsv1.LabelsUpdate{Labels: map[string]string{"app": "web", "tier": "back"}}}})
	if err != nil {
		t.Fatal(err)
	}
	got = storedLRP(t, env, "web")
	want = map[string]string{"chain": "first,second,third,first,second,third", "tier-first": "back", "tier-second": "back", "tier-third": "back"}
	if fmt.Sprint(got.GetProperties()) != fmt.Sprint(want) || !proto.Equal(resp.GetDesiredLrp(), got) {
		t.Errorf("after update: stored properties %v (answered %v), want %v", got.GetProperties(), resp.GetDesiredLrp().GetProperties(), want)
	}
}

// TestTransformerUpdateRefused: a plugin that breaks the rules on UpdateDesiredLRP fails the
// update and nothing is stored.
func TestTransformerUpdateRefused(t *testing.T) {
	var evil atomic.Bool
	socket := servePlugin(t, lrpPlugin("evil", func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
		if evil.Load() {
			d.PlacementConstraint = &modelsv1.PlacementConstraint{Disallow: []string{"staging"}}
		}
		return d, nil
	}))
	env := bbstest.Start(t, withTransformers(transform.PluginConfig{Name: "evil", Socket: socket}))
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 1)}); err != nil {
		t.Fatal(err)
	}
	evil.Store(true)
	before := storeRevision(t, env)
	instances := int32(3)
	_, err := env.Client.UpdateDesiredLRP(ctxT(t), &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Instances: &instances}})
	wantRefused(t, env, before, err, codes.FailedPrecondition,
		`update desired lrp web: transformer "evil" (desired_lrp): invalid answer: desired_lrp.placement_constraint: is immutable: changed from {require: [], disallow: []} to {require: [], disallow: ["staging"]}`)
	if n := storedLRP(t, env, "web").GetInstances(); n != 1 {
		t.Errorf("instances after a refused update: %d, want 1", n)
	}
}

// TestTransformerTasks: tasks pass through the plugins configured for them; a plugin may
// change only the definition, and not its rootfs or placement constraint.
func TestTransformerTasks(t *testing.T) {
	lrpAnswer := `{"processGuid":"t","domain":"jobs","rootfs":"preloaded:cflinuxfs4"}`
	p := &plugin.Plugin{Name: "net", Task: func(_ context.Context, task *modelsv1.Task) (*modelsv1.Task, error) {
		switch task.GetTaskGuid() {
		case "guid":
			task.TaskGuid = "other"
		case "state":
			task.State = modelsv1.Task_STATE_RUNNING
		case "rootfs":
			task.Definition.Rootfs = "docker:///library/redis#7"
		case "constraint":
			task.Definition.PlacementConstraint = &modelsv1.PlacementConstraint{Require: []string{"gpu"}}
		default:
			if task.Definition.Properties == nil {
				task.Definition.Properties = map[string]string{}
			}
			task.Definition.Properties["network_id"] = "net-" + task.GetDomain()
		}
		return task, nil
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+plugin.PathTask, func(w http.ResponseWriter, r *http.Request) {
		var probe struct {
			TaskGuid string `json:"taskGuid"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &probe)
		if probe.TaskGuid == "kind" {
			_, _ = w.Write([]byte(lrpAnswer))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		p.Handler().ServeHTTP(w, r)
	})
	mux.Handle("GET "+plugin.PathDescribe, p.Handler())
	env := bbstest.Start(t, withTransformers(transform.PluginConfig{Name: "net", Socket: serveHandler(t, "net", mux)}))
	taskDesire(t, env, "good", "jobs", taskDefinition())
	if got := taskStored(t, env, "good").GetDefinition().GetProperties()["network_id"]; got != "net-jobs" {
		t.Errorf("stored network_id %q, want net-jobs", got)
	}
	tests := []struct {
		guid string
		code codes.Code
		msg  string
	}{
		{"guid", codes.FailedPrecondition, `desire task guid: transformer "net" (task): invalid answer: task.task_guid: changed from "guid" to "other"; a transformer may not change it`},
		{"state", codes.FailedPrecondition, `desire task state: transformer "net" (task): invalid answer: task.state: changed; a transformer may change only task.definition`},
		{"rootfs", codes.FailedPrecondition, `desire task rootfs: transformer "net" (task): invalid answer: task.definition.rootfs: is immutable: changed from "preloaded:cflinuxfs4" to "docker:///library/redis#7"`},
		{"constraint", codes.FailedPrecondition, `desire task constraint: transformer "net" (task): invalid answer: task.definition.placement_constraint: is immutable: changed from {require: [], disallow: []} to {require: ["gpu"], disallow: []}`},
		{"kind", codes.Internal, `desire task kind: transformer "net" (task): answered a desired_lrp where a task was expected`},
	}
	for _, tt := range tests {
		t.Run(tt.guid, func(t *testing.T) {
			before := storeRevision(t, env)
			_, err := env.Client.DesireTask(ctxT(t), &bbsv1.DesireTaskRequest{TaskGuid: tt.guid, Domain: "jobs", Definition: taskDefinition()})
			wantRefused(t, env, before, err, tt.code, tt.msg)
		})
	}

	// A plugin for tasks only is not called for LRPs.
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 1)}); err != nil {
		t.Fatalf("DesireLRP past a task-only plugin: %v", err)
	}
}

// TestTransformerHungPluginUnderLoad: 200 concurrent desires through one hung plugin under
// ignore all succeed with the original object; none waits much past the plugin's timeout
// (bounded concurrency and the timeout cover the wait for a slot).
func TestTransformerHungPluginUnderLoad(t *testing.T) {
	const n, timeout = 200, 500 * time.Millisecond
	release := make(chan struct{})
	var calls atomic.Int64
	socket := servePlugin(t, lrpPlugin("hung", func(ctx context.Context, _ *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
		calls.Add(1)
		select {
		case <-ctx.Done():
		case <-release:
		}
		return nil, errors.New("released")
	}))
	defer close(release)
	env := bbstest.Start(t, withTransformers(transform.PluginConfig{
		Name: "hung", Socket: socket, Timeout: bbs.Duration(timeout), FailurePolicy: transform.PolicyIgnore, MaxConcurrency: 8,
	}))
	// Generous: the timeout plus the BBS's own work on a loaded two-core machine.
	bound := timeout + 15*time.Second
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp(fmt.Sprintf("app-%d", i), 1)})
			if d := time.Since(start); d > bound {
				err = errors.Join(err, fmt.Errorf("app-%d took %v, more than %v", i, d, bound))
			}
			if err != nil {
				errs <- fmt.Errorf("app-%d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range n {
		guid := fmt.Sprintf("app-%d", i)
		if got := withoutTag(storedLRP(t, env, guid)); !proto.Equal(got, lrp(guid, 1)) {
			t.Fatalf("%s stored %v, want the original", guid, got)
		}
	}
	if c := calls.Load(); c == 0 || c > n {
		t.Errorf("the hung plugin was called %d times, want 1..%d (8 at a time, the rest timed out waiting)", c, n)
	}
}

// checksPlugin changes a desired LRP as its labels ask, on desire and on update alike:
// add-tcp-port=N replaces its routes with a TCP route on incoming port N, drop-routes=yes drops
// every route, add-link=T makes it consume a required link of type T.
func checksPlugin() *plugin.Plugin {
	return lrpPlugin("checks", func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
		if p := d.GetLabels()["add-tcp-port"]; p != "" {
			d.Routes = portRoutes(d.GetProcessGuid(), "tcp:"+p)
		}
		if d.GetLabels()["drop-routes"] == "yes" {
			d.Routes = nil
		}
		if typ := d.GetLabels()["add-link"]; typ != "" {
			d.Links = &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: typ, Type: typ}}}
		}
		return d, nil
	})
}

// labelsUpdate is an update setting an LRP's labels.
func labelsUpdate(guid string, l map[string]string) *bbsv1.UpdateDesiredLRPRequest {
	return &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: guid, Update: &modelsv1.DesiredLRPUpdate{Labels: &modelsv1.LabelsUpdate{Labels: l}}}
}

// TestTransformerUpdateRefusedAsDesire: what a plugin adds on UpdateDesiredLRP meets the checks
// a desire meets. A TCP incoming_port another LRP owns, or a required link that does not
// resolve, gets the answer DesireLRP gives the same plugin answer (code, message after the
// request's own prefix, field), and nothing is stored.
func TestTransformerUpdateRefusedAsDesire(t *testing.T) {
	env := bbstest.Start(t, withTransformers(transform.PluginConfig{Name: "checks", Socket: servePlugin(t, checksPlugin())}))
	ctx := ctxT(t)
	if err := desireWithPorts(ctx, env, "owner", "tcp:62000"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 1)}); err != nil {
		t.Fatal(err)
	}
	stored := storedLRP(t, env, "web")
	tests := []struct {
		name   string
		labels map[string]string
		code   codes.Code
		msg    string // after "desire lrp web-2: " or "update desired lrp web: "
		field  string // the BadRequest field of an InvalidArgument
	}{
		{"adds a taken incoming_port", map[string]string{"app": "web", "add-tcp-port": "62000"},
			codes.AlreadyExists, `tcp port 62000 is owned by desired lrp "owner"`, ""},
		{"adds an unresolvable required link", map[string]string{"app": "web", "add-link": "redis"},
			codes.InvalidArgument, `invalid request: desired_lrp.links.consumes[0]: link "redis": no provider of type "redis" in domain "apps"`, "desired_lrp.links.consumes[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := lrp("web-2", 1)
			d.Labels = tt.labels
			before := storeRevision(t, env)
			_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
			wantRefused(t, env, before, err, tt.code, "desire lrp web-2: "+tt.msg)
			_, err = env.Client.UpdateDesiredLRP(ctx, labelsUpdate("web", tt.labels))
			wantRefused(t, env, before, err, tt.code, "update desired lrp web: "+tt.msg)
			if tt.field != "" {
				wantBadRequestField(t, err, tt.field)
			}
			if got := storedLRP(t, env, "web"); !proto.Equal(got, stored) {
				t.Errorf("stored after a refused update:\n%v\nwant unchanged:\n%v", got, stored)
			}
		})
	}
}

// TestTransformerUpdateMovesPorts: port ownership follows the routes an update stores, as a
// plugin leaves them: a port the plugin adds is claimed (another LRP asking for it is refused),
// and a port the plugin drops is released (another LRP may take it).
func TestTransformerUpdateMovesPorts(t *testing.T) {
	env := bbstest.Start(t, withTransformers(transform.PluginConfig{Name: "checks", Socket: servePlugin(t, checksPlugin())}))
	ctx := ctxT(t)
	tests := []struct {
		name   string
		guid   string
		port   string            // the port the LRP is desired with
		labels map[string]string // its labels after the update
		taken  string            // a port another LRP is then refused
		free   string            // a port another LRP may then take
	}{
		{"plugin moves the route to another port", "a", "tcp:62000", map[string]string{"add-tcp-port": "62001"}, "tcp:62001", "tcp:62000"},
		{"plugin drops the only route", "b", "tcp:62100", map[string]string{"drop-routes": "yes"}, "", "tcp:62100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := desireWithPorts(ctx, env, tt.guid, tt.port); err != nil {
				t.Fatal(err)
			}
			if _, err := env.Client.UpdateDesiredLRP(ctx, labelsUpdate(tt.guid, tt.labels)); err != nil {
				t.Fatalf("update %s: %v", tt.guid, err)
			}
			if tt.taken != "" {
				before := storeRevision(t, env)
				wantOwned(t, env, before, desireWithPorts(ctx, env, tt.guid+"-taker", tt.taken), tt.guid)
			}
			if err := desireWithPorts(ctx, env, tt.guid+"-other", tt.free); err != nil {
				t.Errorf("asking for %s, which %s no longer routes: %v", tt.free, tt.guid, err)
			}
		})
	}
}
