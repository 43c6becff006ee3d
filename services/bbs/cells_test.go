package bbs_test

import (
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
