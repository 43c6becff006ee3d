package bbs_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// evacRunning desires guid with one instance and runs it as ik with net.
func evacRunning(t *testing.T, env *bbstest.Env, guid string, ik *modelsv1.ActualLRPInstanceKey, net *modelsv1.ActualLRPNetInfo) *modelsv1.ActualLRP {
	t.Helper()
	lrpDesire(t, env, guid, 1)
	lrpClaim(t, env, guid, 0, ik)
	return lrpStart(t, env, guid, 0, ik, net)
}

func evacuateRunning(t *testing.T, env *bbstest.Env, guid string, ik *modelsv1.ActualLRPInstanceKey, net *modelsv1.ActualLRPNetInfo) bool {
	t.Helper()
	resp, err := env.Client.EvacuateRunningActualLRP(ctxT(t), &bbsv1.EvacuateRunningActualLRPRequest{ProcessGuid: guid, InstanceKey: ik, NetInfo: net})
	if err != nil {
		t.Fatalf("evacuate running %s as %v: %v", guid, ik, err)
	}
	return resp.GetKeepContainer()
}

// wantUnclaimedAfter checks ord is the UNCLAIMED successor of before: no container, no network,
// tag bumped, since moved.
func wantUnclaimedAfter(t *testing.T, before, ord *modelsv1.ActualLRP) {
	t.Helper()
	if ord.GetState() != lrpUnclaimed || ord.GetInstanceKey() != nil || ord.GetNetInfo() != nil || ord.GetRoutable() ||
		ord.GetPresence() != lrpOrdinary || ord.GetCrashCount() != before.GetCrashCount() {
		t.Fatalf("ordinary record %v, want it UNCLAIMED without instance or net info", ord)
	}
	if ord.GetModificationTag().GetIndex() != before.GetModificationTag().GetIndex()+1 || !ord.GetSince().AsTime().After(before.GetSince().AsTime()) {
		t.Fatalf("unclaimed record tag %v since %v, before tag %v since %v", ord.GetModificationTag(), ord.GetSince().AsTime(), before.GetModificationTag(), before.GetSince().AsTime())
	}
}

func TestEvacuateRunningActualLRP(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	old, repl := lrpInstKey("old", "draining"), lrpInstKey("new", "cell-b")
	net := lrpNetInfo(61001)
	before := evacRunning(t, env, "web", old, net)

	if !evacuateRunning(t, env, "web", old, net) {
		t.Fatal("keep_container false for an instance without a replacement")
	}
	evac := lrpStored(t, env, "web", 0, lrpEvacuating)
	if evac.GetState() != lrpRunning || evac.GetPresence() != lrpEvacuating || !proto.Equal(evac.GetInstanceKey(), old) ||
		!proto.Equal(evac.GetNetInfo(), net) || !proto.Equal(evac.GetKey(), before.GetKey()) {
		t.Fatalf("evacuating record %v, want a RUNNING copy of %v", evac, before)
	}
	wantUnclaimedAfter(t, before, lrpStored(t, env, "web", 0, lrpOrdinary))
	if as := actuals(t, env, "web"); len(as) != 2 {
		t.Fatalf("ActualLRPs lists %d records, want ordinary and evacuating", len(as))
	}

	// Repeating is idempotent.
	rev := lrpRevision(t, env)
	if !evacuateRunning(t, env, "web", old, net) {
		t.Fatal("repeated evacuation: keep_container false")
	}
	lrpWantRevision(t, env, rev, "repeated evacuation")

	// Another container cannot evacuate the slot while old's copy exists.
	_, err := env.Client.EvacuateRunningActualLRP(ctx, &bbsv1.EvacuateRunningActualLRPRequest{ProcessGuid: "web", InstanceKey: repl, NetInfo: net})
	wantCode(t, err, codes.FailedPrecondition)
	lrpWantRevision(t, env, rev, "a conflicting evacuation")

	// A claimed replacement is not enough: the old container keeps serving.
	lrpClaim(t, env, "web", 0, repl)
	rev = lrpRevision(t, env)
	if !evacuateRunning(t, env, "web", old, net) {
		t.Fatal("keep_container false while the replacement is only CLAIMED")
	}
	lrpWantRevision(t, env, rev, "evacuation while the replacement is claimed")

	// Once the replacement runs, the old container is dropped with its copy.
	replaced := lrpStart(t, env, "web", 0, repl, lrpNetInfo(61002))
	if evacuateRunning(t, env, "web", old, net) {
		t.Fatal("keep_container true after the replacement started")
	}
	if evac := lrpStored(t, env, "web", 0, lrpEvacuating); evac != nil {
		t.Fatalf("evacuating record left: %v", evac)
	}
	if ord := lrpStored(t, env, "web", 0, lrpOrdinary); !proto.Equal(ord, replaced) {
		t.Fatalf("replacement changed: %v, want %v", ord, replaced)
	}
	rev = lrpRevision(t, env)
	if evacuateRunning(t, env, "web", old, net) {
		t.Fatal("keep_container true for a replaced instance")
	}
	lrpWantRevision(t, env, rev, "evacuating a replaced instance")
}

func TestEvacuateClaimedActualLRP(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	old := lrpInstKey("old", "draining")
	lrpDesire(t, env, "web", 1)
	before := lrpClaim(t, env, "web", 0, old)

	// A container that does not hold the slot changes nothing.
	rev := lrpRevision(t, env)
	resp, err := env.Client.EvacuateClaimedActualLRP(ctx, &bbsv1.EvacuateClaimedActualLRPRequest{ProcessGuid: "web", InstanceKey: lrpInstKey("other", "draining")})
	if err != nil || resp.GetKeepContainer() {
		t.Fatalf("evacuating another container: keep %v, %v", resp.GetKeepContainer(), err)
	}
	lrpWantRevision(t, env, rev, "evacuating another container")

	resp, err = env.Client.EvacuateClaimedActualLRP(ctx, &bbsv1.EvacuateClaimedActualLRPRequest{ProcessGuid: "web", InstanceKey: old})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetKeepContainer() {
		t.Fatal("keep_container true for a claimed instance")
	}
	wantUnclaimedAfter(t, before, lrpStored(t, env, "web", 0, lrpOrdinary))
	if evac := lrpStored(t, env, "web", 0, lrpEvacuating); evac != nil {
		t.Fatalf("claimed evacuation made an evacuating record: %v", evac)
	}
	lrpClaim(t, env, "web", 0, lrpInstKey("new", "cell-b"))
}

func TestEvacuateStoppedActualLRP(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	old, repl := lrpInstKey("old", "draining"), lrpInstKey("new", "cell-b")
	stopped := func(guid string, ik *modelsv1.ActualLRPInstanceKey) error {
		resp, err := env.Client.EvacuateStoppedActualLRP(ctx, &bbsv1.EvacuateStoppedActualLRPRequest{ProcessGuid: guid, InstanceKey: ik})
		if resp.GetKeepContainer() {
			t.Fatal("keep_container true for a stopped container")
		}
		return err
	}

	t.Run("evacuating copy", func(t *testing.T) {
		evacRunning(t, env, "a", old, lrpNetInfo(61001))
		evacuateRunning(t, env, "a", old, lrpNetInfo(61001))
		replacement := lrpClaim(t, env, "a", 0, repl)
		if err := stopped("a", old); err != nil {
			t.Fatal(err)
		}
		if evac := lrpStored(t, env, "a", 0, lrpEvacuating); evac != nil {
			t.Fatalf("evacuating record left: %v", evac)
		}
		if ord := lrpStored(t, env, "a", 0, lrpOrdinary); !proto.Equal(ord, replacement) {
			t.Fatalf("replacement changed: %v, want %v", ord, replacement)
		}
	})
	t.Run("ordinary record", func(t *testing.T) {
		evacRunning(t, env, "b", old, lrpNetInfo(61001))
		if err := stopped("b", old); err != nil {
			t.Fatal(err)
		}
		if as := actuals(t, env, "b"); len(as) != 0 {
			t.Fatalf("records left: %v", as)
		}
	})
	t.Run("unknown container", func(t *testing.T) {
		evacRunning(t, env, "c", old, lrpNetInfo(61001))
		rev := lrpRevision(t, env)
		wantCode(t, stopped("c", repl), codes.NotFound)
		lrpWantRevision(t, env, rev, "stopping an unknown container")
		wantCode(t, stopped("nope", repl), codes.NotFound)
	})
}

func TestEvacuateCrashedActualLRP(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	old := lrpInstKey("old", "draining")
	crashed := func(guid string, ik *modelsv1.ActualLRPInstanceKey) error {
		resp, err := env.Client.EvacuateCrashedActualLRP(ctx, &bbsv1.EvacuateCrashedActualLRPRequest{ProcessGuid: guid, InstanceKey: ik, ErrorMessage: "out of memory"})
		if resp.GetKeepContainer() {
			t.Fatal("keep_container true for a crashed container")
		}
		return err
	}

	t.Run("evacuating copy", func(t *testing.T) {
		evacRunning(t, env, "a", old, lrpNetInfo(61001))
		evacuateRunning(t, env, "a", old, lrpNetInfo(61001))
		ord := lrpStored(t, env, "a", 0, lrpOrdinary)
		if err := crashed("a", old); err != nil {
			t.Fatal(err)
		}
		if evac := lrpStored(t, env, "a", 0, lrpEvacuating); evac != nil {
			t.Fatalf("evacuating record left: %v", evac)
		}
		if after := lrpStored(t, env, "a", 0, lrpOrdinary); !proto.Equal(after, ord) {
			t.Fatalf("ordinary record it no longer holds changed: %v, want %v", after, ord)
		}
	})
	t.Run("ordinary record", func(t *testing.T) {
		before := evacRunning(t, env, "b", old, lrpNetInfo(61001))
		if err := crashed("b", old); err != nil {
			t.Fatal(err)
		}
		after := lrpStored(t, env, "b", 0, lrpOrdinary)
		if after.GetState() != lrpUnclaimed || after.GetCrashCount() != 1 || after.GetCrashReason() != "out of memory" ||
			after.GetInstanceKey() != nil || after.GetNetInfo() != nil || after.GetModificationTag().GetIndex() != before.GetModificationTag().GetIndex()+1 {
			t.Fatalf("crashed record %v, want UNCLAIMED with crash_count 1 and the reason", after)
		}
	})
	t.Run("unknown container", func(t *testing.T) {
		evacRunning(t, env, "c", old, lrpNetInfo(61001))
		rev := lrpRevision(t, env)
		wantCode(t, crashed("c", lrpInstKey("other", "draining")), codes.NotFound)
		lrpWantRevision(t, env, rev, "crashing an unknown container")
	})
}

func TestRemoveEvacuatingActualLRP(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	old := lrpInstKey("old", "draining")
	evacRunning(t, env, "web", old, lrpNetInfo(61001))
	evacuateRunning(t, env, "web", old, lrpNetInfo(61001))
	ord := lrpStored(t, env, "web", 0, lrpOrdinary)
	remove := func(ik *modelsv1.ActualLRPInstanceKey) error {
		_, err := env.Client.RemoveEvacuatingActualLRP(ctx, &bbsv1.RemoveEvacuatingActualLRPRequest{ProcessGuid: "web", InstanceKey: ik})
		return err
	}

	rev := lrpRevision(t, env)
	wantCode(t, remove(lrpInstKey("other", "draining")), codes.FailedPrecondition)
	lrpWantRevision(t, env, rev, "removing with a wrong instance key")

	if err := remove(old); err != nil {
		t.Fatal(err)
	}
	if evac := lrpStored(t, env, "web", 0, lrpEvacuating); evac != nil {
		t.Fatalf("evacuating record left: %v", evac)
	}
	if after := lrpStored(t, env, "web", 0, lrpOrdinary); !proto.Equal(after, ord) {
		t.Fatalf("ordinary record changed: %v, want %v", after, ord)
	}

	rev = lrpRevision(t, env)
	wantCode(t, remove(old), codes.NotFound)
	lrpWantRevision(t, env, rev, "removing a missing evacuating record")
}
