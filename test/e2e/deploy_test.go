package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
)

// TestRollingDeployUnderLoad rolls a new version of a routed 4-instance app (real processes on
// cells 1–4) out through nsync while a request loop runs through the router, and checks that
// the deployment succeeds, every instance runs the new version, and that no request failed (the
// BBS stops every retired instance drain-first).
func TestRollingDeployUnderLoad(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
	a.Env = map[string]string{"RELEASE": "2"}
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
}
