package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/nsync"
)

// deployments lists app guid's deployments (active, queued and finished) through client.
func deployments(ctx context.Context, client nsyncv1.NsyncServiceClient, guid string) ([]*nsyncv1.Deployment, error) {
	resp, err := client.ListDeployments(ctx, &nsyncv1.ListDeploymentsRequest{AppGuid: guid})
	return resp.GetDeployments(), err
}

// deployState is the state of deployment id among ds and whether a revert of it succeeded.
func deployState(ds []*nsyncv1.Deployment, id string) (state nsyncv1.DeploymentState, reverted bool) {
	for _, d := range ds {
		if d.GetId() == id {
			state = d.GetState()
		}
		reverted = reverted || (d.GetRevertOf() == id && d.GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED)
	}
	return state, reverted
}

// describeDeployments is ds in one line for failure messages.
func describeDeployments(ds []*nsyncv1.Deployment) string {
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%s v%d→v%d %s (new %d/%d healthy, old %d, revert of %q): %s", d.GetId(), d.GetFromVersion(), d.GetToVersion(),
			strings.TrimPrefix(d.GetState().String(), "DEPLOYMENT_STATE_"), d.GetNewHealthy(), d.GetNewDesired(), d.GetOldDesired(), d.GetRevertOf(), d.GetMessage()))
	}
	return strings.Join(out, "; ")
}

// deploy starts a deployment of a and returns its id.
func deploy(t *testing.T, ctx context.Context, client nsyncv1.NsyncServiceClient, a *nsyncv1.App, opts *nsyncv1.DeploymentOptions) string {
	t.Helper()
	resp, err := client.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: a, Options: opts})
	if err != nil || resp.GetDeployment() == nil {
		t.Fatalf("DeployApp: %v %v", resp, err)
	}
	return resp.GetDeployment().GetId()
}

// appInstances counts the app's instance records (every version, every presence) by process
// guid.
func (c *nsyncCluster) appInstances(t *testing.T, guids ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, g := range guids {
		out[g] = len(c.actualLRPs(t, g))
	}
	return out
}

// TestDeployCellMismatchKeepsServing deploys a version whose stack no cell has: the deployment
// fails at once with CELL_MISMATCH, which `gavel apps` shows on the app, the version serving
// before keeps every instance and no request through the router fails.
func TestDeployCellMismatchKeepsServing(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const host = "mismatch.e2e.local"
	a := webApp("mis", "space-d", c.hello, host, 3)
	c.routedApp(t, ctx, a, host)

	l := testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	bad := webApp("mis", "space-d", c.hello, host, 3)
	bad.Stack, bad.Env = "cflinuxfs3", map[string]string{"RELEASE": "2"} // nsync knows the stack; no cell preloads it
	id := deploy(t, ctx, c.nsync, bad, nil)
	c.waitFor(t, 60*time.Second, "the deployment to fail with CELL_MISMATCH and the old version to be alone again", func() (bool, string) {
		ds, err := deployments(ctx, c.nsync, "mis")
		if err != nil {
			return false, err.Error()
		}
		state, reverted := deployState(ds, id)
		v2 := len(c.actualLRPs(t, "mis-v2"))
		return state == nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED && reverted && v2 == 0,
			fmt.Sprintf("%s; %d mis-v2 instances", describeDeployments(ds), v2)
	})
	ok, failed, first := l.Finish()
	t.Logf("through the router during the failed deploy: %d ok, %d failed (first: %s)", ok, failed, first)
	if failed > 0 || ok == 0 {
		t.Errorf("%d of %d requests failed while the new version could not be placed (first: %s), want none", failed, ok+failed, first)
	}

	apps, err := c.nsync.Apps(ctx, &nsyncv1.AppsRequest{Guids: []string{"mis"}})
	if err != nil || len(apps.GetApps()) != 1 {
		t.Fatalf("Apps: %v %v", apps, err)
	}
	info := apps.GetApps()[0]
	if info.GetPlacementError().GetCode() != modelsv1.PlacementError_CODE_CELL_MISMATCH || info.GetApp().GetVersion() != 1 || info.GetRunning() != 3 {
		t.Errorf("app after the failed deploy: version %d, %d running, error %v; want version 1, 3 running, CELL_MISMATCH",
			info.GetApp().GetVersion(), info.GetRunning(), info.GetPlacementError())
	}
	out, err := exec.Command(binary(t, "gavel"), "--nsync", c.nsyncAddr, "--insecure", "apps", "mis").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CELL_MISMATCH") || !strings.Contains(string(out), "cflinuxfs3") {
		t.Errorf("gavel apps mis: %v\n%s\nwant the app's CELL_MISMATCH naming the rootfs", err, out)
	}
	if got := releases(t, c.router, host, 30); len(got) != 1 || got[""] == 0 {
		t.Errorf("answers after the failed deploy by release: %v, want the first version's only", got)
	}
}

// TestDeployResumesAfterLeaderKilled runs two nsync processes and kills the leading one with
// SIGKILL in the middle of a rolling deployment: the other takes the leadership and finishes
// it; at the end exactly the desired instances run, all of the new version, and no request
// through the router failed.
func TestDeployResumesAfterLeaderKilled(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	addrs := []string{c.nsyncAddr, testkit.ReservedAddr(t)}
	second := slices.Clone(c.nsyncArgs)
	second[slices.Index(second, "-listen")+1] = addrs[1]
	c.procs = append(c.procs, startProc(t, "nsync 2", binary(t, "nsync"), second...))
	clients := []nsyncv1.NsyncServiceClient{c.nsync, dialNsync(t, addrs[1])}
	c.waitFor(t, 30*time.Second, "the second nsync to answer", func() (bool, string) {
		_, err := clients[1].PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
		return err == nil, fmt.Sprint(err)
	})

	const host = "resume.e2e.local"
	a := webApp("resume", "space-d", c.hello, host, 4)
	c.routedApp(t, ctx, a, host)
	l := testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	a.Env = map[string]string{"RELEASE": "2", "READY_DELAY": "1s"}
	id := deploy(t, ctx, c.nsync, a, &nsyncv1.DeploymentOptions{MaxInFlight: 1})
	c.waitFor(t, 60*time.Second, "the deployment half way (one new instance healthy)", func() (bool, string) {
		ds, err := deployments(ctx, c.nsync, "resume")
		if err != nil || len(ds) == 0 {
			return false, fmt.Sprint(err)
		}
		return ds[0].GetId() == id && ds[0].GetNewHealthy() >= 1 && ds[0].GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING, describeDeployments(ds)
	})
	leader := -1
	c.waitFor(t, 10*time.Second, "an nsync leader", func() (bool, string) {
		leader = nsyncLeader(ctx, c.etcd, addrs)
		return leader >= 0, "no leader key naming either address"
	})
	names := []string{"nsync", "nsync 2"}
	ds, _ := deployments(ctx, c.nsync, "resume")
	t.Logf("killing the leader %s (%s) at %s", names[leader], addrs[leader], describeDeployments(ds))
	c.kill(t, names[leader])
	other := clients[1-leader]

	c.waitFor(t, 90*time.Second, "the other nsync to finish the deployment", func() (bool, string) {
		ds, err := deployments(ctx, other, "resume")
		if err != nil {
			return false, err.Error()
		}
		state, _ := deployState(ds, id)
		return state == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED, describeDeployments(ds)
	})
	if l := nsyncLeader(ctx, c.etcd, addrs); l != 1-leader {
		t.Errorf("leader after the kill: %d, want the survivor %d", l, 1-leader)
	}
	running := c.waitRunning(t, "resume-v2", 4, 30*time.Second)
	c.waitFor(t, 30*time.Second, "only the new version's 4 instances", func() (bool, string) {
		n := c.appInstances(t, "resume-v1", "resume-v2", "resume-v3")
		return n["resume-v1"] == 0 && n["resume-v2"] == 4 && n["resume-v3"] == 0, fmt.Sprint(n)
	})
	within(t, "resume v2", cellsOf(running), 1, 2, 3, 4)
	ok, failed, first := l.Finish()
	t.Logf("through the router during the rollout and the failover: %d ok, %d failed (first: %s)", ok, failed, first)
	if failed > 0 {
		t.Errorf("%d of %d requests failed (first: %s), want none", failed, ok+failed, first)
	}
	if got := releases(t, c.router, host, 30); len(got) != 1 || got["2"] == 0 {
		t.Errorf("answers after the deployment by release: %v, want release 2 only", got)
	}
	apps, err := other.Apps(ctx, &nsyncv1.AppsRequest{Guids: []string{"resume"}})
	if err != nil || len(apps.GetApps()) != 1 || apps.GetApps()[0].GetApp().GetVersion() != 2 || apps.GetApps()[0].GetDesired() != 4 {
		t.Errorf("app after the failover: %v %v, want version 2 with 4 desired", apps, err)
	}
}

// TestDeployWhenTheNewInstancesCellIsKilled kills (SIGKILL) the rep of the cell that holds the
// only new instance in the middle of a rolling deployment. The deployment must end either way —
// the instance replaced on another cell and the deployment succeeded, or the deployment failed
// and its revert succeeded — within a bounded wait (the progress deadline is 20 s), never hang;
// at the end the app runs its 3 instances of one version, none on the dead cell.
func TestDeployWhenTheNewInstancesCellIsKilled(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const host = "lost.e2e.local"
	start := time.Now()
	a := webApp("lost", "space-d", c.hello, host, 3)
	c.routedApp(t, ctx, a, host)
	a.Env = map[string]string{"RELEASE": "2", "READY_DELAY": "2s"} // the new instance stays unready a while
	id := deploy(t, ctx, c.nsync, a, &nsyncv1.DeploymentOptions{MaxInFlight: 1, ProgressDeadlineMs: 20_000})
	var cell string
	c.waitFor(t, 30*time.Second, "the first new instance on a cell, and the only one", func() (bool, string) {
		var states []string
		news := c.actualLRPs(t, "lost-v2")
		for _, in := range news {
			states = append(states, fmt.Sprintf("%d:%s@%s", in.GetKey().GetIndex(), in.GetState(), in.GetInstanceKey().GetCellId()))
			if s := in.GetState(); (s == modelsv1.ActualLRP_STATE_CLAIMED || s == modelsv1.ActualLRP_STATE_RUNNING) && in.GetKey().GetIndex() == 0 {
				cell = in.GetInstanceKey().GetCellId()
			}
		}
		if len(news) > 1 {
			t.Fatalf("the rollout went past its first new instance before the test saw it placed: %s", strings.Join(states, ", "))
		}
		return cell != "", strings.Join(states, ", ")
	})
	ds, _ := deployments(ctx, c.nsync, "lost")
	t.Logf("%s: killing rep %s, which holds lost-v2/0, at %s", time.Since(start).Round(time.Millisecond), cell, describeDeployments(ds))
	c.killCell(t, cell)
	killed := time.Now()

	var outcome string
	c.waitFor(t, 90*time.Second, "the deployment to succeed, or to fail and be reverted, after its cell died", func() (bool, string) {
		ds, err := deployments(ctx, c.nsync, "lost")
		if err != nil {
			return false, err.Error()
		}
		switch state, reverted := deployState(ds, id); {
		case state == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED:
			outcome = "succeeded"
		case state == nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED && reverted:
			outcome = "reverted"
		}
		return outcome != "", describeDeployments(ds)
	})
	want, gone := "lost-v2", "lost-v1"
	if outcome == "reverted" {
		want, gone = gone, want
	}
	t.Logf("the deployment %s %s after the kill", outcome, time.Since(killed).Round(time.Millisecond))
	running := c.waitRunning(t, want, 3, 30*time.Second)
	c.waitFor(t, 30*time.Second, "only "+want+"'s instances", func() (bool, string) {
		n := c.appInstances(t, want, gone)
		return n[gone] == 0 && n[want] == 3, fmt.Sprint(n)
	})
	for _, in := range running {
		if in.GetInstanceKey().GetCellId() == cell {
			t.Errorf("%s/%d runs on the killed cell %s", want, in.GetKey().GetIndex(), cell)
		}
	}
	within(t, want, cellsOf(running), 1, 2, 3, 4)
}

// TestRepEvacuationUnderLoad drains (SIGTERM) the rep of a cell holding an instance of a routed
// app while requests run through the router: the instances move to the other cells and no
// request fails (TestRepEvacuatesOnSIGTERM checks the records on sim cells; this one counts
// what clients see).
func TestRepEvacuationUnderLoad(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const host = "evac.e2e.local"
	a := webApp("evac", "space-d", c.hello, host, 4)
	running := c.routedApp(t, ctx, a, host)
	cell := running[0].GetInstanceKey().GetCellId()
	var p *proc
	for _, q := range c.procs {
		if q.Name == "rep "+cell {
			p = q
		}
	}
	if p == nil {
		t.Fatalf("no rep process for %s", cell)
	}

	l := testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	if err := syscall.Kill(p.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited:
	case <-time.After(45 * time.Second):
		t.Fatalf("rep %s still running 45s after SIGTERM", cell)
	}
	c.procs = slices.DeleteFunc(c.procs, func(q *proc) bool { return q == p })
	if p.Err != nil {
		t.Errorf("rep %s exited with %v after SIGTERM, want a clean exit", cell, p.Err)
	}
	moved := c.waitRunning(t, "evac-v1", 4, 30*time.Second)
	for _, in := range moved {
		if in.GetInstanceKey().GetCellId() == cell {
			t.Errorf("evac-v1/%d still on the drained cell %s", in.GetKey().GetIndex(), cell)
		}
	}
	// A few more requests once everything moved, so that the loop has crossed the whole drain.
	releases(t, c.router, host, 10)
	ok, failed, first := l.Finish()
	t.Logf("through the router during the evacuation of %s: %d ok, %d failed (first: %s)", cell, ok, failed, first)
	if failed > 0 || ok == 0 {
		t.Errorf("%d of %d requests failed during the evacuation (first: %s), want none", failed, ok+failed, first)
	}
}

// killCell kills a cell as a machine dies: SIGKILL to its rep and to every process the rep
// started (the process backend starts instances in their own process groups, so they would
// outlive the rep), found as the rep's descendants before the kill.
func (c *nsyncCluster) killCell(t *testing.T, cell string) {
	t.Helper()
	i := slices.IndexFunc(c.procs, func(p *proc) bool { return p.Name == "rep "+cell })
	if i < 0 {
		t.Fatalf("no rep process for %s", cell)
	}
	children := descendants(c.procs[i].Pid)
	c.kill(t, "rep "+cell)
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL) // gone already is fine
	}
}

// descendants lists the processes descending from pid, read from /proc.
func descendants(pid int) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(fields[1]); err == nil {
			parent[p] = pp
		}
	}
	var out []int
	for changed := true; changed; {
		changed = false
		for p, pp := range parent {
			if (pp == pid || slices.Contains(out, pp)) && !slices.Contains(out, p) {
				out = append(out, p)
				changed = true
			}
		}
	}
	return out
}

// dialNsync is a plaintext nsync client of addr, closed when the test ends.
func dialNsync(t *testing.T, addr string) nsyncv1.NsyncServiceClient {
	t.Helper()
	conn, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return nsyncv1.NewNsyncServiceClient(conn)
}

// nsyncLeader is the index in addrs of the nsync that holds the leadership, from the election's
// first key (whose value names the leader's listen address); -1 when none does.
func nsyncLeader(ctx context.Context, etcd *clientv3.Client, addrs []string) int {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := etcd.Get(ctx, etcdx.LockKey(nsync.LeaderService)+"/", append(clientv3.WithFirstCreate(), clientv3.WithLimit(1))...)
	if err != nil || len(resp.Kvs) == 0 {
		return -1
	}
	v := string(resp.Kvs[0].Value)
	for i, addr := range addrs {
		if v == addr || strings.HasSuffix(v, "/"+addr) || strings.Contains(v, "/"+addr+"/") {
			return i
		}
	}
	return -1
}
