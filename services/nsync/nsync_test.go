package nsync_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
	"github.com/gavel-sched/gavel/services/nsync"
)

func mustPool(t *testing.T, e *env, name string, require, disallow []string) {
	t.Helper()
	if _, err := e.nsync.CreatePlacementPool(ctxT(t), &nsyncv1.CreatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{Name: name, Require: require, Disallow: disallow}}); err != nil {
		t.Fatalf("create pool %s: %v", name, err)
	}
}

func bind(t *testing.T, e *env, space, pool string) {
	t.Helper()
	if _, err := e.nsync.BindPlacementPool(ctxT(t), &nsyncv1.BindPlacementPoolRequest{SpaceGuid: space, Pool: pool}); err != nil {
		t.Fatalf("bind %s to %s: %v", space, pool, err)
	}
}

// TestPlacementPoolsAndZeroDowntimeRestart walks the proposal: a space's pool places its app,
// a changed pool waits for RestartApp, the default pool covers unbound spaces, and a pool no
// cell satisfies leaves the old version serving with CELL_MISMATCH on the app.
func TestPlacementPoolsAndZeroDowntimeRestart(t *testing.T) {
	e := startEnv(t, nil, nil)
	ctx := ctxT(t)
	mustPool(t, e, "staging", []string{"staging"}, nil)
	mustPool(t, e, "prod", []string{"production"}, []string{"skynet"})
	mustPool(t, e, "skynet-only", []string{"skynet"}, []string{"staging", "production"})
	mustPool(t, e, "nowhere", []string{"alfalfa"}, nil)
	bind(t, e, "space-a", "staging")

	resp, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("web", "space-a", 4)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetProcessGuid() != "web-v1" || resp.GetApp().GetVersion() != 1 {
		t.Fatalf("DesireApp answered %v", resp)
	}
	cells := e.waitRunning(t, "web-v1", 4)
	onlyOn(t, "staging app", cells, 1, 2, 3, 4)
	d, _ := e.desired(t, "web-v1")
	if d.GetDomain() != "cf-apps" || d.GetRootfs() != "preloaded:cflinuxfs4" ||
		!maps.Equal(d.GetProperties(), map[string]string{"app_guid": "web", "space_guid": "space-a", "app_name": "web-name"}) ||
		d.GetLabels()["app"] != "web" || d.GetLabels()["space"] != "space-a" {
		t.Errorf("desired LRP %v", d)
	}
	sel, err := e.bbs.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{Filter: &bbsv1.Filter{LabelSelector: "app=web,space=space-a"}})
	if err != nil || len(sel.GetDesiredLrps()) != 1 {
		t.Errorf("selector app=web,space=space-a: %v %v", sel, err)
	}

	// Rebinding touches nothing running; Apps says a restart would apply it.
	bind(t, e, "space-a", "prod")
	if info := e.appInfo(t, "web"); !info.GetRestartToApply() || info.GetRunning() != 4 || info.GetDesired() != 4 {
		t.Errorf("after rebinding: %v", info)
	}
	if cells, _ := e.running(t, "web-v1"); len(cells) != 4 {
		t.Errorf("rebinding moved the app: %v", cells)
	}

	// RestartApp brings v2 up under the new pool, then removes v1.
	rr, err := e.nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "web"})
	if err != nil {
		t.Fatalf("RestartApp: %v", err)
	}
	if rr.GetProcessGuid() != "web-v2" {
		t.Fatalf("RestartApp answered %v", rr)
	}
	cells, _ = e.running(t, "web-v2")
	if len(cells) != 4 {
		t.Fatalf("RestartApp returned with v2 on %v", cells)
	}
	onlyOn(t, "restarted app", cells, 7, 8)
	waitFor(t, 10*time.Second, "v1 removed", func() (bool, string) {
		_, ok := e.desired(t, "web-v1")
		return !ok, "web-v1 still desired"
	})
	if info := e.appInfo(t, "web"); info.GetRestartToApply() || info.GetApp().GetVersion() != 2 || info.GetProcessGuid() != "web-v2" {
		t.Errorf("after restart: %v", info)
	}

	// The default pool applies to an unbound space.
	if _, err := e.nsync.SetDefaultPlacementPool(ctx, &nsyncv1.SetDefaultPlacementPoolRequest{Pool: "skynet-only"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("worker", "space-b", 2)}); err != nil {
		t.Fatal(err)
	}
	onlyOn(t, "app of an unbound space", e.waitRunning(t, "worker-v1", 2), 9)

	// A pool no cell satisfies: the restart fails with CELL_MISMATCH, v2 keeps serving.
	bind(t, e, "space-a", "nowhere")
	_, err = e.nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "web"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "alfalfa") {
		t.Fatalf("RestartApp under an impossible pool: %v, want FailedPrecondition naming the tag", err)
	}
	info := e.appInfo(t, "web")
	if info.GetPlacementError().GetCode() != modelsv1.PlacementError_CODE_CELL_MISMATCH || info.GetApp().GetVersion() != 2 || info.GetRunning() != 4 {
		t.Errorf("after the failed restart: %v", info)
	}
	if cells, _ := e.running(t, "web-v2"); len(cells) != 4 {
		t.Errorf("v2 stopped serving: %v", cells)
	}
	waitFor(t, 10*time.Second, "v3 removed", func() (bool, string) {
		_, ok := e.desired(t, "web-v3")
		return !ok, "web-v3 still desired"
	})

	// A task of the app gets the space's current pool and the app's names.
	tr, err := e.nsync.RunTask(ctx, &nsyncv1.RunTaskRequest{AppGuid: "worker", Command: "/bin/migrate --all", Name: "migrate"})
	if err != nil {
		t.Fatal(err)
	}
	task, err := e.bbs.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: tr.GetTaskGuid()})
	if err != nil {
		t.Fatal(err)
	}
	def := task.GetTask().GetDefinition()
	if task.GetTask().GetDomain() != "cf-tasks" || def.GetPlacementConstraint().GetRequire()[0] != "skynet" ||
		def.GetProperties()["app_guid"] != "worker" || def.GetLabels()["space"] != "space-b" {
		t.Errorf("task %v", task.GetTask())
	}
}

// TestPlacementPoolUpdateAndUnbind: a successful UpdatePlacementPool changes the pool every
// bound space uses and a successful UnbindPlacementPool sends the space back to the default
// pool; each shows in PlacementPools, in the constraint of a task RunTask desires for an app of
// the space, and in whether Apps says a restart would apply a new constraint to the app.
func TestPlacementPoolUpdateAndUnbind(t *testing.T) {
	e := startEnv(t, nil, nil)
	ctx := ctxT(t)
	mustPool(t, e, "pool-a", []string{"staging"}, nil)
	mustPool(t, e, "fallback", []string{"staging"}, nil) // the app's first constraint again
	if _, err := e.nsync.SetDefaultPlacementPool(ctx, &nsyncv1.SetDefaultPlacementPoolRequest{Pool: "fallback"}); err != nil {
		t.Fatal(err)
	}
	bind(t, e, "space-a", "pool-a")
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("web", "space-a", 1)}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name       string
		call       func() error
		pool       *nsyncv1.PlacementPool // pool-a as PlacementPools lists it
		spaces     []string               // the spaces bound to pool-a
		constraint *modelsv1.PlacementConstraint
		restart    bool // Apps says a restart would apply a new constraint to web
	}{
		{"update pool-a", func() error {
			_, err := e.nsync.UpdatePlacementPool(ctx, &nsyncv1.UpdatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{
				Name: "pool-a", Require: []string{"production"}, Disallow: []string{"skynet"}}})
			return err
		},
			&nsyncv1.PlacementPool{Name: "pool-a", Require: []string{"production"}, Disallow: []string{"skynet"}}, []string{"space-a"},
			&modelsv1.PlacementConstraint{Require: []string{"production"}, Disallow: []string{"skynet"}}, true},
		{"unbind space-a", func() error {
			_, err := e.nsync.UnbindPlacementPool(ctx, &nsyncv1.UnbindPlacementPoolRequest{SpaceGuid: "space-a"})
			return err
		},
			&nsyncv1.PlacementPool{Name: "pool-a", Require: []string{"production"}, Disallow: []string{"skynet"}}, nil,
			&modelsv1.PlacementConstraint{Require: []string{"staging"}}, false},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := st.call(); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			pools, err := e.nsync.PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var info *nsyncv1.PlacementPoolInfo
			for _, p := range pools.GetPools() {
				if p.GetPool().GetName() == "pool-a" {
					info = p
				}
			}
			if !proto.Equal(info.GetPool(), st.pool) || !slices.Equal(info.GetSpaceGuids(), st.spaces) {
				t.Errorf("PlacementPools lists pool-a as %v bound to %v, want %v bound to %v", info.GetPool(), info.GetSpaceGuids(), st.pool, st.spaces)
			}
			tr, err := e.nsync.RunTask(ctx, &nsyncv1.RunTaskRequest{AppGuid: "web", Command: "/bin/migrate", Name: "migrate"})
			if err != nil {
				t.Fatalf("RunTask: %v", err)
			}
			task, err := e.bbs.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: tr.GetTaskGuid()})
			if err != nil {
				t.Fatal(err)
			}
			if got := task.GetTask().GetDefinition().GetPlacementConstraint(); !models.SameConstraint(got, st.constraint) {
				t.Errorf("task of space-a placed by %v, want %v", got, st.constraint)
			}
			if got := e.appInfo(t, "web").GetRestartToApply(); got != st.restart {
				t.Errorf("restart_to_apply %v, want %v", got, st.restart)
			}
		})
	}
	_, err := e.nsync.UnbindPlacementPool(ctx, &nsyncv1.UnbindPlacementPoolRequest{SpaceGuid: "space-a"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("unbinding an unbound space: %v, want NotFound", err)
	}
}

// etcdState is what nsync and the BBS store (every key with its mod revision) and the
// revision read at.
func etcdState(t *testing.T, cli *clientv3.Client) (int64, map[string]int64) {
	t.Helper()
	resp, err := cli.Get(context.Background(), "/gavel/v1/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		// Presence, elections and the bulk loop's domain refreshes are not the request's doing.
		k := string(kv.Key)
		if !strings.HasPrefix(k, "/gavel/v1/cell/") && !strings.HasPrefix(k, "/gavel/v1/lock/") && !strings.HasPrefix(k, "/gavel/v1/domain/") {
			out[k] = kv.ModRevision
		}
	}
	return resp.Header.Revision, out
}

// TestBadInputStoresNothing: each bad request is refused with a message naming the field, and
// neither nsync's records nor the BBS change.
func TestBadInputStoresNothing(t *testing.T) {
	e := startEnv(t, func(c *nsync.Config) {
		c.BulkInterval, c.DomainTTL = nsync.Duration(time.Hour), nsync.Duration(2*time.Hour)
	}, nil)
	ctx := ctxT(t)
	mustPool(t, e, "bound", []string{"staging"}, nil)
	bind(t, e, "space-a", "bound")
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("ok", "space-a", 1)}); err != nil {
		t.Fatal(err)
	}
	e.waitRunning(t, "ok-v1", 1)
	tag64 := strings.Repeat("t", 64)
	withApp := func(f func(a *nsyncv1.App)) func() error {
		return func() error {
			a := app("bad", "space-a", 1)
			f(a)
			_, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: a})
			return err
		}
	}
	tests := []struct {
		name string
		call func() error
		code codes.Code
		want []string
	}{
		{"unknown stack", withApp(func(a *nsyncv1.App) { a.Stack = "windows2012" }), codes.InvalidArgument,
			[]string{"app.stack", `"windows2012"`, "cflinuxfs4, lucid64"}},
		{"64-character pool tag", func() error {
			_, err := e.nsync.CreatePlacementPool(ctx, &nsyncv1.CreatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{Name: "long", Require: []string{tag64}}})
			return err
		}, codes.InvalidArgument, []string{"pool.require[0]", "shorter than 64"}},
		{"64-character tag on update", func() error {
			_, err := e.nsync.UpdatePlacementPool(ctx, &nsyncv1.UpdatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{Name: "bound", Disallow: []string{tag64}}})
			return err
		}, codes.InvalidArgument, []string{"pool.disallow[0]"}},
		{"deleting a bound pool", func() error {
			_, err := e.nsync.DeletePlacementPool(ctx, &nsyncv1.DeletePlacementPoolRequest{Name: "bound"})
			return err
		}, codes.FailedPrecondition, []string{`"bound"`, "space-a", "force"}},
		{"bad docker reference", withApp(func(a *nsyncv1.App) { a.Stack, a.DockerImage = "", "Library/Redis::7" }), codes.InvalidArgument,
			[]string{"app.docker_image", "not a valid docker image reference"}},
		{"stack and docker image", withApp(func(a *nsyncv1.App) { a.DockerImage = "redis:7" }), codes.InvalidArgument, []string{"app.docker_image"}},
		{"no command", withApp(func(a *nsyncv1.App) { a.Command = " " }), codes.InvalidArgument, []string{"app.command"}},
		{"routes not the cf-router array", withApp(func(a *nsyncv1.App) { a.Routes = structpb.NewStringValue("web.example.com") }), codes.InvalidArgument, []string{"app.routes"}},
		{"existing app", withApp(func(a *nsyncv1.App) { a.Guid = "ok" }), codes.AlreadyExists, []string{`"ok"`}},
		{"binding an unknown pool", func() error {
			_, err := e.nsync.BindPlacementPool(ctx, &nsyncv1.BindPlacementPoolRequest{SpaceGuid: "space-b", Pool: "missing"})
			return err
		}, codes.NotFound, []string{`"missing"`}},
		{"negative instances", func() error {
			n := int32(-1)
			_, err := e.nsync.UpdateApp(ctx, &nsyncv1.UpdateAppRequest{Guid: "ok", Instances: &n})
			return err
		}, codes.InvalidArgument, []string{"instances"}},
		{"task without command", func() error {
			_, err := e.nsync.RunTask(ctx, &nsyncv1.RunTaskRequest{AppGuid: "ok"})
			return err
		}, codes.InvalidArgument, []string{"command"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rev, before := etcdState(t, e.cluster.Etcd)
			err := tt.call()
			if status.Code(err) != tt.code {
				t.Fatalf("got %v, want %s", err, tt.code)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			rev2, after := etcdState(t, e.cluster.Etcd)
			if !maps.Equal(before, after) {
				t.Errorf("stored keys changed: before %v, after %v", before, after)
			}
			if rev2 != rev {
				t.Errorf("etcd revision moved from %d to %d", rev, rev2)
			}
		})
	}
}

// TestBulkKeepsTheBBSInStep: missing, drifted and unknown LRPs are corrected; a stopped app
// leaves the BBS; with the BBS unreachable nothing is deleted and cf-apps goes stale; after it
// returns everything converges and cf-apps is fresh again.
func TestBulkKeepsTheBBSInStep(t *testing.T) {
	e := startEnv(t, nil, nil)
	ctx := ctxT(t)
	for _, g := range []string{"a", "b", "c"} {
		if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app(g, "space", 2)}); err != nil {
			t.Fatal(err)
		}
	}
	interval := time.Duration(e.cfg.BulkInterval)
	fresh := func() bool {
		resp, err := e.bbs.Domains(ctx, &bbsv1.DomainsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range resp.GetDomains() {
			if d.GetName() == "cf-apps" {
				return true
			}
		}
		return false
	}
	waitFor(t, 3*interval, "cf-apps fresh", func() (bool, string) { return fresh(), "stale" })

	// Removed behind nsync's back: back within one interval (plus the pass itself).
	if _, err := e.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "a-v1"}); err != nil {
		t.Fatal(err)
	}
	// Drifted instances and routes, and an LRP in cf-apps nsync does not know.
	n := int32(5)
	if _, err := e.bbs.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "b-v1", Update: &modelsv1.DesiredLRPUpdate{
		Instances: &n, Routes: &modelsv1.RoutesUpdate{Routes: map[string][]byte{"cf-router": []byte(`[{"port":8080,"routes":["evil.example.com"]}]`)}}}}); err != nil {
		t.Fatal(err)
	}
	stray, _ := e.desired(t, "c-v1")
	stray.ProcessGuid, stray.ModificationTag = "stray", nil
	if _, err := e.bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: stray}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, interval+5*time.Second, "the bulk loop to repair a, b and the stray LRP", func() (bool, string) {
		_, a := e.desired(t, "a-v1")
		b, _ := e.desired(t, "b-v1")
		_, s := e.desired(t, "stray")
		return a && b.GetInstances() == 2 && len(b.GetRoutes()) == 0 && !s, fmt.Sprintf("a %v, b %d %v, stray %v", a, b.GetInstances(), b.GetRoutes(), s)
	})

	// Stopped in nsync: leaves the BBS.
	if _, err := e.nsync.StopApp(ctx, &nsyncv1.StopAppRequest{Guid: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.desired(t, "c-v1"); ok {
		t.Error("c-v1 still desired after StopApp")
	}
	if info := e.appInfo(t, "c"); info.GetState() != nsyncv1.AppState_APP_STATE_STOPPED || info.GetDesired() != 0 {
		t.Errorf("stopped app: %v", info)
	}

	// The BBS unreachable: nothing is deleted, cf-apps goes stale.
	e.proxy.Cut()
	if _, err := e.nsync.StopApp(ctx, &nsyncv1.StopAppRequest{Guid: "b"}); err != nil {
		t.Fatalf("StopApp with the BBS away: %v", err)
	}
	n = 3
	if _, err := e.nsync.UpdateApp(ctx, &nsyncv1.UpdateAppRequest{Guid: "a", Instances: &n}); err != nil {
		t.Fatalf("UpdateApp with the BBS away: %v", err)
	}
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("d", "space", 1)}); err != nil {
		t.Fatalf("DesireApp with the BBS away: %v", err)
	}
	waitFor(t, time.Duration(e.cfg.DomainTTL)+5*time.Second, "cf-apps to go stale", func() (bool, string) { return !fresh(), "fresh" })
	// Apps answers from nsync's own records, each entry saying its instance counts are unknown.
	apps, err := e.nsync.Apps(ctx, &nsyncv1.AppsRequest{})
	if err != nil {
		t.Fatalf("Apps with the BBS away: %v", err)
	}
	got := map[string]*nsyncv1.AppInfo{}
	for _, a := range apps.GetApps() {
		got[a.GetApp().GetGuid()] = a
		if !a.GetCountsUnknown() || a.GetRunning() != 0 {
			t.Errorf("app %s with the BBS away: counts_unknown %v, running %d", a.GetApp().GetGuid(), a.GetCountsUnknown(), a.GetRunning())
		}
	}
	if len(got) != 4 || got["a"].GetDesired() != 3 || got["b"].GetState() != nsyncv1.AppState_APP_STATE_STOPPED || got["d"].GetDesired() != 1 {
		t.Errorf("Apps with the BBS away is not nsync's records: %v", apps.GetApps())
	}
	if _, ok := e.desired(t, "b-v1"); !ok {
		t.Error("b-v1 left the BBS while nsync could not reach it")
	}

	// Back: everything converges.
	e.proxy.Restore()
	waitFor(t, 3*interval+10*time.Second, "convergence after the BBS returns", func() (bool, string) {
		a, _ := e.desired(t, "a-v1")
		_, b := e.desired(t, "b-v1")
		_, d := e.desired(t, "d-v1")
		return a.GetInstances() == 3 && !b && d && fresh(), fmt.Sprintf("a %d, b %v, d %v, fresh %v", a.GetInstances(), b, d, fresh())
	})
	e.waitRunning(t, "a-v1", 3)
	e.waitRunning(t, "d-v1", 1)
	waitFor(t, 10*time.Second, "Apps to count a's instances again", func() (bool, string) {
		info := e.appInfo(t, "a")
		return !info.GetCountsUnknown() && info.GetRunning() == 3, info.String()
	})
}

// TestRestartOfNsyncLosesNothing: apps, pools, bindings and the default survive nsync
// stopping and starting again, and the bulk loop of the new instance takes over.
func TestRestartOfNsyncLosesNothing(t *testing.T) {
	e := startEnv(t, nil, nil)
	ctx := ctxT(t)
	mustPool(t, e, "staging", []string{"staging"}, nil)
	bind(t, e, "space-a", "staging")
	if _, err := e.nsync.SetDefaultPlacementPool(ctx, &nsyncv1.SetDefaultPlacementPoolRequest{Pool: "staging"}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app(fmt.Sprintf("app-%d", i), "space-a", 1)}); err != nil {
			t.Fatal(err)
		}
	}
	e.stop()
	e.startNsync(t)
	apps, err := e.nsync.Apps(ctx, &nsyncv1.AppsRequest{SpaceGuid: "space-a"})
	if err != nil || len(apps.GetApps()) != 5 {
		t.Fatalf("Apps after restart: %v %v", apps, err)
	}
	pools, err := e.nsync.PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
	if err != nil || len(pools.GetPools()) != 1 || pools.GetDefaultPool() != "staging" || pools.GetPools()[0].GetSpaceGuids()[0] != "space-a" {
		t.Fatalf("PlacementPools after restart: %v %v", pools, err)
	}
	for i := range 5 {
		e.waitRunning(t, fmt.Sprintf("app-%d-v1", i), 1)
	}
}

// stampPlugin is a transformer plugin, served on a UNIX socket, that adds a network id
// property to every LRP and task.
func stampPlugin(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gvns")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "stamp.sock")
	l, err := plugin.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	p := &plugin.Plugin{Name: "stamp", Version: "test",
		DesiredLRP: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
			if d.GetProperties()["app_name"] == "refused-name" {
				return nil, &plugin.Error{Message: "no network for this app", External: true}
			}
			d.Properties["network.network_id"] = "net-" + d.GetProperties()["space_guid"]
			return d, nil
		},
		Task: func(_ context.Context, task *modelsv1.Task) (*modelsv1.Task, error) {
			task.Definition.Properties["network.network_id"] = "net-task"
			return task, nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.ServeListener(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return path
}

// TestTransformerRunsOnWhatNsyncBuilds: with a plugin configured in nsync's plugins, the
// chain's output is what reaches the BBS, for apps (also when the bulk loop desires them again)
// and for tasks.
func TestTransformerRunsOnWhatNsyncBuilds(t *testing.T) {
	socket := stampPlugin(t)
	e := startEnv(t, func(c *nsync.Config) {
		c.Plugins = []transform.PluginConfig{{Name: "stamp", Socket: socket}}
	}, nil)
	ctx := ctxT(t)
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("web", "space-x", 1)}); err != nil {
		t.Fatal(err)
	}
	if d, _ := e.desired(t, "web-v1"); d.GetProperties()["network.network_id"] != "net-space-x" {
		t.Errorf("LRP properties %v", d.GetProperties())
	}
	if _, err := e.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web-v1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "web-v1 desired again", func() (bool, string) {
		d, ok := e.desired(t, "web-v1")
		return ok && d.GetProperties()["network.network_id"] == "net-space-x", fmt.Sprint(d.GetProperties())
	})
	// A plugin refusing an app: the caller's fault, nothing stored (measured once web-v1's
	// instance runs again, so that nothing changes by itself meanwhile).
	e.waitRunning(t, "web-v1", 1)
	_, before := etcdState(t, e.cluster.Etcd)
	_, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("refused", "space-x", 1)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "no network for this app") {
		t.Errorf("DesireApp refused by the plugin: %v", err)
	}
	if _, after := etcdState(t, e.cluster.Etcd); !maps.Equal(before, after) {
		t.Errorf("a refused app changed what is stored: before %v, after %v", before, after)
	}
	tr, err := e.nsync.RunTask(ctx, &nsyncv1.RunTaskRequest{AppGuid: "web", Command: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	task, err := e.bbs.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: tr.GetTaskGuid()})
	if err != nil || task.GetTask().GetDefinition().GetProperties()["network.network_id"] != "net-task" {
		t.Errorf("task %v %v", task, err)
	}
}

// TestBulkLoopFinishesARestart: a restart whose caller got an error (the BBS was unreachable)
// is completed by the bulk loop from the record once the BBS is back: the new version runs, the
// old one drains and goes.
func TestBulkLoopFinishesARestart(t *testing.T) {
	e := startEnv(t, nil, nil)
	ctx := ctxT(t)
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("web", "space", 2)}); err != nil {
		t.Fatal(err)
	}
	e.waitRunning(t, "web-v1", 2)
	e.proxy.Cut()
	_, err := e.nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "web"})
	if err == nil || !strings.Contains(err.Error(), "continues in the background") {
		t.Fatalf("RestartApp with the BBS away: %v", err)
	}
	// Apps needs the BBS for its counts: read the record itself.
	got, err := e.cluster.Etcd.Get(ctx, "/gavel/v1/nsync/app/web")
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("read the record: %v %v", got, err)
	}
	rec := &nsyncv1.AppRecord{}
	if err := proto.Unmarshal(got.Kvs[0].Value, rec); err != nil {
		t.Fatal(err)
	}
	if rec.GetPendingVersion() != 2 || rec.GetApp().GetVersion() != 1 {
		t.Fatalf("after the interrupted restart: %v", rec)
	}
	e.proxy.Restore()
	waitFor(t, 20*time.Second, "the bulk loop to finish the restart", func() (bool, string) {
		resp, err := e.nsync.Apps(ctx, &nsyncv1.AppsRequest{Guids: []string{"web"}})
		if err != nil || len(resp.GetApps()) != 1 {
			return false, fmt.Sprint(resp, err) // nsync reconnects to the BBS
		}
		info := resp.GetApps()[0]
		_, old := e.desired(t, "web-v1")
		return info.GetApp().GetVersion() == 2 && info.GetPendingVersion() == 0 && info.GetRunning() == 2 && !old,
			fmt.Sprintf("version %d pending %d running %d, v1 desired %v", info.GetApp().GetVersion(), info.GetPendingVersion(), info.GetRunning(), old)
	})
}

// TestRestartOrderOnTheEventStream: what routers see of a restart, on the BBS event stream:
// every instance of the new version RUNNING, then the old version losing its routes, then
// (after the drain) the old version removed — never an old instance gone while still routed.
func TestRestartOrderOnTheEventStream(t *testing.T) {
	e := startEnv(t, nil, nil)
	ctx := ctxT(t)
	a := app("web", "space", 2)
	a.Routes, _ = structpb.NewValue([]any{map[string]any{"port": 8080, "routes": []any{"web.example.com"}}})
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: a}); err != nil {
		t.Fatal(err)
	}
	e.waitRunning(t, "web-v1", 2)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	list, err := e.bbs.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Every event after the listing, even those committed before the stream opens.
	stream, err := e.bbs.SubscribeToEvents(sctx, &bbsv1.SubscribeToEventsRequest{SinceRevision: list.GetRevision(), Filter: &bbsv1.Filter{Domain: "cf-apps"}})
	if err != nil {
		t.Fatal(err)
	}
	restarted := make(chan error, 1)
	go func() {
		_, err := e.nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "web"})
		restarted <- err
	}()
	var steps []string
	newRunning, oldUnrouted := 0, false
	for done := false; !done; {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("event stream: %v (so far %v)", err, steps)
		}
		for _, ev := range msg.GetEvents() {
			switch {
			case ev.GetActualLrpChanged() != nil:
				after := ev.GetActualLrpChanged().GetAfter()
				if after.GetKey().GetProcessGuid() == "web-v2" && after.GetState() == modelsv1.ActualLRP_STATE_RUNNING &&
					ev.GetActualLrpChanged().GetBefore().GetState() != modelsv1.ActualLRP_STATE_RUNNING {
					newRunning++
					steps = append(steps, "v2 running")
				}
			case ev.GetActualLrpRemoved() != nil:
				if ev.GetActualLrpRemoved().GetActualLrp().GetKey().GetProcessGuid() == "web-v1" && !oldUnrouted {
					t.Fatalf("a v1 instance went while v1 was still routed (steps %v)", steps)
				}
			case ev.GetDesiredLrpChanged() != nil:
				ch := ev.GetDesiredLrpChanged()
				if ch.GetAfter().GetProcessGuid() == "web-v1" && len(ch.GetAfter().GetRoutes()) == 0 && len(ch.GetBefore().GetRoutes()) > 0 {
					if newRunning != 2 {
						t.Fatalf("v1 unrouted with %d v2 instances running (steps %v)", newRunning, steps)
					}
					oldUnrouted = true
					steps = append(steps, "v1 unrouted")
				}
			case ev.GetDesiredLrpRemoved() != nil:
				if ev.GetDesiredLrpRemoved().GetDesiredLrp().GetProcessGuid() == "web-v1" {
					if !oldUnrouted {
						t.Fatalf("v1 removed while routed (steps %v)", steps)
					}
					steps = append(steps, "v1 removed")
					done = true
				}
			}
		}
	}
	if err := <-restarted; err != nil {
		t.Fatalf("RestartApp: %v", err)
	}
	t.Logf("restart as the event stream saw it: %v", steps)
}

// TestRecreatedAppGetsItsNewDefinition: an app deleted while the BBS was unreachable and
// desired again under the same guid ends up with its new definition at the BBS, and nothing of
// the old one.
func TestRecreatedAppGetsItsNewDefinition(t *testing.T) {
	e := startEnv(t, nil, nil)
	ctx := ctxT(t)
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("re", "space", 1)}); err != nil {
		t.Fatal(err)
	}
	e.proxy.Cut()
	if _, err := e.nsync.StopApp(ctx, &nsyncv1.StopAppRequest{Guid: "re", Delete: true}); err != nil {
		t.Fatal(err)
	}
	e.proxy.Restore()
	again := app("re", "space", 1)
	again.Command = "/bin/new-app"
	waitFor(t, 10*time.Second, "DesireApp with the BBS back", func() (bool, string) {
		_, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: again})
		return err == nil, fmt.Sprint(err)
	})
	waitFor(t, 20*time.Second, "only the new definition at the BBS", func() (bool, string) {
		resp, err := e.bbs.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{Filter: &bbsv1.Filter{LabelSelector: "app=re"}})
		if err != nil {
			return false, err.Error()
		}
		var paths []string
		for _, d := range resp.GetDesiredLrps() {
			paths = append(paths, d.GetProcessGuid()+":"+d.GetAction().GetRun().GetPath())
		}
		return len(paths) == 1 && strings.HasSuffix(paths[0], ":/bin/new-app"), fmt.Sprint(paths)
	})
}

// TestRestartSurvivesConcurrentWritesOfTheRecord: while RestartApp waits for the new version,
// other writers (the bulk loop's bookkeeping) change the app record; a lost compare-and-swap
// while advancing the restart is read again, never answered to the caller as Aborted.
func TestRestartSurvivesConcurrentWritesOfTheRecord(t *testing.T) {
	e := startEnv(t, nil, nil)
	ctx := ctxT(t)
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("web", "space", 2)}); err != nil {
		t.Fatal(err)
	}
	e.waitRunning(t, "web-v1", 2)
	done := make(chan struct{})
	writes := make(chan int)
	go func() {
		// Once the restart is recorded as pending, rewrite the record as it stands (a new mod
		// revision, the same content) every millisecond for a bounded time, or until the
		// restart answers.
		n := 0
		defer func() { writes <- n }()
		stop := time.After(3 * time.Second)
		for {
			select {
			case <-done:
				return
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			got, err := e.cluster.Etcd.Get(ctx, "/gavel/v1/nsync/app/web")
			if err != nil || len(got.Kvs) != 1 {
				continue
			}
			rec := &nsyncv1.AppRecord{}
			if err := proto.Unmarshal(got.Kvs[0].Value, rec); err != nil || rec.GetPendingVersion() == 0 {
				continue // only the wait is the subject here, not the start
			}
			if _, err := e.cluster.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("/gavel/v1/nsync/app/web"), "=", got.Kvs[0].ModRevision)).
				Then(clientv3.OpPut("/gavel/v1/nsync/app/web", string(got.Kvs[0].Value))).Commit(); err == nil {
				n++
			}
		}
	}()
	rr, err := e.nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "web"})
	close(done)
	t.Logf("the record was rewritten %d times during the restart", <-writes)
	if err != nil {
		t.Fatalf("RestartApp with concurrent writes of the record: %v", err)
	}
	if rr.GetProcessGuid() != "web-v2" {
		t.Errorf("RestartApp answered %v", rr)
	}
	e.waitRunning(t, "web-v2", 2)
}
