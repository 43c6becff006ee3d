package nsync_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/services/nsync"
	"github.com/gavel-sched/gavel/services/rep"
)

// deployEnv is the nsync environment with a fast deployment loop.
func deployEnv(t *testing.T) *env {
	return startEnv(t, func(c *nsync.Config) { c.DeployPoll = nsync.Duration(50 * time.Millisecond) }, nil)
}

// started desires a of space s and waits until all its instances run.
func (e *env) started(t *testing.T, a *nsyncv1.App) {
	t.Helper()
	if _, err := e.nsync.DesireApp(ctxT(t), &nsyncv1.DesireAppRequest{App: a}); err != nil {
		t.Fatal(err)
	}
	e.waitRunning(t, a.GetGuid()+"-v1", int(a.GetInstances()))
}

// deploy deploys a with opts and returns the deployment started.
func (e *env) deploy(t *testing.T, a *nsyncv1.App, opts *nsyncv1.DeploymentOptions) *nsyncv1.Deployment {
	t.Helper()
	resp, err := e.nsync.DeployApp(ctxT(t), &nsyncv1.DeployAppRequest{App: a, Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetDeployment() == nil {
		t.Fatalf("DeployApp started no deployment: %v", resp)
	}
	return resp.GetDeployment()
}

// deployment returns app guid's deployment id (the active one or a finished one).
func (e *env) deployment(t *testing.T, guid, id string) *nsyncv1.Deployment {
	t.Helper()
	resp, err := e.nsync.ListDeployments(ctxT(t), &nsyncv1.ListDeploymentsRequest{AppGuid: guid})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range resp.GetDeployments() {
		if d.GetId() == id {
			return d
		}
	}
	return nil
}

// waitState waits until deployment id of guid is in state and returns it.
func (e *env) waitState(t *testing.T, guid, id string, state nsyncv1.DeploymentState) *nsyncv1.Deployment {
	t.Helper()
	var d *nsyncv1.Deployment
	waitFor(t, 15*time.Second, fmt.Sprintf("deployment %s %s", id, state), func() (bool, string) {
		d = e.deployment(t, guid, id)
		return d.GetState() == state, fmt.Sprintf("%v", d)
	})
	return d
}

func (e *env) sample(t *testing.T, guid, newPG string) *testkit.RolloutSampler {
	t.Helper()
	return testkit.SampleRollout(t, e.bbs, guid, newPG)
}

// versionOf reads the app's serving version and definition.
func (e *env) serving(t *testing.T, guid string) *nsyncv1.App { return e.appInfo(t, guid).GetApp() }

func TestRollingDeploy(t *testing.T) {
	e := deployEnv(t)
	a := app("roll", "space-a", 4)
	a.Routes = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"port": structpb.NewNumberValue(8080), "routes": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("roll.example.com")}}),
	}})}})
	e.started(t, a)

	// Only instances changed: in place, no deployment.
	a.Instances = 4
	resp, err := e.nsync.DeployApp(ctxT(t), &nsyncv1.DeployAppRequest{App: a})
	if err != nil || resp.GetDeployment() != nil || resp.GetOutcome() != "unchanged" {
		t.Fatalf("DeployApp of the same app: %v %v", resp, err)
	}

	a.Command = "/bin/app --port 8080 --v2"
	s := e.sample(t, "roll", "roll-v2")
	d := e.deploy(t, a, &nsyncv1.DeploymentOptions{MaxInFlight: 1})
	if d.GetFromVersion() != 1 || d.GetToVersion() != 2 || d.GetOptions().GetStrategy() != nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_ROLLING {
		t.Fatalf("deployment: %v", d)
	}
	e.waitState(t, "roll", d.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED)
	s.End()
	e.waitRunning(t, "roll-v2", 4)
	waitFor(t, 10*time.Second, "v1 gone", func() (bool, string) { _, ok := e.desired(t, "roll-v1"); return !ok, "roll-v1 desired" })
	if got := e.serving(t, "roll"); got.GetVersion() != 2 || got.GetCommand() != a.GetCommand() {
		t.Errorf("serving %v, want version 2 with the new command", got)
	}
	t.Logf("%d samples: at least %d ready, at most %d present, zone skew new %d, all %d", s.Samples, s.MinReady, s.MaxPresent, s.MaxSkewNew, s.MaxSkewAll)
	if s.MinReady < 4 {
		t.Errorf("ready instances fell to %d during the rollout, want at least 4", s.MinReady)
	}
	if s.MaxPresent > 5 {
		t.Errorf("%d instances present at once, want at most 4 + max_in_flight", s.MaxPresent)
	}
	vs, err := e.nsync.AppVersions(ctxT(t), &nsyncv1.AppVersionsRequest{AppGuid: "roll"})
	if err != nil || len(vs.GetVersions()) != 2 || vs.GetVersions()[0].GetApp().GetCommand() != a.GetCommand() || !vs.GetVersions()[0].GetHealthy() {
		t.Errorf("versions: %v %v", vs, err)
	}
	// The routes stayed: both versions carried them, the new one serves them.
	if lrp, _ := e.desired(t, "roll-v2"); !strings.Contains(string(lrp.GetRoutes()["cf-router"]), "roll.example.com") {
		t.Errorf("v2 routes: %s", lrp.GetRoutes())
	}
}

// TestZoneSpreadAtEveryStep: with 3 zones and 6 instances, no step of a rolling deployment
// leaves a zone with more than one of the app's instances (both versions) above another
// (decision 0037: the new LRP spreads with the old one's surviving instances). The sampler
// follows every store revision, and the test checks it saw each step: the new version running
// 1, 2, ... 6 instances.
func TestZoneSpreadAtEveryStep(t *testing.T) {
	e := deployEnv(t)
	a := app("spread", "space-a", 6)
	e.started(t, a)
	a.Command = "/bin/app --v2"
	s := e.sample(t, "spread", "spread-v2")
	d := e.deploy(t, a, &nsyncv1.DeploymentOptions{MaxInFlight: 1})
	e.waitState(t, "spread", d.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED)
	if cells := e.waitRunning(t, "spread-v2", 6); len(cells) != 6 {
		t.Fatal(cells)
	}
	s.End()
	t.Logf("%d samples: zone skew of the new version %d, of every instance %d (%s)", s.Samples, s.MaxSkewNew, s.MaxSkewAll, s.WorstAll)
	for n := 1; n <= 6; n++ {
		if !s.NewRunning[n] {
			t.Errorf("no sample saw %d new instances running (seen %v): the sampler missed a step", n, s.NewRunning)
		}
	}
	if s.MaxSkewAll > 1 {
		t.Errorf("the app's instances were %d apart between zones at some step (%s), want at most 1", s.MaxSkewAll, s.WorstAll)
	}
	lrp, _ := e.desired(t, "spread-v2")
	if sw := lrp.GetSpreadWith(); sw.GetProcessGuid() != "spread-v1" || sw.GetTotalInstances() != 6 {
		t.Errorf("spread-v2's spread peer %v, want spread-v1 over 6 instances", sw)
	}
}

func TestCrashingVersionFailsAndReverts(t *testing.T) {
	e := deployEnv(t)
	a := app("crash", "space-a", 4)
	e.started(t, a)
	bad := app("crash", "space-a", 4)
	bad.Command = "/bin/app --broken"
	bad.HealthCheck = &nsyncv1.HealthCheck{Type: nsyncv1.HealthCheck_TYPE_PORT, TimeoutMs: 1} // the sim cell's start takes 20ms: it times out, a crash
	s := e.sample(t, "crash", "crash-v2")
	d := e.deploy(t, bad, &nsyncv1.DeploymentOptions{ProgressDeadlineMs: 10_000})
	failed := e.waitState(t, "crash", d.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED)
	if !strings.Contains(failed.GetMessage(), "crashed") {
		t.Errorf("failure message %q, want it to say the new instance crashed", failed.GetMessage())
	}
	var revert *nsyncv1.Deployment
	waitFor(t, 30*time.Second, "the revert to succeed", func() (bool, string) {
		list, err := e.nsync.ListDeployments(ctxT(t), &nsyncv1.ListDeploymentsRequest{AppGuid: "crash"})
		if err != nil {
			return false, err.Error()
		}
		revert = list.GetDeployments()[0]
		return revert.GetRevertOf() == d.GetId() && revert.GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED, fmt.Sprint(revert)
	})
	s.End()
	if s.MinReady < 4 {
		t.Errorf("ready instances fell to %d, want the old version's 4 throughout", s.MinReady)
	}
	waitFor(t, 10*time.Second, "v2 gone", func() (bool, string) { _, ok := e.desired(t, "crash-v2"); return !ok, "crash-v2 desired" })
	e.waitRunning(t, "crash-v1", 4)
	// The revert swapped the roles: the old version's LRP spread with the failed one's.
	if lrp, _ := e.desired(t, "crash-v1"); lrp.GetSpreadWith().GetProcessGuid() != "crash-v2" || lrp.GetSpreadWith().GetTotalInstances() != 4 {
		t.Errorf("crash-v1's spread peer after the revert %v, want crash-v2 over 4", lrp.GetSpreadWith())
	}
	info := e.appInfo(t, "crash")
	if info.GetApp().GetVersion() != 1 || !strings.Contains(info.GetPlacementError().GetMessage(), "crashed") {
		t.Errorf("app after the revert: version %d, error %v", info.GetApp().GetVersion(), info.GetPlacementError())
	}
}

func TestCanaryPromoteAndCancel(t *testing.T) {
	e := deployEnv(t)
	a := app("can", "space-a", 4)
	e.started(t, a)
	ctx := ctxT(t)
	for _, call := range []func() error{
		func() error {
			_, err := e.nsync.PromoteDeployment(ctx, &nsyncv1.PromoteDeploymentRequest{AppGuid: "can"})
			return err
		},
		func() error {
			_, err := e.nsync.CancelDeployment(ctx, &nsyncv1.CancelDeploymentRequest{AppGuid: "can"})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("promote/cancel without a deployment: %v, want FailedPrecondition", err)
		}
	}

	a.Command = "/bin/app --v2"
	d := e.deploy(t, a, &nsyncv1.DeploymentOptions{Strategy: nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY})
	e.waitState(t, "can", d.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED)
	if cells, _ := e.running(t, "can-v2"); len(cells) != 1 {
		t.Errorf("paused with %d canaries running, want 1", len(cells))
	}
	if cells, _ := e.running(t, "can-v1"); len(cells) != 4 {
		t.Errorf("paused with %d old instances running, want 4", len(cells))
	}
	if _, err := e.nsync.PromoteDeployment(ctx, &nsyncv1.PromoteDeploymentRequest{AppGuid: "can"}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, "can", d.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED)
	e.waitRunning(t, "can-v2", 4)

	a.Command = "/bin/app --v3"
	d3 := e.deploy(t, a, &nsyncv1.DeploymentOptions{Strategy: nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY})
	e.waitState(t, "can", d3.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED)
	s := e.sample(t, "can", "can-v3")
	if _, err := e.nsync.CancelDeployment(ctx, &nsyncv1.CancelDeploymentRequest{AppGuid: "can"}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, "can", d3.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED)
	waitFor(t, 20*time.Second, "the canary gone", func() (bool, string) { _, ok := e.desired(t, "can-v3"); return !ok, "can-v3 desired" })
	s.End()
	if s.MinReady < 4 {
		t.Errorf("ready instances fell to %d while cancelling, want 4", s.MinReady)
	}
	if got := e.serving(t, "can"); got.GetVersion() != 2 {
		t.Errorf("serving version %d after the cancel, want 2", got.GetVersion())
	}
	e.waitRunning(t, "can-v2", 4)
}

func TestDeployCellMismatchKeepsTheOldVersion(t *testing.T) {
	e := deployEnv(t)
	a := app("mis", "space-a", 2)
	e.started(t, a)
	a.Stack = "lucid64" // no cell has it
	d := e.deploy(t, a, nil)
	failed := e.waitState(t, "mis", d.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED)
	if !strings.Contains(failed.GetMessage(), "CELL_MISMATCH") {
		t.Errorf("failure %q, want CELL_MISMATCH", failed.GetMessage())
	}
	waitFor(t, 20*time.Second, "v2 gone", func() (bool, string) { _, ok := e.desired(t, "mis-v2"); return !ok, "mis-v2 desired" })
	info := e.appInfo(t, "mis")
	if info.GetPlacementError().GetCode() != modelsv1.PlacementError_CODE_CELL_MISMATCH || info.GetApp().GetVersion() != 1 || info.GetRunning() != 2 {
		t.Errorf("app: version %d running %d error %v, want version 1 serving 2 with CELL_MISMATCH", info.GetApp().GetVersion(), info.GetRunning(), info.GetPlacementError())
	}
}

func TestDeployResumesOnANewLeader(t *testing.T) {
	e := deployEnv(t)
	a := app("fo", "space-a", 4)
	e.started(t, a)
	a.Command = "/bin/app --v2"
	// Half a second of readiness per step keeps the rollout under way when its leader goes.
	d := e.deploy(t, a, &nsyncv1.DeploymentOptions{MinHealthyTimeMs: 500})
	waitFor(t, 20*time.Second, "the rollout under way", func() (bool, string) {
		got := e.deployment(t, "fo", d.GetId())
		return got.GetOldDesired() < 4 && got.GetOldDesired() > 0, fmt.Sprint(got)
	})
	e.stop()
	e.startNsync(t) // a new nsync takes the leadership over and resumes from the record
	e.waitState(t, "fo", d.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED)
	e.waitRunning(t, "fo-v2", 4)
	waitFor(t, 10*time.Second, "v1 gone", func() (bool, string) { _, ok := e.desired(t, "fo-v1"); return !ok, "fo-v1 desired" })
	lrp, _ := e.desired(t, "fo-v2")
	if lrp.GetInstances() != 4 {
		t.Errorf("v2 desired with %d instances, want 4", lrp.GetInstances())
	}
	resp, err := e.bbs.ActualLRPs(ctxT(t), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{Domain: "cf-apps"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetActualLrps()); n != 4 {
		t.Errorf("%d instances at the end, want exactly 4", n)
	}
}

func TestDeployBadInputStoresNothing(t *testing.T) {
	e := deployEnv(t)
	a := app("bad", "space-a", 1)
	a.Routes = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"port": structpb.NewNumberValue(8080), "routes": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("bad.example.com")}}),
	}})}})
	e.started(t, a)
	with := func(f func(*nsyncv1.App)) *nsyncv1.App {
		c := app("bad", "space-a", 1)
		c.Routes = a.GetRoutes()
		f(c)
		return c
	}
	for _, tc := range []struct {
		name  string
		req   *nsyncv1.DeployAppRequest
		field string
	}{
		{"unknown stack", &nsyncv1.DeployAppRequest{App: with(func(x *nsyncv1.App) { x.Stack = "nope" })}, "app.stack"},
		{"bad image", &nsyncv1.DeployAppRequest{App: with(func(x *nsyncv1.App) { x.Stack, x.DockerImage = "", "UPPER::case" })}, "app.docker_image"},
		{"ports changed under the routes", &nsyncv1.DeployAppRequest{App: with(func(x *nsyncv1.App) { x.Ports = []uint32{9090} })}, "app.routes[0].port"},
		{"negative max_in_flight", &nsyncv1.DeployAppRequest{App: with(func(x *nsyncv1.App) { x.Command = "/bin/x" }), Options: &nsyncv1.DeploymentOptions{MaxInFlight: -1}}, "options.max_in_flight"},
		{"canaries without canary", &nsyncv1.DeployAppRequest{App: with(func(x *nsyncv1.App) { x.Command = "/bin/x" }), Options: &nsyncv1.DeploymentOptions{Canaries: 2}}, "options.canaries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.nsync.DeployApp(ctxT(t), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	vs, err := e.nsync.AppVersions(ctxT(t), &nsyncv1.AppVersionsRequest{AppGuid: "bad"})
	if err != nil || len(vs.GetVersions()) != 1 {
		t.Errorf("versions after refusals: %v %v", vs, err)
	}
	if ds, err := e.nsync.ListDeployments(ctxT(t), &nsyncv1.ListDeploymentsRequest{AppGuid: "bad"}); err != nil || len(ds.GetDeployments()) != 0 {
		t.Errorf("deployments after refusals: %v %v", ds, err)
	}
	if _, ok := e.desired(t, "bad-v2"); ok {
		t.Error("a refused deploy desired bad-v2")
	}
}

// TestDeployLosesTheCanarysCell cuts the cell of the only new instance (a paused canary) off
// from etcd and promotes: the deployment never hangs — it replaces the instance elsewhere and
// completes, or fails and reverts — and ends with exactly the app's instances running.
func TestDeployLosesTheCanarysCell(t *testing.T) {
	e := newEnvWith(t, func(c *devcluster.Config) {
		c.CellsPerHost = 1
		for i := range c.Cells {
			c.Cells[i].Config.LeaseTTL = rep.Duration(2 * time.Second)
		}
	}, func(c *nsync.Config) { c.DeployPoll = nsync.Duration(50 * time.Millisecond) }, nil)
	e.startNsync(t)
	a := app("lost", "space-a", 4)
	e.started(t, a)
	a.Command = "/bin/app --v2"
	d := e.deploy(t, a, &nsyncv1.DeploymentOptions{Strategy: nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY, ProgressDeadlineMs: 15_000})
	e.waitState(t, "lost", d.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED)
	cells := e.waitRunning(t, "lost-v2", 1)
	var host int
	if _, err := fmt.Sscanf(cells[0], "cell-%d", &host); err != nil {
		t.Fatal(err)
	}
	if err := e.cluster.DisconnectHost(host - 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the lost cell gone", func() (bool, string) {
		resp, err := e.bbs.Cells(context.Background(), &bbsv1.CellsRequest{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range resp.GetCells() {
			if c.GetCellId() == cells[0] {
				return false, "still present"
			}
		}
		return true, ""
	})
	if _, err := e.nsync.PromoteDeployment(ctxT(t), &nsyncv1.PromoteDeploymentRequest{AppGuid: "lost"}); err != nil {
		t.Fatal(err)
	}
	var serving string
	waitFor(t, 45*time.Second, "the deployment (or its revert) to succeed", func() (bool, string) {
		list, err := e.nsync.ListDeployments(ctxT(t), &nsyncv1.ListDeploymentsRequest{AppGuid: "lost"})
		if err != nil {
			return false, err.Error()
		}
		last := list.GetDeployments()[0]
		done := last.GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED && (last.GetId() == d.GetId() || last.GetRevertOf() == d.GetId())
		serving = fmt.Sprintf("lost-v%d", last.GetToVersion())
		return done, fmt.Sprint(list.GetDeployments())
	})
	t.Logf("ended serving %s: %v", serving, e.deployment(t, "lost", d.GetId()))
	waitFor(t, 30*time.Second, "4 instances of "+serving+", none on the lost cell", func() (bool, string) {
		running, s := e.running(t, serving)
		return len(running) == 4 && !slices.Contains(running, cells[0]), s
	})
	waitFor(t, 10*time.Second, "one version left", func() (bool, string) {
		_, v1 := e.desired(t, "lost-v1")
		_, v2 := e.desired(t, "lost-v2")
		return v1 != v2, fmt.Sprintf("v1 desired %v, v2 desired %v", v1, v2)
	})
}

// TestChangeSupersedesADeployment deploys v2 slowly, then v3 while v2 rolls: v2's deployment is
// cancelled and reverted, v3 waits queued and then rolls out from v1; a rollback then deploys
// the last version that served before v3 (v1) again as v4.
func TestChangeSupersedesADeployment(t *testing.T) {
	e := deployEnv(t)
	a := app("sup", "space-a", 3)
	e.started(t, a)
	a.Command = "/bin/app --v2"
	d2 := e.deploy(t, a, &nsyncv1.DeploymentOptions{MinHealthyTimeMs: 1000})
	a.Command = "/bin/app --v3"
	resp, err := e.nsync.DeployApp(ctxT(t), &nsyncv1.DeployAppRequest{App: a})
	if err != nil || resp.GetOutcome() != "queued" || resp.GetDeployment().GetToVersion() != 3 {
		t.Fatalf("a change during a deployment: %v %v, want queued v3", resp, err)
	}
	d3 := resp.GetDeployment()
	cancelled := e.waitState(t, "sup", d2.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED)
	if !strings.Contains(cancelled.GetMessage(), "superseded by "+d3.GetId()) {
		t.Errorf("cancelled %q, want superseded", cancelled.GetMessage())
	}
	done := e.waitState(t, "sup", d3.GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED)
	if done.GetFromVersion() != 1 || done.GetToVersion() != 3 {
		t.Errorf("v3 rolled from v%d to v%d, want v1 to v3", done.GetFromVersion(), done.GetToVersion())
	}
	e.waitRunning(t, "sup-v3", 3)
	for _, pg := range []string{"sup-v1", "sup-v2"} {
		waitFor(t, 10*time.Second, pg+" gone", func() (bool, string) { _, ok := e.desired(t, pg); return !ok, pg + " desired" })
	}

	rb, err := e.nsync.RollbackApp(ctxT(t), &nsyncv1.RollbackAppRequest{AppGuid: "sup"})
	if err != nil {
		t.Fatal(err)
	}
	e.waitState(t, "sup", rb.GetDeployment().GetId(), nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED)
	if got := e.serving(t, "sup"); got.GetVersion() != 4 || got.GetCommand() != "/bin/app --port 8080" {
		t.Errorf("after the rollback: version %d command %q, want v4 with v1's command", got.GetVersion(), got.GetCommand())
	}
}
