package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

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
//     and only the serving version answers.
func TestRollingDeployUnderLoad(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := c.nsync.CreatePlacementPool(ctx, &nsyncv1.CreatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{Name: "staging", Require: []string{"staging"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nsync.BindPlacementPool(ctx, &nsyncv1.BindPlacementPoolRequest{SpaceGuid: "space-d", Pool: "staging"}); err != nil {
		t.Fatal(err)
	}
	const host = "roll.e2e.local"
	a := webApp("roll", "space-d", c.hello, host, 4)
	if _, err := c.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: a}); err != nil {
		t.Fatal(err)
	}
	c.waitRunning(t, "roll-v1", 4, 30*time.Second)
	c.waitFor(t, 20*time.Second, "the router to route roll", func() (bool, string) {
		l := startLoad(c.router, host)
		time.Sleep(50 * time.Millisecond)
		ok, failed, first := l.finish()
		return ok > 0 && failed == 0, fmt.Sprintf("%d ok, %d failed (%s)", ok, failed, first)
	})

	l := startLoad(c.router, host)
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
	ok, failed, first := l.finish()
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
	l = startLoad(c.router, host)
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
	ok, failed, first = l.finish()
	t.Logf("through the router during the failed deploy and its revert: %d ok, %d failed (first: %s)", ok, failed, first)
	if failed > 0 {
		t.Errorf("%d of %d requests failed during the failed deploy and its revert (first: %s), want none", failed, ok+failed, first)
	}
	if got := releases(t, c.router, host, 40); len(got) != 1 || got["2"] == 0 {
		t.Errorf("answers after the revert by release: %v, want release 2 only", got)
	}

	// 3. A canary pauses with one new instance among the old; cancel takes it away.
	l = startLoad(c.router, host)
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
	ok, failed, first = l.finish()
	t.Logf("through the router during the canary and its cancel: %d ok, %d failed (first: %s)", ok, failed, first)
	if failed > 0 {
		t.Errorf("%d of %d requests failed during the canary and its cancel (first: %s), want none", failed, ok+failed, first)
	}
	if got := releases(t, c.router, host, 40); len(got) != 1 || got["2"] == 0 {
		t.Errorf("answers after the cancel by release: %v, want release 2 only", got)
	}
}

// releases sends n requests for host through the router and counts the answers by the release
// the sample app names ("" for none); a failed request fails the test.
func releases(t *testing.T, router, host string, n int) map[string]int {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	out := map[string]int{}
	for range n {
		req, _ := http.NewRequest(http.MethodGet, "http://"+router+"/", nil)
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request through the router: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request through the router: %s: %s", resp.Status, body)
		}
		_, rel, _ := strings.Cut(string(body), ", release ")
		rel, _, _ = strings.Cut(rel, ")")
		out[rel]++
	}
	return out
}
