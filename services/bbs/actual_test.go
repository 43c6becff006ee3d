package bbs_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

const (
	lrpUnclaimed  = modelsv1.ActualLRP_STATE_UNCLAIMED
	lrpClaimed    = modelsv1.ActualLRP_STATE_CLAIMED
	lrpRunning    = modelsv1.ActualLRP_STATE_RUNNING
	lrpCrashed    = modelsv1.ActualLRP_STATE_CRASHED
	lrpOrdinary   = modelsv1.ActualLRP_PRESENCE_ORDINARY
	lrpEvacuating = modelsv1.ActualLRP_PRESENCE_EVACUATING
)

func lrpInstKey(guid, cell string) *modelsv1.ActualLRPInstanceKey {
	return &modelsv1.ActualLRPInstanceKey{InstanceGuid: guid, CellId: cell}
}

func lrpNetInfo(hostPort uint32) *modelsv1.ActualLRPNetInfo {
	return &modelsv1.ActualLRPNetInfo{
		Address:         "10.0.0.1",
		InstanceAddress: fmt.Sprintf("10.255.0.%d", hostPort%250),
		Ports:           []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: hostPort}},
	}
}

// lrpStored reads an actual LRP record straight from etcd (nil when absent).
func lrpStored(t *testing.T, env *bbstest.Env, guid string, index int32, p modelsv1.ActualLRP_Presence) *modelsv1.ActualLRP {
	t.Helper()
	resp, err := env.Etcd.Get(ctxT(t), store.ActualKey(guid, index, p))
	if err != nil {
		t.Fatalf("read %s/%d: %v", guid, index, err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	a := &modelsv1.ActualLRP{}
	if err := proto.Unmarshal(resp.Kvs[0].Value, a); err != nil {
		t.Fatalf("decode %s/%d: %v", guid, index, err)
	}
	return a
}

// lrpRevision is etcd's current revision.
func lrpRevision(t *testing.T, env *bbstest.Env) int64 {
	t.Helper()
	resp, err := env.Etcd.Get(ctxT(t), "/gavel")
	if err != nil {
		t.Fatalf("read revision: %v", err)
	}
	return resp.Header.Revision
}

// lrpWantRevision fails unless the store is still at revision rev.
func lrpWantRevision(t *testing.T, env *bbstest.Env, rev int64, what string) {
	t.Helper()
	if now := lrpRevision(t, env); now != rev {
		t.Fatalf("%s changed the store: revision %d -> %d", what, rev, now)
	}
}

// lrpRegisterCell writes a cell's presence, as its rep does, and waits until the BBS sees it.
func lrpRegisterCell(t *testing.T, env *bbstest.Env, id, zone string) {
	t.Helper()
	ctx := ctxT(t)
	b, err := proto.Marshal(&modelsv1.CellPresence{CellId: id, RepAddress: "127.0.0.1:1801", Zone: zone, Address: "10.0.0.1",
		Capacity: &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 1024, Containers: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Etcd.Put(ctx, store.CellKey(id), string(b)); err != nil {
		t.Fatalf("register cell %s: %v", id, err)
	}
	// The cache follows etcd's watch; wait for it to see the cell.
	testkit.Eventually(t, 10*time.Second, func() bool {
		resp, err := env.Client.Cells(ctx, &bbsv1.CellsRequest{})
		if err != nil {
			t.Fatalf("Cells: %v", err)
		}
		return slices.ContainsFunc(resp.GetCells(), func(c *modelsv1.CellPresence) bool { return c.GetCellId() == id })
	}, fmt.Sprintf("cell %s visible after its registration", id))
}

func lrpDesire(t *testing.T, env *bbstest.Env, guid string, instances int32) {
	t.Helper()
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp(guid, instances)}); err != nil {
		t.Fatalf("desire %s: %v", guid, err)
	}
}

func lrpClaim(t *testing.T, env *bbstest.Env, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey) *modelsv1.ActualLRP {
	t.Helper()
	resp, err := env.Client.ClaimActualLRP(ctxT(t), &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: ik})
	if err != nil {
		t.Fatalf("claim %s/%d by %v: %v", guid, index, ik, err)
	}
	return resp.GetActualLrp()
}

func lrpStart(t *testing.T, env *bbstest.Env, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey, net *modelsv1.ActualLRPNetInfo) *modelsv1.ActualLRP {
	t.Helper()
	resp, err := env.Client.StartActualLRP(ctxT(t), &bbsv1.StartActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: ik, NetInfo: net, Routable: true})
	if err != nil {
		t.Fatalf("start %s/%d as %v: %v", guid, index, ik, err)
	}
	return resp.GetActualLrp()
}

func lrpCrash(t *testing.T, env *bbstest.Env, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey, reason string) *modelsv1.ActualLRP {
	t.Helper()
	resp, err := env.Client.CrashActualLRP(ctxT(t), &bbsv1.CrashActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: ik, ErrorMessage: reason})
	if err != nil {
		t.Fatalf("crash %s/%d of %v: %v", guid, index, ik, err)
	}
	return resp.GetActualLrp()
}

// TestActualLRPTransitions drives every actual LRP call from every starting state and checks
// the answer and the stored record: a refused call or a no-op changes nothing in etcd, a change
// is one transaction that bumps the modification tag and, when the state changes, since.
func TestActualLRPTransitions(t *testing.T) {
	env := bbstest.Start(t)
	const liveCell, liveZone = "cell-a", "z1"
	lrpRegisterCell(t, env, liveCell, liveZone)
	ikA := lrpInstKey("inst-a", liveCell)    // the holder of CLAIMED and RUNNING starting states
	ikB := lrpInstKey("inst-b", "cell-b")    // another container, on an unregistered cell
	ikGone := lrpInstKey("inst-c", "cell-c") // a holder on an unregistered cell
	netRun, netNew := lrpNetInfo(61001), lrpNetInfo(61002)
	peSetup := &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES, Message: "insufficient resources: memory (1 compatible cells)"}
	peNew := &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_CELL_MISMATCH, Message: `found no compatible cell: 0/1 cells eligible (1 lack tag "gpu")`}

	// Starting states, each reached through the API on instance 0 of a fresh desired LRP.
	type setup func(t *testing.T, guid string)
	claimedBy := func(ik *modelsv1.ActualLRPInstanceKey) setup {
		return func(t *testing.T, guid string) {
			lrpDesire(t, env, guid, 1)
			lrpClaim(t, env, guid, 0, ik)
		}
	}
	runningAs := func(ik *modelsv1.ActualLRPInstanceKey) setup {
		return func(t *testing.T, guid string) {
			claimedBy(ik)(t, guid)
			lrpStart(t, env, guid, 0, ik, netRun)
		}
	}
	setups := map[string]setup{
		"UNCLAIMED": func(t *testing.T, guid string) {
			lrpDesire(t, env, guid, 1)
			if _, err := env.Client.FailActualLRP(ctxT(t), &bbsv1.FailActualLRPRequest{ProcessGuid: guid, PlacementError: peSetup}); err != nil {
				t.Fatal(err)
			}
		},
		"CLAIMED":              claimedBy(ikA),
		"RUNNING":              runningAs(ikA),
		"CLAIMED on gone cell": claimedBy(ikGone),
		"RUNNING on gone cell": runningAs(ikGone),
		"CRASHED": func(t *testing.T, guid string) {
			lrpDesire(t, env, guid, 1)
			for i := 1; i <= 4; i++ {
				lrpClaim(t, env, guid, 0, ikA)
				lrpStart(t, env, guid, 0, ikA, netRun)
				lrpCrash(t, env, guid, 0, ikA, fmt.Sprintf("crash %d", i))
			}
		},
		"missing": func(t *testing.T, guid string) {
			lrpDesire(t, env, guid, 1)
			if _, err := env.Client.RemoveActualLRP(ctxT(t), &bbsv1.RemoveActualLRPRequest{ProcessGuid: guid}); err != nil {
				t.Fatal(err)
			}
		},
	}

	// Calls on instance 0; each returns the record the RPC answered with, if any.
	type call func(ctx context.Context, guid string) (*modelsv1.ActualLRP, error)
	claimAs := func(ik *modelsv1.ActualLRPInstanceKey) call {
		return func(ctx context.Context, guid string) (*modelsv1.ActualLRP, error) {
			r, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, InstanceKey: ik})
			return r.GetActualLrp(), err
		}
	}
	startAs := func(ik *modelsv1.ActualLRPInstanceKey, net *modelsv1.ActualLRPNetInfo, routable bool) call {
		return func(ctx context.Context, guid string) (*modelsv1.ActualLRP, error) {
			r, err := env.Client.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: guid, InstanceKey: ik, NetInfo: net, Routable: routable})
			return r.GetActualLrp(), err
		}
	}
	crashAs := func(ik *modelsv1.ActualLRPInstanceKey) call {
		return func(ctx context.Context, guid string) (*modelsv1.ActualLRP, error) {
			r, err := env.Client.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{ProcessGuid: guid, InstanceKey: ik, ErrorMessage: "exit status 137"})
			return r.GetActualLrp(), err
		}
	}
	fail := func(ctx context.Context, guid string) (*modelsv1.ActualLRP, error) {
		_, err := env.Client.FailActualLRP(ctx, &bbsv1.FailActualLRPRequest{ProcessGuid: guid, PlacementError: peNew})
		return nil, err
	}
	removeAs := func(ik *modelsv1.ActualLRPInstanceKey) call {
		return func(ctx context.Context, guid string) (*modelsv1.ActualLRP, error) {
			_, err := env.Client.RemoveActualLRP(ctx, &bbsv1.RemoveActualLRPRequest{ProcessGuid: guid, InstanceKey: ik})
			return nil, err
		}
	}
	retire := func(ctx context.Context, guid string) (*modelsv1.ActualLRP, error) {
		_, err := env.Client.RetireActualLRP(ctx, &bbsv1.RetireActualLRPRequest{ProcessGuid: guid})
		return nil, err
	}

	// Expected changes, applied to a copy of the record before the call.
	type change func(a *modelsv1.ActualLRP)
	toClaimed := func(ik *modelsv1.ActualLRPInstanceKey, zone string) change {
		return func(a *modelsv1.ActualLRP) {
			a.State, a.InstanceKey, a.Zone, a.PlacementError = lrpClaimed, ik, zone, nil
		}
	}
	toRunning := func(ik *modelsv1.ActualLRPInstanceKey, zone string, net *modelsv1.ActualLRPNetInfo, routable bool) change {
		return func(a *modelsv1.ActualLRP) {
			a.State, a.InstanceKey, a.Zone, a.NetInfo, a.Routable, a.PlacementError = lrpRunning, ik, zone, net, routable, nil
		}
	}
	toCrashed := func(state modelsv1.ActualLRP_State, count int32) change {
		return func(a *modelsv1.ActualLRP) {
			a.State, a.CrashCount, a.CrashReason, a.InstanceKey, a.NetInfo, a.Routable = state, count, "exit status 137", nil, nil, false
		}
	}
	toFailed := func(a *modelsv1.ActualLRP) { a.PlacementError = peNew }

	type outcome struct {
		code   codes.Code
		noop   bool   // OK without any write
		gone   bool   // OK and the record is deleted
		change change // OK and the record changed like this
		errHas string // the error message names this
	}
	refused := func(code codes.Code, errHas string) outcome { return outcome{code: code, errHas: errHas} }
	fp := refused(codes.FailedPrecondition, "")
	nf := refused(codes.NotFound, "not found")
	noop := outcome{code: codes.OK, noop: true}
	gone := outcome{code: codes.OK, gone: true}
	changes := func(c change) outcome { return outcome{code: codes.OK, change: c} }

	tests := []struct {
		from string
		name string
		call call
		want outcome
	}{
		{"UNCLAIMED", "claim A", claimAs(ikA), changes(toClaimed(ikA, liveZone))},
		{"UNCLAIMED", "claim B", claimAs(ikB), changes(toClaimed(ikB, ""))},
		{"UNCLAIMED", "start A", startAs(ikA, netRun, true), changes(toRunning(ikA, liveZone, netRun, true))},
		{"UNCLAIMED", "start B", startAs(ikB, netNew, false), changes(toRunning(ikB, "", netNew, false))},
		{"UNCLAIMED", "crash A", crashAs(ikA), refused(codes.FailedPrecondition, "UNCLAIMED")},
		{"UNCLAIMED", "crash B", crashAs(ikB), fp},
		{"UNCLAIMED", "fail", fail, changes(toFailed)},
		{"UNCLAIMED", "remove A", removeAs(ikA), fp},
		{"UNCLAIMED", "remove B", removeAs(ikB), fp},
		{"UNCLAIMED", "remove any", removeAs(nil), gone},
		{"UNCLAIMED", "retire", retire, gone},

		{"CLAIMED", "claim A", claimAs(ikA), noop},
		{"CLAIMED", "claim B", claimAs(ikB), refused(codes.FailedPrecondition, "inst-a")},
		{"CLAIMED", "start A", startAs(ikA, netRun, true), changes(toRunning(ikA, liveZone, netRun, true))},
		{"CLAIMED", "start B", startAs(ikB, netRun, true), refused(codes.FailedPrecondition, "inst-a")},
		{"CLAIMED", "crash A", crashAs(ikA), changes(toCrashed(lrpUnclaimed, 1))},
		{"CLAIMED", "crash B", crashAs(ikB), refused(codes.FailedPrecondition, "inst-a")},
		{"CLAIMED", "fail", fail, fp},
		{"CLAIMED", "remove A", removeAs(ikA), gone},
		{"CLAIMED", "remove B", removeAs(ikB), refused(codes.FailedPrecondition, "inst-a")},
		{"CLAIMED", "remove any", removeAs(nil), gone},
		{"CLAIMED", "retire on live cell", retire, noop}, // the rep is asked to stop it and removes the record
		{"CLAIMED on gone cell", "retire", retire, gone},

		{"RUNNING", "claim A", claimAs(ikA), refused(codes.FailedPrecondition, "inst-a")},
		{"RUNNING", "claim B", claimAs(ikB), refused(codes.FailedPrecondition, "inst-a")},
		{"RUNNING", "start A again", startAs(ikA, netRun, true), noop},
		{"RUNNING", "start A new net info", startAs(ikA, netNew, false), changes(toRunning(ikA, liveZone, netNew, false))},
		{"RUNNING", "start B", startAs(ikB, netNew, true), refused(codes.FailedPrecondition, "inst-a")},
		{"RUNNING", "crash A", crashAs(ikA), changes(toCrashed(lrpUnclaimed, 1))},
		{"RUNNING", "crash B", crashAs(ikB), refused(codes.FailedPrecondition, "inst-a")},
		{"RUNNING", "fail", fail, fp},
		{"RUNNING", "remove A", removeAs(ikA), gone},
		{"RUNNING", "remove B", removeAs(ikB), refused(codes.FailedPrecondition, "inst-a")},
		{"RUNNING", "remove any", removeAs(nil), gone},
		{"RUNNING", "retire on live cell", retire, noop},
		{"RUNNING on gone cell", "retire", retire, gone},

		{"CRASHED", "claim A", claimAs(ikA), refused(codes.FailedPrecondition, "CRASHED")},
		{"CRASHED", "claim B", claimAs(ikB), fp},
		{"CRASHED", "start A", startAs(ikA, netRun, true), refused(codes.FailedPrecondition, "CRASHED")},
		{"CRASHED", "start B", startAs(ikB, netRun, true), fp},
		{"CRASHED", "crash A", crashAs(ikA), refused(codes.FailedPrecondition, "CRASHED")},
		{"CRASHED", "crash B", crashAs(ikB), fp},
		{"CRASHED", "fail", fail, fp},
		{"CRASHED", "remove A", removeAs(ikA), fp},
		{"CRASHED", "remove B", removeAs(ikB), fp},
		{"CRASHED", "remove any", removeAs(nil), gone},
		{"CRASHED", "retire", retire, gone},

		{"missing", "claim A", claimAs(ikA), nf},
		{"missing", "claim B", claimAs(ikB), nf},
		{"missing", "start A", startAs(ikA, netRun, true), nf},
		{"missing", "start B", startAs(ikB, netRun, true), nf},
		{"missing", "crash A", crashAs(ikA), nf},
		{"missing", "crash B", crashAs(ikB), nf},
		{"missing", "fail", fail, nf},
		{"missing", "remove A", removeAs(ikA), nf},
		{"missing", "remove B", removeAs(ikB), nf},
		{"missing", "remove any", removeAs(nil), nf},
		{"missing", "retire", retire, nf},
	}
	for i, tt := range tests {
		t.Run(tt.from+"/"+tt.name, func(t *testing.T) {
			guid := fmt.Sprintf("tr%d", i)
			setups[tt.from](t, guid)
			before := lrpStored(t, env, guid, 0, lrpOrdinary)
			if (before == nil) != (tt.from == "missing") {
				t.Fatalf("setup %s left %v", tt.from, before)
			}
			rev := lrpRevision(t, env)

			got, err := tt.call(ctxT(t), guid)
			wantCode(t, err, tt.want.code)
			if tt.want.errHas != "" && !strings.Contains(status.Convert(err).Message(), tt.want.errHas) {
				t.Errorf("error %q does not mention %q", status.Convert(err).Message(), tt.want.errHas)
			}
			after := lrpStored(t, env, guid, 0, lrpOrdinary)
			if evac := lrpStored(t, env, guid, 0, lrpEvacuating); evac != nil {
				t.Fatalf("unexpected evacuating record %v", evac)
			}
			// The cache-served list agrees with etcd.
			if as := actuals(t, env, guid); (after == nil && len(as) != 0) || (after != nil && (len(as) != 1 || !proto.Equal(as[0], after))) {
				t.Fatalf("ActualLRPs %v, etcd holds %v", as, after)
			}

			switch {
			case tt.want.code != codes.OK || tt.want.noop:
				lrpWantRevision(t, env, rev, tt.name)
				if !proto.Equal(before, after) {
					t.Fatalf("record changed:\nbefore %v\nafter  %v", before, after)
				}
				if got != nil && !proto.Equal(got, before) {
					t.Fatalf("answered %v, stored %v", got, before)
				}
			case tt.want.gone:
				if after != nil {
					t.Fatalf("record not removed: %v", after)
				}
				lrpWantRevision(t, env, rev+1, tt.name)
			default:
				if after == nil {
					t.Fatal("record removed")
				}
				lrpWantRevision(t, env, rev+1, tt.name)
				if got != nil && !proto.Equal(got, after) {
					t.Fatalf("answered %v\nstored %v", got, after)
				}
				if bt, at := before.GetModificationTag(), after.GetModificationTag(); at.GetEpoch() != bt.GetEpoch() || at.GetIndex() != bt.GetIndex()+1 {
					t.Fatalf("modification tag %v -> %v, want the index bumped once", bt, at)
				}
				want := proto.Clone(before).(*modelsv1.ActualLRP)
				tt.want.change(want)
				if want.GetState() != before.GetState() {
					if !after.GetSince().AsTime().After(before.GetSince().AsTime()) {
						t.Fatalf("state %s -> %s but since %v -> %v", before.GetState(), after.GetState(), before.GetSince().AsTime(), after.GetSince().AsTime())
					}
				} else if !proto.Equal(after.GetSince(), before.GetSince()) {
					t.Fatalf("state stayed %s but since %v -> %v", before.GetState(), before.GetSince().AsTime(), after.GetSince().AsTime())
				}
				want.Since, want.ModificationTag = after.GetSince(), after.GetModificationTag()
				if !proto.Equal(want, after) {
					t.Fatalf("stored %v\nwant   %v", after, want)
				}
			}
		})
	}
}

// TestConcurrentClaimsOneWinner races 20 containers for one instance: exactly one claim wins
// and every loser is told which instance holds it.
func TestConcurrentClaimsOneWinner(t *testing.T) {
	env := bbstest.Start(t)
	const racers = 20
	for round := range 5 {
		guid := fmt.Sprintf("race%d", round)
		lrpDesire(t, env, guid, 1)
		ctx := ctxT(t)
		var wg sync.WaitGroup
		errs := make([]error, racers)
		got := make([]*modelsv1.ActualLRP, racers)
		keys := make([]*modelsv1.ActualLRPInstanceKey, racers)
		go1 := make(chan struct{})
		for i := range racers {
			keys[i] = lrpInstKey(fmt.Sprintf("racer-%02d", i), fmt.Sprintf("cell-%02d", i))
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-go1
				r, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, InstanceKey: keys[i]})
				got[i], errs[i] = r.GetActualLrp(), err
			}()
		}
		close(go1)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				if winner >= 0 {
					t.Fatalf("round %d: both %s and %s won the claim", round, keys[winner].GetInstanceGuid(), keys[i].GetInstanceGuid())
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no claim won: %v", round, errs)
		}
		name := "instance " + keys[winner].GetInstanceGuid() + " "
		for i, err := range errs {
			if i == winner {
				continue
			}
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("round %d: loser %d got %v, want FailedPrecondition", round, i, err)
			}
			if msg := status.Convert(err).Message(); !strings.Contains(msg, name) {
				t.Fatalf("round %d: loser's error %q does not name the winner %q", round, msg, keys[winner].GetInstanceGuid())
			}
		}
		stored := lrpStored(t, env, guid, 0, lrpOrdinary)
		if stored.GetState() != lrpClaimed || !proto.Equal(stored.GetInstanceKey(), keys[winner]) || !proto.Equal(stored, got[winner]) {
			t.Fatalf("round %d: stored %v, winner %v answered %v", round, stored, keys[winner], got[winner])
		}
		if stored.GetModificationTag().GetIndex() != 1 {
			t.Fatalf("round %d: modification tag index %d, want exactly one write", round, stored.GetModificationTag().GetIndex())
		}
	}
}

// TestClaimIncludesTheDesiredLRP: a claim that asks for it brings back the desired LRP as
// DesiredLRPByProcessGuid gives it; one that does not ask carries none; a refused claim
// carries nothing.
func TestClaimIncludesTheDesiredLRP(t *testing.T) {
	env := bbstest.Start(t)
	lrpDesire(t, env, "web", 2)
	ctx := ctxT(t)
	want, err := env.Client.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0,
		InstanceKey: lrpInstKey("i-0", "cell-1"), IncludeDesiredLrp: true})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.GetDesiredLrp(), want.GetDesiredLrp()) || got.GetActualLrp().GetState() != lrpClaimed {
		t.Fatalf("claim answered %v, want the claimed instance and desired %v", got, want.GetDesiredLrp())
	}
	got, err = env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 1, InstanceKey: lrpInstKey("i-1", "cell-1")})
	if err != nil || got.GetDesiredLrp() != nil {
		t.Fatalf("claim without the flag answered %v, %v; want no desired LRP", got, err)
	}
	got, err = env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0,
		InstanceKey: lrpInstKey("i-other", "cell-2"), IncludeDesiredLrp: true})
	if status.Code(err) != codes.FailedPrecondition || got != nil {
		t.Fatalf("a lost claim answered %v, %v; want FailedPrecondition and nothing", got, err)
	}
}

// TestCrashRestartPolicy: the first three crashes restart at once (UNCLAIMED, claimable again),
// the fourth leaves the instance CRASHED.
func TestCrashRestartPolicy(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	lrpDesire(t, env, "crashy", 1)
	for n := int32(1); n <= 4; n++ {
		ik := lrpInstKey(fmt.Sprintf("c%d", n), "cell-a")
		lrpClaim(t, env, "crashy", 0, ik)
		if n%2 == 1 { // crash while RUNNING on odd rounds, while CLAIMED on even ones
			lrpStart(t, env, "crashy", 0, ik, lrpNetInfo(61000+uint32(n)))
		}
		reason := fmt.Sprintf("exit status %d", n)
		got := lrpCrash(t, env, "crashy", 0, ik, reason)
		wantState := lrpUnclaimed
		if n == 4 {
			wantState = lrpCrashed
		}
		if got.GetState() != wantState || got.GetCrashCount() != n || got.GetCrashReason() != reason ||
			got.GetInstanceKey() != nil || got.GetNetInfo() != nil || got.GetRoutable() {
			t.Fatalf("crash %d answered %v, want %s with crash_count %d, reason, no instance or net info", n, got, wantState, n)
		}
		if stored := lrpStored(t, env, "crashy", 0, lrpOrdinary); !proto.Equal(stored, got) {
			t.Fatalf("crash %d: stored %v, answered %v", n, stored, got)
		}
	}
	rev := lrpRevision(t, env)
	_, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "crashy", InstanceKey: lrpInstKey("c5", "cell-a")})
	wantCode(t, err, codes.FailedPrecondition)
	lrpWantRevision(t, env, rev, "claiming a CRASHED instance")
}

// TestStartReportsAnInstanceTheStoreDoesNotKnow: a cell reporting a running container whose slot
// has no record (after a restore from a backup, say) gets NotFound without a domain; with one,
// the BBS records it RUNNING in that domain (an extra instance until desired), and a slot held by
// another container still refuses the report.
func TestStartReportsAnInstanceTheStoreDoesNotKnow(t *testing.T) {
	env := bbstest.Start(t)
	lrpRegisterCell(t, env, "cell-a", "z1")
	ik, net := lrpInstKey("inst-a", "cell-a"), lrpNetInfo(61001)
	req := &bbsv1.StartActualLRPRequest{ProcessGuid: "restored", Index: 2, InstanceKey: ik, NetInfo: net, Routable: true}
	_, err := env.Client.StartActualLRP(ctxT(t), req)
	if status.Code(err) != codes.NotFound {
		t.Fatalf("start of an unknown slot without a domain = %v, want NotFound", err)
	}
	if got := lrpStored(t, env, "restored", 2, lrpOrdinary); got != nil {
		t.Fatalf("a refused start stored %v", got)
	}
	bad := proto.Clone(req).(*bbsv1.StartActualLRPRequest)
	bad.Domain = "bad domain"
	if _, err := env.Client.StartActualLRP(ctxT(t), bad); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "domain") {
		t.Fatalf("start with a bad domain = %v, want InvalidArgument naming domain", err)
	}

	req.Domain = "apps"
	resp, err := env.Client.StartActualLRP(ctxT(t), req)
	if err != nil {
		t.Fatalf("report of an unknown running instance: %v", err)
	}
	a := resp.GetActualLrp()
	if a.GetState() != lrpRunning || a.GetKey().GetDomain() != "apps" || a.GetInstanceKey().GetInstanceGuid() != "inst-a" ||
		a.GetZone() != "z1" || !proto.Equal(a.GetNetInfo(), net) || !a.GetRoutable() {
		t.Fatalf("recorded %v, want RUNNING in domain apps as inst-a in z1", a)
	}
	if got := lrpStored(t, env, "restored", 2, lrpOrdinary); !proto.Equal(got, a) {
		t.Fatalf("stored %v, answered %v", got, a)
	}
	// Reported again by the same container: no change. By another: refused.
	if _, err := env.Client.StartActualLRP(ctxT(t), req); err != nil {
		t.Fatalf("second report: %v", err)
	}
	other := proto.Clone(req).(*bbsv1.StartActualLRPRequest)
	other.InstanceKey = lrpInstKey("inst-b", "cell-a")
	if _, err := env.Client.StartActualLRP(ctxT(t), other); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("report by another container = %v, want FailedPrecondition", err)
	}
}

// TestCrashOfARetiredInstanceRemovesIt: an instance scaled away while it was starting crashes
// (its start timed out as its cell stopped it): the crash removes its record instead of making
// it UNCLAIMED again, so nothing restarts it and no extra instance is left waiting for a fresh
// domain (a deployment's revert waited on one forever).
func TestCrashOfARetiredInstanceRemovesIt(t *testing.T) {
	env := bbstest.Start(t)
	lrpRegisterCell(t, env, "cell-a", "z1")
	lrpDesire(t, env, "shrinking", 2)
	ik := lrpInstKey("inst-1", "cell-a")
	lrpClaim(t, env, "shrinking", 1, ik)
	one := int32(1)
	if _, err := env.Client.UpdateDesiredLRP(ctxT(t), &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "shrinking",
		Update: &modelsv1.DesiredLRPUpdate{Instances: &one}}); err != nil {
		t.Fatal(err)
	}
	resp, err := env.Client.CrashActualLRP(ctxT(t), &bbsv1.CrashActualLRPRequest{ProcessGuid: "shrinking", Index: 1, InstanceKey: ik, ErrorMessage: "start timeout"})
	if err != nil {
		t.Fatalf("crash: %v", err)
	}
	if got := resp.GetActualLrp().GetState(); got != lrpCrashed {
		t.Errorf("answered state %s, want CRASHED", got)
	}
	if got := lrpStored(t, env, "shrinking", 1, lrpOrdinary); got != nil {
		t.Fatalf("the crashed instance past the desired count is still stored: %v", got)
	}
	// A crash of a desired instance still restarts it.
	lrpClaim(t, env, "shrinking", 0, lrpInstKey("inst-0", "cell-a"))
	if _, err := env.Client.CrashActualLRP(ctxT(t), &bbsv1.CrashActualLRPRequest{ProcessGuid: "shrinking", Index: 0, InstanceKey: lrpInstKey("inst-0", "cell-a"), ErrorMessage: "boom"}); err != nil {
		t.Fatal(err)
	}
	if got := lrpStored(t, env, "shrinking", 0, lrpOrdinary); got.GetState() != lrpUnclaimed {
		t.Fatalf("a desired instance's crash left %v, want UNCLAIMED", got)
	}
}
