package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
)

// TestRollingDeployUnderLoad rolls new versions of a routed 4-instance app (real processes on
// cells 1–4, a BBS with a 1 s drain window) out through nsync while a request loop runs through
// the router, and counts failed requests in every phase (the BBS stops every retired instance
// drain-first, so there must be none):
//
//  1. a rolling deploy of a version whose instances take 2 s to become ready: it succeeds, every
//     instance runs the new version and every answer afterwards comes from it;
//  2. a deploy of a version that crashes at start: the deployment fails and reverts, and the
//     serving version keeps answering;
//  3. a canary: it pauses with one new instance answering among the old ones; cancel removes it
//     and only the serving version answers;
//  4. a canary promoted: the rollout continues from the pause and every answer afterwards comes
//     from the promoted version.
func TestRollingDeployUnderLoad(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const host = "roll.e2e.local"
	a := webApp("roll", "space-d", c.hello, host, 4)
	c.routedApp(t, ctx, a, host)

	l := testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	a.Env = map[string]string{"RELEASE": "2", "READY_DELAY": "2s"}
	resp, err := c.nsync.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: a, Options: &nsyncv1.DeploymentOptions{MaxInFlight: 1}})
	if err != nil || resp.GetDeployment() == nil {
		t.Fatalf("DeployApp: %v %v", resp, err)
	}
	id := resp.GetDeployment().GetId()
	c.waitFor(t, 90*time.Second, "the deployment to succeed", func() (bool, string) {
		d, err := c.nsync.GetDeployment(ctx, &nsyncv1.GetDeploymentRequest{AppGuid: "roll"})
		return err == nil && d.GetDeployment().GetId() == id && d.GetDeployment().GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED, fmt.Sprint(d, err)
	})
	ok, failed, first := l.Finish()
	t.Logf("through the router during the rollout: %d ok, %d failed (first: %s)", ok, failed, first)
	if failed > 0 {
		t.Errorf("%d of %d requests failed during the rollout (first: %s), want none", failed, ok+failed, first)
	}
	running := c.waitRunning(t, "roll-v2", 4, 30*time.Second)
	within(t, "roll v2", cellsOf(running), 1, 2, 3, 4)
	c.waitFor(t, 20*time.Second, "roll-v1 gone", func() (bool, string) {
		return len(c.actualLRPs(t, "roll-v1")) == 0, fmt.Sprint(len(c.actualLRPs(t, "roll-v1")), " v1 instances")
	})
	if got := releases(t, c.router, host, 40); len(got) != 1 || got["2"] == 0 {
		t.Errorf("answers after the rollout by release: %v, want release 2 only", got)
	}

	// 2. A version that crashes at start fails, reverts, and the serving version keeps answering.
	l = testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	crashing := proto.Clone(a).(*nsyncv1.App)
	crashing.Command = "/bin/false"
	resp, err = c.nsync.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: crashing, Options: &nsyncv1.DeploymentOptions{ProgressDeadlineMs: 20000}})
	if err != nil || resp.GetDeployment() == nil {
		t.Fatalf("DeployApp of a crashing version: %v %v", resp, err)
	}
	failedID := resp.GetDeployment().GetId()
	c.waitFor(t, 60*time.Second, "the crashing version's deployment to fail and its revert to succeed", func() (bool, string) {
		ds, err := c.nsync.ListDeployments(ctx, &nsyncv1.ListDeploymentsRequest{AppGuid: "roll"})
		if err != nil {
			return false, err.Error()
		}
		var failedSeen, reverted bool
		for _, d := range ds.GetDeployments() {
			failedSeen = failedSeen || (d.GetId() == failedID && d.GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED)
			reverted = reverted || (d.GetRevertOf() == failedID && d.GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED)
		}
		return failedSeen && reverted, fmt.Sprint(ds.GetDeployments())
	})
	ok, failed, first = l.Finish()
	t.Logf("through the router during the failed deploy and its revert: %d ok, %d failed (first: %s)", ok, failed, first)
	if failed > 0 {
		t.Errorf("%d of %d requests failed during the failed deploy and its revert (first: %s), want none", failed, ok+failed, first)
	}
	if got := releases(t, c.router, host, 40); len(got) != 1 || got["2"] == 0 {
		t.Errorf("answers after the revert by release: %v, want release 2 only", got)
	}

	// 3. A canary pauses with one new instance among the old; cancel takes it away.
	l = testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	canary := proto.Clone(a).(*nsyncv1.App)
	canary.Env = map[string]string{"RELEASE": "4"}
	resp, err = c.nsync.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: canary, Options: &nsyncv1.DeploymentOptions{
		Strategy: nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY, Canaries: 1}})
	if err != nil || resp.GetDeployment() == nil {
		t.Fatalf("DeployApp of a canary: %v %v", resp, err)
	}
	canaryID := resp.GetDeployment().GetId()
	c.waitFor(t, 60*time.Second, "the canary to pause", func() (bool, string) {
		d, err := c.nsync.GetDeployment(ctx, &nsyncv1.GetDeploymentRequest{AppGuid: "roll"})
		return err == nil && d.GetDeployment().GetId() == canaryID && d.GetDeployment().GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED, fmt.Sprint(d, err)
	})
	c.waitFor(t, 20*time.Second, "the canary answering among the old instances", func() (bool, string) {
		got := releases(t, c.router, host, 40)
		return got["4"] > 0 && got["2"] > 0, fmt.Sprint(got)
	})
	if _, err := c.nsync.CancelDeployment(ctx, &nsyncv1.CancelDeploymentRequest{AppGuid: "roll"}); err != nil {
		t.Fatalf("CancelDeployment: %v", err)
	}
	c.waitFor(t, 60*time.Second, "the canary's removal", func() (bool, string) {
		d, err := c.nsync.GetDeployment(ctx, &nsyncv1.GetDeploymentRequest{AppGuid: "roll"})
		done := err == nil && d.GetDeployment().GetRevertOf() == canaryID && d.GetDeployment().GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED
		return done, fmt.Sprint(d, err)
	})
	ok, failed, first = l.Finish()
	t.Logf("through the router during the canary and its cancel: %d ok, %d failed (first: %s)", ok, failed, first)
	if failed > 0 {
		t.Errorf("%d of %d requests failed during the canary and its cancel (first: %s), want none", failed, ok+failed, first)
	}
	if got := releases(t, c.router, host, 40); len(got) != 1 || got["2"] == 0 {
		t.Errorf("answers after the cancel by release: %v, want release 2 only", got)
	}

	// 4. A canary that is promoted rolls on to every instance.
	l = testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	canary.Env = map[string]string{"RELEASE": "5"}
	resp, err = c.nsync.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: canary, Options: &nsyncv1.DeploymentOptions{
		Strategy: nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY, Canaries: 1}})
	if err != nil || resp.GetDeployment() == nil {
		t.Fatalf("DeployApp of a second canary: %v %v", resp, err)
	}
	canaryID = resp.GetDeployment().GetId()
	c.waitFor(t, 60*time.Second, "the second canary to pause", func() (bool, string) {
		d, err := c.nsync.GetDeployment(ctx, &nsyncv1.GetDeploymentRequest{AppGuid: "roll"})
		return err == nil && d.GetDeployment().GetId() == canaryID && d.GetDeployment().GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED, fmt.Sprint(d, err)
	})
	if _, err := c.nsync.PromoteDeployment(ctx, &nsyncv1.PromoteDeploymentRequest{AppGuid: "roll"}); err != nil {
		t.Fatalf("PromoteDeployment: %v", err)
	}
	c.waitFor(t, 90*time.Second, "the promoted canary to complete", func() (bool, string) {
		d, err := c.nsync.GetDeployment(ctx, &nsyncv1.GetDeploymentRequest{AppGuid: "roll"})
		return err == nil && d.GetDeployment().GetId() == canaryID && d.GetDeployment().GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED, fmt.Sprint(d, err)
	})
	ok, failed, first = l.Finish()
	t.Logf("through the router during the promoted canary: %d ok, %d failed (first: %s)", ok, failed, first)
	if failed > 0 {
		t.Errorf("%d of %d requests failed during the promoted canary (first: %s), want none", failed, ok+failed, first)
	}
	if got := releases(t, c.router, host, 40); len(got) != 1 || got["5"] == 0 {
		t.Errorf("answers after the promotion by release: %v, want release 5 only", got)
	}
}

// TestDeployKeepsTheAppSpread rolls a new version of a 6-instance app over three zones (the
// staging cells: two in z0, one each in z1 and z2) one instance at a time, and follows the BBS's
// event stream at every store revision: the app's running instances, both versions counted,
// are never more than one apart between zones (decision 0037), and no request through the
// router fails.
func TestDeployKeepsTheAppSpread(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const host = "spread.e2e.local"
	a := webApp("spread", "space-s", c.hello, host, 6)
	c.routedApp(t, ctx, a, host)

	s := testkit.SampleRollout(t, c.bbs, "spread", "spread-v2")
	l := testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	a.Env = map[string]string{"RELEASE": "2"}
	resp, err := c.nsync.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: a, Options: &nsyncv1.DeploymentOptions{MaxInFlight: 1}})
	if err != nil || resp.GetDeployment() == nil {
		t.Fatalf("DeployApp: %v %v", resp, err)
	}
	id := resp.GetDeployment().GetId()
	c.waitFor(t, 120*time.Second, "the deployment to succeed", func() (bool, string) {
		d, err := c.nsync.GetDeployment(ctx, &nsyncv1.GetDeploymentRequest{AppGuid: "spread"})
		return err == nil && d.GetDeployment().GetId() == id && d.GetDeployment().GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED, fmt.Sprint(d, err)
	})
	c.waitRunning(t, "spread-v2", 6, 30*time.Second)
	s.End()
	ok, failed, first := l.Finish()
	t.Logf("%d samples: zone skew of every instance %d (%s), of the new version %d; through the router %d ok, %d failed (first: %s)",
		s.Samples, s.MaxSkewAll, s.WorstAll, s.MaxSkewNew, ok, failed, first)
	for n := 1; n <= 6; n++ {
		if !s.NewRunning[n] {
			t.Errorf("no sample saw %d new instances running (seen %v): the sampler missed a step", n, s.NewRunning)
		}
	}
	if s.MaxSkewAll > 1 {
		t.Errorf("the app's instances were %d apart between zones at some step (%s), want at most 1", s.MaxSkewAll, s.WorstAll)
	}
	if failed > 0 {
		t.Errorf("%d of %d requests failed during the rollout (first: %s), want none", failed, ok+failed, first)
	}
}

// routedApp binds a's space to a "staging" pool (cells 1–4, real processes), desires a (version
// 1) and waits until its instances run and the router answers for host without a failure. It
// returns the running instances by index.
func (c *nsyncCluster) routedApp(t *testing.T, ctx context.Context, a *nsyncv1.App, host string) []*modelsv1.ActualLRP {
	t.Helper()
	if _, err := c.nsync.CreatePlacementPool(ctx, &nsyncv1.CreatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{Name: "staging", Require: []string{"staging"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nsync.BindPlacementPool(ctx, &nsyncv1.BindPlacementPoolRequest{SpaceGuid: a.GetSpaceGuid(), Pool: "staging"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: a}); err != nil {
		t.Fatal(err)
	}
	running := c.waitRunning(t, a.GetGuid()+"-v1", int(a.GetInstances()), 30*time.Second)
	c.waitFor(t, 20*time.Second, "the router to route "+a.GetGuid(), func() (bool, string) {
		l := testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		ok, failed, first := l.Finish()
		return ok > 0 && failed == 0, fmt.Sprintf("%d ok, %d failed (%s)", ok, failed, first)
	})
	return running
}

// releases sends n requests for host through the router and counts the answers by the release
// the sample app names ("" for none); a failed request fails the test.
func releases(t *testing.T, router, host string, n int) map[string]int {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	out := map[string]int{}
	for range n {
		body, err := testkit.GetThroughRouter(client, router, host)
		if err != nil {
			t.Fatalf("request through the router: %v", err)
		}
		_, rel, _ := strings.Cut(string(body), ", release ")
		rel, _, _ = strings.Cut(rel, ")")
		out[rel]++
	}
	return out
}
