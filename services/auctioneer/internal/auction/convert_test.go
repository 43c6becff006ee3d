package auction

import (
	"maps"
	"testing"

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
