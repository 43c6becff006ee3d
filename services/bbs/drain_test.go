package bbs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// stopCall is one StopLRPInstance a recordingRep received.
type stopCall struct {
	guid  string
	index int32
	cell  string
}

// recordingRep records the stops the BBS asks for (the rep's part, stopping the container and
// removing the record, is tested in services/rep).
type recordingRep struct{ stops chan stopCall }

func newRecordingRep() *recordingRep { return &recordingRep{stops: make(chan stopCall, 64)} }

func (r *recordingRep) StopLRPInstance(_ context.Context, cell *modelsv1.CellPresence, key *modelsv1.ActualLRPKey, _ *modelsv1.ActualLRPInstanceKey) error {
	r.stops <- stopCall{guid: key.GetProcessGuid(), index: key.GetIndex(), cell: cell.GetCellId()}
	return nil
}

func (r *recordingRep) CancelTask(context.Context, *modelsv1.CellPresence, string) error { return nil }

// next waits for the next stop (the test's deadline bounds it).
func (r *recordingRep) next(t *testing.T) stopCall {
	t.Helper()
	select {
	case s := <-r.stops:
		return s
	case <-ctxT(t).Done():
		t.Fatal("no stop requested")
	}
	return stopCall{}
}

// none fails if a stop has been requested.
func (r *recordingRep) none(t *testing.T, when string) {
	t.Helper()
	select {
	case s := <-r.stops:
		t.Fatalf("%s: stop of %s/%d requested", when, s.guid, s.index)
	default:
	}
}

// report is a route-emitter reporting that it has published revision.
func report(t *testing.T, env *bbstest.Env, emitter string, revision int64) {
	t.Helper()
	if _, err := env.Client.ReportRoutesPublished(ctxT(t), &bbsv1.ReportRoutesPublishedRequest{EmitterId: emitter, Revision: revision}); err != nil {
		t.Fatalf("report %s at %d: %v", emitter, revision, err)
	}
}

// drainEnv runs a BBS whose reps are r, with guid's instances 0..n-1 RUNNING and routable on
// cell-a and a route-emitter "e1" that has reported the current revision.
func drainEnv(t *testing.T, r *recordingRep, guid string, n int32, configure ...func(*bbs.Config)) *bbstest.Env {
	t.Helper()
	env := bbstest.StartWith(t, []bbs.Option{bbs.WithManualConvergence(), bbs.WithCellClient(r)}, configure...)
	drainSetup(t, env, guid, n)
	return env
}

func drainSetup(t *testing.T, env *bbstest.Env, guid string, n int32) {
	t.Helper()
	lrpRegisterCell(t, env, "cell-a", "z1")
	lrpDesire(t, env, guid, n)
	for i := range n {
		ik := lrpInstKey(fmt.Sprintf("%s-%d", guid, i), "cell-a")
		lrpClaim(t, env, guid, i, ik)
		lrpStart(t, env, guid, i, ik, lrpNetInfo(61000+uint32(i)))
	}
	report(t, env, "e1", lrpRevision(t, env))
}

func scaleTo(t *testing.T, env *bbstest.Env, guid string, n int32) int64 {
	t.Helper()
	resp, err := env.Client.UpdateDesiredLRP(ctxT(t), &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: guid, Update: &modelsv1.DesiredLRPUpdate{Instances: &n}})
	if err != nil {
		t.Fatalf("scale %s to %d: %v", guid, n, err)
	}
	return resp.GetRevision()
}

func wantDraining(t *testing.T, a *modelsv1.ActualLRP) {
	t.Helper()
	if a == nil || a.GetState() != lrpRunning || a.GetRoutable() || a.GetDrainingSince() == nil {
		t.Fatalf("record %v, want RUNNING, not routable, draining", a)
	}
}

// TestScaleDownDrainsFirst: a scale-down withdraws the extra RUNNING instance from routing in
// the update's transaction and asks its rep to stop it only once the route-emitter reports
// having published that revision; the kept instance is untouched.
func TestScaleDownDrainsFirst(t *testing.T) {
	rep := newRecordingRep()
	env := drainEnv(t, rep, "web", 2, func(c *bbs.Config) { c.DrainTimeout = bbs.Duration(time.Hour) })
	kept := lrpStored(t, env, "web", 0, lrpOrdinary)

	rev := scaleTo(t, env, "web", 1)
	wantDraining(t, lrpStored(t, env, "web", 1, lrpOrdinary))
	if now := lrpStored(t, env, "web", 0, lrpOrdinary); !proto.Equal(now, kept) {
		t.Fatalf("kept instance changed: %v, was %v", now, kept)
	}
	rep.none(t, "before the route-emitter published the drain")

	// A report of an older revision is not enough (the stop cannot have been asked for: it
	// waits for the drain's revision, and the drain timeout is an hour).
	report(t, env, "e1", rev-1)
	rep.none(t, "after a report older than the drain")

	report(t, env, "e1", rev)
	if s := rep.next(t); s != (stopCall{"web", 1, "cell-a"}) {
		t.Fatalf("stop %+v, want web/1 on cell-a", s)
	}
	// The rep re-reporting the draining instance (readiness) does not route it again.
	_, err := env.Client.StartActualLRP(ctxT(t), &bbsv1.StartActualLRPRequest{ProcessGuid: "web", Index: 1,
		InstanceKey: lrpInstKey("web-1", "cell-a"), NetInfo: lrpNetInfo(61001), Routable: true})
	if err != nil {
		t.Fatal(err)
	}
	wantDraining(t, lrpStored(t, env, "web", 1, lrpOrdinary))
}

// TestDrainTimeoutBoundsTheWait: a route-emitter that never reports the drain holds the stop
// for drain_timeout only.
func TestDrainTimeoutBoundsTheWait(t *testing.T) {
	rep := newRecordingRep()
	env := drainEnv(t, rep, "web", 1, func(c *bbs.Config) { c.DrainTimeout = bbs.Duration(200 * time.Millisecond) })
	if _, err := env.Client.RetireActualLRP(ctxT(t), &bbsv1.RetireActualLRPRequest{ProcessGuid: "web", Index: 0}); err != nil {
		t.Fatal(err)
	}
	wantDraining(t, lrpStored(t, env, "web", 0, lrpOrdinary))
	if s := rep.next(t); s != (stopCall{"web", 0, "cell-a"}) {
		t.Fatalf("stop %+v, want web/0 on cell-a", s)
	}
}

// TestRemoveAndScaleUpWhileDraining: RemoveDesiredLRP drains its routed instances; an instance
// still draining from a scale-down is routed again, and not stopped, when a scale-up desires
// its index again; a claimed instance is stopped at once.
func TestRemoveAndScaleUpWhileDraining(t *testing.T) {
	rep := newRecordingRep()
	env := drainEnv(t, rep, "web", 2, func(c *bbs.Config) { c.DrainTimeout = bbs.Duration(time.Hour) })
	scaleTo(t, env, "web", 1)
	wantDraining(t, lrpStored(t, env, "web", 1, lrpOrdinary))
	scaleTo(t, env, "web", 3)
	if a := lrpStored(t, env, "web", 1, lrpOrdinary); !a.GetRoutable() || a.GetDrainingSince() != nil {
		t.Fatalf("record %v, want routed again", a)
	}
	lrpClaim(t, env, "web", 2, lrpInstKey("web-2", "cell-a"))

	rev, err := env.Client.RemoveDesiredLRP(ctxT(t), &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if s := rep.next(t); s != (stopCall{"web", 2, "cell-a"}) {
		t.Fatalf("stop %+v, want the claimed web/2 at once", s)
	}
	wantDraining(t, lrpStored(t, env, "web", 0, lrpOrdinary))
	wantDraining(t, lrpStored(t, env, "web", 1, lrpOrdinary))
	rep.none(t, "before the route-emitter published the removal")
	report(t, env, "e1", rev.GetRevision())
	got := map[int32]bool{}
	for range 2 {
		got[rep.next(t).index] = true
	}
	if !got[0] || !got[1] {
		t.Fatalf("stops %v, want web/0 and web/1", got)
	}
}

// TestNoRouteEmitterStopsAtOnce: without any route-emitter reporting there is nothing to wait
// for: the instance is stopped at once and never marked draining.
func TestNoRouteEmitterStopsAtOnce(t *testing.T) {
	rep := newRecordingRep()
	env := bbstest.StartWith(t, []bbs.Option{bbs.WithManualConvergence(), bbs.WithCellClient(rep)})
	lrpRegisterCell(t, env, "cell-a", "z1")
	lrpDesire(t, env, "web", 1)
	ik := lrpInstKey("web-0", "cell-a")
	lrpClaim(t, env, "web", 0, ik)
	lrpStart(t, env, "web", 0, ik, lrpNetInfo(61000))
	if _, err := env.Client.RetireActualLRP(ctxT(t), &bbsv1.RetireActualLRPRequest{ProcessGuid: "web", Index: 0}); err != nil {
		t.Fatal(err)
	}
	rep.next(t)
	if a := lrpStored(t, env, "web", 0, lrpOrdinary); a.GetDrainingSince() != nil || !a.GetRoutable() {
		t.Fatalf("record %v, want it left as it was for its rep to remove", a)
	}
}

// TestConvergenceFinishesARecordedDrain: a BBS that began a drain stops before finishing it;
// the next leader's convergence leaves the drain alone within its timeout and stops the
// instance once the timeout has passed (the record says since when it drains).
func TestConvergenceFinishesARecordedDrain(t *testing.T) {
	_, cli := etcdtest.Start(t)
	first := newRecordingRep()
	long := func(c *bbs.Config) { c.DrainTimeout = bbs.Duration(time.Minute) }
	a := bbstest.StartOnWith(t, cli, []bbs.Option{bbs.WithManualConvergence(), bbs.WithCellClient(first)}, long)
	drainSetup(t, a, "web", 2)
	scaleTo(t, a, "web", 1)
	wantDraining(t, lrpStored(t, a, "web", 1, lrpOrdinary))
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	first.none(t, "the first BBS, stopped mid-drain")

	clock := &convClock{now: time.Now()}
	second := newRecordingRep()
	b := bbstest.StartOnWith(t, cli, []bbs.Option{bbs.WithManualConvergence(), bbs.WithCellClient(second), bbs.WithClock(clock.Now)}, long)
	conv := b.Service.Converger()
	r, err := conv.Converge(ctxT(t))
	if err != nil || r.DrainsFinished != 0 || r.Retired != 0 {
		t.Fatalf("converge within the drain timeout: %+v, %v; want nothing done", r.Applied, err)
	}
	second.none(t, "within the drain timeout")

	clock.Advance(2 * time.Minute)
	if r, err = conv.Converge(ctxT(t)); err != nil || r.DrainsFinished != 1 {
		t.Fatalf("converge past the drain timeout: %+v, %v; want one drain finished", r.Applied, err)
	}
	if s := second.next(t); s != (stopCall{"web", 1, "cell-a"}) {
		t.Fatalf("stop %+v, want web/1 on cell-a", s)
	}
}

// TestEvacuationDrainsBeforeGivingUp: an evacuating instance keeps routing until its
// replacement runs; then it is unrouted and the rep keeps the container until the route-emitter
// has published that, and only then is told to stop it.
func TestEvacuationDrainsBeforeGivingUp(t *testing.T) {
	env := bbstest.Start(t, func(c *bbs.Config) { c.DrainTimeout = bbs.Duration(time.Hour) })
	report(t, env, "e1", lrpRevision(t, env))
	old, repl := lrpInstKey("old", "draining"), lrpInstKey("new", "cell-b")
	net := lrpNetInfo(61001)
	evacRunning(t, env, "web", old, net)
	if !evacuateRunning(t, env, "web", old, net) {
		t.Fatal("keep_container false without a replacement")
	}
	if evac := lrpStored(t, env, "web", 0, lrpEvacuating); !evac.GetRoutable() || evac.GetDrainingSince() != nil {
		t.Fatalf("evacuating copy %v, want it routed while no replacement runs", evac)
	}
	lrpClaim(t, env, "web", 0, repl)
	lrpStart(t, env, "web", 0, repl, lrpNetInfo(61002))

	if !evacuateRunning(t, env, "web", old, net) {
		t.Fatal("keep_container false before the drain")
	}
	wantDraining(t, lrpStored(t, env, "web", 0, lrpEvacuating))
	if !evacuateRunning(t, env, "web", old, net) {
		t.Fatal("keep_container false before the route-emitter published the drain")
	}
	report(t, env, "e1", lrpRevision(t, env))
	if evacuateRunning(t, env, "web", old, net) {
		t.Fatal("keep_container true after the drain")
	}
	if evac := lrpStored(t, env, "web", 0, lrpEvacuating); evac != nil {
		t.Fatalf("evacuating record left: %v", evac)
	}
}

// TestReportRoutesPublishedValidation: a bad report names its field and stores nothing.
func TestReportRoutesPublishedValidation(t *testing.T) {
	env := bbstest.Start(t)
	rev := lrpRevision(t, env)
	for _, r := range []*bbsv1.ReportRoutesPublishedRequest{
		{EmitterId: "", Revision: 1},
		{EmitterId: "a/b", Revision: 1},
		{EmitterId: "e1", Revision: -1},
	} {
		_, err := env.Client.ReportRoutesPublished(ctxT(t), r)
		wantCode(t, err, codes.InvalidArgument)
	}
	lrpWantRevision(t, env, rev, "refused reports")
}
