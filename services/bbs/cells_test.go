package bbs_test

import (
	"slices"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// TestCellsSinceAKnownRevision checks Cells with known_revision on a real BBS and etcd: an
// unchanged answer while only other records change, the list again once a cell registers or
// disappears, the list for a revision the BBS has not seen, and a negative revision refused.
func TestCellsSinceAKnownRevision(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	lrpRegisterCell(t, env, "cell-a", "z1")
	cells := func(known int64) *bbsv1.CellsResponse {
		t.Helper()
		resp, err := env.Client.Cells(ctx, &bbsv1.CellsRequest{KnownRevision: known})
		if err != nil {
			t.Fatalf("Cells since %d: %v", known, err)
		}
		return resp
	}
	first := cells(0)
	if len(first.GetCells()) != 1 || first.GetUnchanged() {
		t.Fatalf("first list: %v", first)
	}

	// Another record changes: the cells are unchanged, at a later revision.
	lrpDesire(t, env, "web", 1)
	var same *bbsv1.CellsResponse
	testkit.Eventually(t, 10*time.Second, func() bool {
		same = cells(first.GetRevision())
		return same.GetRevision() > first.GetRevision()
	}, "the BBS's revision past the first list")
	if !same.GetUnchanged() || len(same.GetCells()) != 0 {
		t.Fatalf("cells unchanged since %d: got %v", first.GetRevision(), same)
	}

	// A cell registers: the list again, from either revision held.
	lrpRegisterCell(t, env, "cell-b", "z2")
	for _, known := range []int64{first.GetRevision(), same.GetRevision()} {
		if resp := cells(known); resp.GetUnchanged() || len(resp.GetCells()) != 2 {
			t.Fatalf("after cell-b registered, since %d: %v", known, resp)
		}
	}

	// A cell disappears: the list again.
	held := cells(0)
	if _, err := env.Etcd.Delete(ctx, store.CellKey("cell-a")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		resp := cells(held.GetRevision())
		return !resp.GetUnchanged() && len(resp.GetCells()) == 1 && resp.GetCells()[0].GetCellId() == "cell-b"
	}, "the list without cell-a after it disappeared")

	// A revision past what the BBS has seen (a restored store, a lagging replica) lists.
	if resp := cells(held.GetRevision() + 1_000_000); resp.GetUnchanged() || len(resp.GetCells()) != 1 {
		t.Fatalf("since a revision the BBS has not seen: %v", resp)
	}

	_, err := env.Client.Cells(ctx, &bbsv1.CellsRequest{KnownRevision: -1})
	wantBadRequestField(t, err, "known_revision")
}

// TestCellsChangesSinceAKnownRevision checks Cells with accept_changes on a real BBS and etcd:
// from a revision whose changes the BBS holds, the answer lists only the cells registered or
// changed since and the ids of those gone; without accept_changes, or from no revision, the
// whole list; a revision the BBS has not seen gets the whole list too.
func TestCellsChangesSinceAKnownRevision(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	for _, c := range []struct{ id, zone string }{{"cell-a", "z1"}, {"cell-b", "z2"}, {"cell-c", "z1"}} {
		lrpRegisterCell(t, env, c.id, c.zone)
	}
	cells := func(known int64, changes bool) *bbsv1.CellsResponse {
		t.Helper()
		resp, err := env.Client.Cells(ctx, &bbsv1.CellsRequest{KnownRevision: known, AcceptChanges: changes})
		if err != nil {
			t.Fatalf("Cells since %d: %v", known, err)
		}
		return resp
	}
	held := cells(0, true)
	if len(held.GetCells()) != 3 || held.GetChanges() {
		t.Fatalf("first list: %v", held)
	}

	// cell-a goes, cell-d registers, cell-b goes and comes back.
	for _, id := range []string{"cell-a", "cell-b"} {
		if _, err := env.Etcd.Delete(ctx, store.CellKey(id)); err != nil {
			t.Fatal(err)
		}
	}
	lrpRegisterCell(t, env, "cell-d", "z2")
	lrpRegisterCell(t, env, "cell-b", "z2")
	var got *bbsv1.CellsResponse
	testkit.Eventually(t, 10*time.Second, func() bool {
		got = cells(held.GetRevision(), true)
		return len(got.GetCells()) == 2 && len(got.GetRemovedCellIds()) == 1
	}, "the changes since the held list")
	ids := func(r *bbsv1.CellsResponse) []string {
		var out []string
		for _, c := range r.GetCells() {
			out = append(out, c.GetCellId())
		}
		return out
	}
	if !got.GetChanges() || got.GetUnchanged() || !slices.Equal(ids(got), []string{"cell-b", "cell-d"}) ||
		!slices.Equal(got.GetRemovedCellIds(), []string{"cell-a"}) {
		t.Fatalf("changes since %d: changes %v, cells %v, removed %v; want cell-b and cell-d, cell-a removed",
			held.GetRevision(), got.GetChanges(), ids(got), got.GetRemovedCellIds())
	}

	// Without accept_changes, from no revision, or from one the BBS has not seen: every cell.
	for _, tc := range []struct {
		known   int64
		changes bool
	}{{held.GetRevision(), false}, {0, true}, {got.GetRevision() + 1_000_000, true}} {
		if resp := cells(tc.known, tc.changes); resp.GetChanges() || !slices.Equal(ids(resp), []string{"cell-b", "cell-c", "cell-d"}) {
			t.Fatalf("since %d, accept_changes %v: changes %v, cells %v; want every cell", tc.known, tc.changes, resp.GetChanges(), ids(resp))
		}
	}
}
