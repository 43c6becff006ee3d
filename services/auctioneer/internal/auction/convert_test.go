package auction

import (
	"maps"
	"testing"

	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// TestCellFromStateCounts: a summary's per-guid counts and a full answer's instance list give
// the same instance counts.
func TestCellFromStateCounts(t *testing.T) {
	p := &modelsv1.CellPresence{CellId: "c1", RepAddress: "127.0.0.1:1"}
	lrp := func(guid string, i int32) *repv1.LRPInstance {
		return &repv1.LRPInstance{Key: &modelsv1.ActualLRPKey{ProcessGuid: guid, Index: i}}
	}
	full := cellFromState(p, &repv1.StateResponse{Lrps: []*repv1.LRPInstance{lrp("a", 0), lrp("a", 1), lrp("b", 0)}})
	summary := cellFromState(p, &repv1.StateResponse{LrpInstances: map[string]int32{"a": 2, "b": 1}})
	want := map[string]int{"a": 2, "b": 1}
	if !maps.Equal(full.Instances, want) || !maps.Equal(summary.Instances, want) {
		t.Fatalf("instances from the list %v, from the summary %v, want %v", full.Instances, summary.Instances, want)
	}
}

// TestLRPWorkCarriesTheSpreadPeer: every instance of a start request gets its spread peer's
// per-cell counts (zero counts dropped); a request without one, or with an empty one, gets none.
func TestLRPWorkCarriesTheSpreadPeer(t *testing.T) {
	with := &auctioneerv1.LRPStartRequest{ProcessGuid: "web-v2", Indices: []int32{0, 1},
		SpreadPeer: &auctioneerv1.SpreadPeer{ProcessGuid: "web-v1", BelowIndex: 4, CellInstances: map[string]int32{"c1": 2, "c2": 1, "c3": 0}}}
	empty := &auctioneerv1.LRPStartRequest{ProcessGuid: "api-v2", Indices: []int32{0}, SpreadPeer: &auctioneerv1.SpreadPeer{ProcessGuid: "api-v1"}}
	without := &auctioneerv1.LRPStartRequest{ProcessGuid: "db", Indices: []int32{0}}
	works := LRPWork([]*auctioneerv1.LRPStartRequest{with, empty, without})
	if len(works) != 4 {
		t.Fatalf("%d works", len(works))
	}
	want := map[string]int{"c1": 2, "c2": 1}
	for _, w := range works[:2] {
		if !maps.Equal(w.SpreadPeer, want) {
			t.Errorf("%s: spread peer %v, want %v", w, w.SpreadPeer, want)
		}
	}
	for _, w := range works[2:] {
		if w.SpreadPeer != nil {
			t.Errorf("%s: spread peer %v, want none", w, w.SpreadPeer)
		}
	}
}
