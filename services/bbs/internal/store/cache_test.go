package store

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// TestCellIndexFollowsTheRecords sets and deletes instance records at random (placed,
// unclaimed, moved to another cell, removed, in every presence) and checks after each step
// that the cache's index by cell holds exactly the records each cell holds, as a walk of every
// record finds them, with no empty entry left behind.
func TestCellIndexFollowsTheRecords(t *testing.T) {
	st := newState()
	rng := rand.New(rand.NewPCG(1, 2))
	cells := []string{"", "cell-a", "cell-b", "cell-c"}
	presences := []modelsv1.ActualLRP_Presence{modelsv1.ActualLRP_PRESENCE_ORDINARY, modelsv1.ActualLRP_PRESENCE_EVACUATING, modelsv1.ActualLRP_PRESENCE_SUSPECT}
	for step := range 5000 {
		k := parsedKey{kind: kindActual, id: fmt.Sprintf("guid-%d", rng.IntN(5)), index: int32(rng.IntN(4)), presence: presences[rng.IntN(len(presences))]}
		if rng.IntN(4) == 0 {
			st.del(k)
		} else {
			a := &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: k.id, Index: k.index}, Presence: k.presence}
			if cell := cells[rng.IntN(len(cells))]; cell != "" {
				a.InstanceKey = &modelsv1.ActualLRPInstanceKey{CellId: cell, InstanceGuid: fmt.Sprintf("i-%d", step)}
			}
			st.set(k, item{msg: a})
		}
		walked := map[string][]actualRef{}
		for guid, m := range st.actual {
			for sl, it := range m {
				if cell := cellOf(it); cell != "" {
					walked[cell] = append(walked[cell], actualRef{guid, sl})
				}
			}
		}
		indexed := map[string][]actualRef{}
		for cell, refs := range st.onCell {
			if len(refs) == 0 {
				t.Fatalf("step %d: an empty index entry for %s", step, cell)
			}
			for ref := range refs {
				indexed[cell] = append(indexed[cell], ref)
			}
		}
		order := func(a, b actualRef) int {
			if a.guid != b.guid {
				return cmp.Compare(a.guid, b.guid)
			}
			if a.slot.index != b.slot.index {
				return int(a.slot.index - b.slot.index)
			}
			return int(a.slot.presence - b.slot.presence)
		}
		for _, m := range []map[string][]actualRef{walked, indexed} {
			for _, refs := range m {
				slices.SortFunc(refs, order)
			}
		}
		if len(walked) != len(indexed) {
			t.Fatalf("step %d: %d cells hold records, the index has %d", step, len(walked), len(indexed))
		}
		for cell, refs := range walked {
			if !slices.Equal(refs, indexed[cell]) {
				t.Fatalf("step %d: %s holds %v, the index has %v", step, cell, refs, indexed[cell])
			}
		}
	}
}
