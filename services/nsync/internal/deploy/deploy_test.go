package deploy

import (
	"strings"
	"testing"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
)

var t0 = time.UnixMilli(1_000_000)

const (
	running  = nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING
	paused   = nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED
	rolling  = nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_ROLLING
	canary   = nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY
	recreate = nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_RECREATE
)

// dep is a deployment of 4 instances with the given options and counts.
func dep(strategy nsyncv1.DeploymentStrategy, mif int32, newDesired, oldDesired, healthy int32) *nsyncv1.Deployment {
	d := Start("a-d1", "a", 1, 2, 4, WithDefaults(&nsyncv1.DeploymentOptions{Strategy: strategy, MaxInFlight: mif, ProgressDeadlineMs: 60_000}, time.Minute), t0)
	d.NewDesired, d.OldDesired, d.NewHealthy, d.ReadyObserved = newDesired, oldDesired, healthy, healthy
	return d
}

func TestAdvance(t *testing.T) {
	for _, tc := range []struct {
		name               string
		d                  *nsyncv1.Deployment
		o                  Observed
		at                 time.Duration
		newDesired, oldDes int32
		state              nsyncv1.DeploymentState
		outcome            Outcome
		msg                string
	}{
		{name: "rolling starts max_in_flight new instances", d: dep(rolling, 1, 0, 4, 0), o: Observed{Total: 4, OldLeft: 4},
			newDesired: 1, oldDes: 4, state: running},
		{name: "rolling surges 2 with max_in_flight 2", d: dep(rolling, 2, 0, 4, 0), o: Observed{Total: 4, OldLeft: 4},
			newDesired: 2, oldDes: 4, state: running},
		{name: "a ready new instance retires one old", d: dep(rolling, 1, 1, 4, 0), o: Observed{Total: 4, NewReady: 1, OldLeft: 4},
			newDesired: 1, oldDes: 3, state: running},
		{name: "the surge waits while a retired instance drains", d: dep(rolling, 1, 1, 3, 1), o: Observed{Total: 4, NewReady: 1, OldLeft: 4, OldBeyond: 1},
			newDesired: 1, oldDes: 3, state: running},
		{name: "the next new instance starts once the old one is gone", d: dep(rolling, 1, 1, 3, 1), o: Observed{Total: 4, NewReady: 1, OldLeft: 3},
			newDesired: 2, oldDes: 3, state: running},
		{name: "not ready: nothing retires", d: dep(rolling, 1, 2, 3, 1), o: Observed{Total: 4, NewReady: 1, OldLeft: 3},
			newDesired: 2, oldDes: 3, state: running},
		{name: "the last old instance goes", d: dep(rolling, 1, 4, 1, 3), o: Observed{Total: 4, NewReady: 4, OldLeft: 1},
			newDesired: 4, oldDes: 0, state: running},
		{name: "succeeds when all new are healthy and no old left", d: dep(rolling, 1, 4, 0, 4), o: Observed{Total: 4, NewReady: 4},
			newDesired: 4, oldDes: 0, state: nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED, outcome: Succeeded},
		{name: "a crash fails", d: dep(rolling, 1, 1, 4, 0), o: Observed{Total: 4, NewCrashed: 1, CrashReason: "exit 1", OldLeft: 4},
			newDesired: 1, oldDes: 4, state: nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED, outcome: Failed, msg: "crashed: exit 1"},
		{name: "CELL_MISMATCH fails", d: dep(rolling, 1, 1, 4, 0),
			o:          Observed{Total: 4, OldLeft: 4, NewPlacement: &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_CELL_MISMATCH, Message: "0/9 cells"}},
			newDesired: 1, oldDes: 4, state: nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED, outcome: Failed, msg: "CELL_MISMATCH"},
		{name: "INSUFFICIENT_RESOURCES waits for the deadline", d: dep(rolling, 1, 1, 4, 0),
			o:          Observed{Total: 4, OldLeft: 4, NewPlacement: &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES, Message: "full"}},
			newDesired: 1, oldDes: 4, state: running},
		{name: "the deadline fails without progress", d: dep(rolling, 1, 1, 4, 0),
			o:  Observed{Total: 4, OldLeft: 4, NewPlacement: &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES, Message: "full"}},
			at: 61 * time.Second, newDesired: 1, oldDes: 4, state: nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED, outcome: Failed, msg: "INSUFFICIENT_RESOURCES"},
		{name: "canary starts its canaries next to every old instance", d: dep(canary, 1, 0, 4, 0), o: Observed{Total: 4, OldLeft: 4},
			newDesired: 1, oldDes: 4, state: running},
		{name: "canary pauses once healthy", d: dep(canary, 1, 1, 4, 0), o: Observed{Total: 4, NewReady: 1, OldLeft: 4},
			newDesired: 1, oldDes: 4, state: paused, msg: "promote or cancel"},
		{name: "recreate stops every old instance first", d: dep(recreate, 1, 0, 4, 0), o: Observed{Total: 4, OldLeft: 4},
			newDesired: 0, oldDes: 0, state: running},
		{name: "recreate starts all once the old are gone", d: dep(recreate, 1, 0, 0, 0), o: Observed{Total: 4},
			newDesired: 4, oldDes: 0, state: running},
		{name: "a scale-down during a deployment clamps both", d: dep(rolling, 1, 3, 2, 2), o: Observed{Total: 2, NewReady: 3, OldLeft: 2},
			newDesired: 2, oldDes: 0, state: running},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := Advance(tc.d, tc.o, t0.Add(tc.at))
			d := st.Deployment
			if d.GetNewDesired() != tc.newDesired || d.GetOldDesired() != tc.oldDes || d.GetState() != tc.state || st.Outcome != tc.outcome {
				t.Fatalf("got new %d old %d %s outcome %d (%s), want new %d old %d %s outcome %d",
					d.GetNewDesired(), d.GetOldDesired(), d.GetState(), st.Outcome, d.GetMessage(), tc.newDesired, tc.oldDes, tc.state, tc.outcome)
			}
			if !strings.Contains(d.GetMessage(), tc.msg) {
				t.Errorf("message %q, want it to contain %q", d.GetMessage(), tc.msg)
			}
			// Idempotent: the same world again (the retired old instances not gone yet) changes
			// no count.
			o := tc.o
			o.OldBeyond = max(o.OldBeyond, o.OldLeft-d.GetOldDesired())
			again := Advance(d, o, t0.Add(tc.at))
			if again.Scaled {
				t.Errorf("a second Advance with the same observation scaled again: %v", again.Deployment)
			}
		})
	}
}

func TestMinHealthyTime(t *testing.T) {
	d := dep(rolling, 1, 1, 4, 0)
	d.Options.MinHealthyTimeMs = 2000
	o := Observed{Total: 4, NewReady: 1, OldLeft: 4}
	st := Advance(d, o, t0)
	if st.Deployment.GetOldDesired() != 4 || st.Deployment.GetNewHealthy() != 0 {
		t.Fatalf("retired before min_healthy_time: %v", st.Deployment)
	}
	st = Advance(st.Deployment, o, t0.Add(time.Second))
	if st.Deployment.GetOldDesired() != 4 {
		t.Fatalf("retired after 1s of 2s: %v", st.Deployment)
	}
	// It went unready and ready again: the clock restarts.
	st = Advance(st.Deployment, Observed{Total: 4, OldLeft: 4}, t0.Add(1500*time.Millisecond))
	st = Advance(st.Deployment, o, t0.Add(1600*time.Millisecond))
	st = Advance(st.Deployment, o, t0.Add(2500*time.Millisecond))
	if st.Deployment.GetOldDesired() != 4 {
		t.Fatalf("retired although readiness restarted at 1.6s: %v", st.Deployment)
	}
	st = Advance(st.Deployment, o, t0.Add(3700*time.Millisecond))
	if st.Deployment.GetOldDesired() != 3 {
		t.Fatalf("not retired after 2.1s of readiness: %v", st.Deployment)
	}
}

// TestRollingToTheEnd plays a whole rolling deployment of 6 instances with max_in_flight 2 in
// a simulated world where every desired new instance becomes ready at the next step and every
// retired old one is gone at the next step, checking that the ready capacity never falls below
// the app's instances and that new plus old never exceeds it by more than max_in_flight.
func TestRollingToTheEnd(t *testing.T) {
	const total, mif = 6, 2
	d := dep(rolling, mif, 0, total, 0)
	var ready, oldLeft int32 = 0, total
	for i := 0; i < 50; i++ {
		st := Advance(d, Observed{Total: total, NewReady: ready, OldLeft: oldLeft, OldBeyond: oldLeft - d.GetOldDesired()}, t0.Add(time.Duration(i)*time.Second))
		d = st.Deployment
		if st.Outcome == Succeeded {
			if d.GetNewDesired() != total || d.GetOldDesired() != 0 {
				t.Fatalf("succeeded at new %d old %d", d.GetNewDesired(), d.GetOldDesired())
			}
			return
		}
		if st.Outcome != Continue {
			t.Fatalf("ended %d: %s", st.Outcome, d.GetMessage())
		}
		if ready+min(oldLeft, d.GetOldDesired()) < total {
			t.Fatalf("step %d: capacity %d ready new + %d old below %d", i, ready, d.GetOldDesired(), total)
		}
		if d.GetNewDesired()+oldLeft > total+mif {
			t.Fatalf("step %d: %d new + %d old exceed %d + max_in_flight", i, d.GetNewDesired(), oldLeft, total)
		}
		// The world catches up.
		ready, oldLeft = d.GetNewDesired(), d.GetOldDesired()
	}
	t.Fatalf("did not finish: %v", d)
}

func TestRevertSwapsTheVersions(t *testing.T) {
	d := dep(rolling, 2, 3, 2, 1)
	r := Revert("a-d2", d, t0)
	if r.GetFromVersion() != 2 || r.GetToVersion() != 1 || r.GetNewDesired() != 2 || r.GetOldDesired() != 3 || r.GetRevertOf() != "a-d1" || !r.GetOptions().GetNoAutoRevert() {
		t.Fatalf("revert: %v", r)
	}
	// A revert's version is judged by its deadline, not by its old crashes.
	st := Advance(r, Observed{Total: 4, NewReady: 2, NewCrashed: 1, OldLeft: 3}, t0)
	if st.Outcome != Continue {
		t.Fatalf("a revert failed on an old crash: %s", st.Deployment.GetMessage())
	}
}

func TestCancel(t *testing.T) {
	d := dep(canary, 1, 1, 4, 1)
	d.State, d.CancelRequested = paused, true
	st := Advance(d, Observed{Total: 4, NewReady: 1, OldLeft: 4}, t0)
	if st.Outcome != Cancelled || st.Deployment.GetState() != nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED {
		t.Fatalf("cancel: %d %v", st.Outcome, st.Deployment)
	}
}

func TestChangedMeansRecord(t *testing.T) {
	st := Advance(dep(rolling, 1, 0, 4, 0), Observed{Total: 4, OldLeft: 4}, t0)
	if !st.Changed || !st.Scaled {
		t.Fatalf("a step that scaled reports changed %v scaled %v", st.Changed, st.Scaled)
	}
	if st = Advance(st.Deployment, Observed{Total: 4, OldLeft: 4}, t0); st.Changed {
		t.Fatalf("the same world again reports a change: %v", st.Deployment)
	}
}
