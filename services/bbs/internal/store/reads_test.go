package store

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/labels"
)

// cellListState is a state of guids LRPs of instances instances each, in two domains and
// labelled by parity, spread over cells cells (a tenth unclaimed, some evacuating or suspect).
func cellListState(t testing.TB, rng *rand.Rand, guids, instances, cells int) *state {
	t.Helper()
	st := newState()
	presences := []modelsv1.ActualLRP_Presence{modelsv1.ActualLRP_PRESENCE_ORDINARY, modelsv1.ActualLRP_PRESENCE_EVACUATING, modelsv1.ActualLRP_PRESENCE_SUSPECT}
	for g := range guids {
		guid := fmt.Sprintf("guid-%05d", g)
		st.set(parsedKey{kind: kindSched, id: guid}, item{msg: &modelsv1.DesiredLRPSchedulingInfo{
			ProcessGuid: guid, Labels: map[string]string{"parity": fmt.Sprint(g % 2)}}})
		for i := range instances {
			p := presences[0]
			if rng.IntN(8) == 0 {
				p = presences[1+rng.IntN(2)]
			}
			k := parsedKey{kind: kindActual, id: guid, index: int32(i), presence: p}
			a := &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: guid, Index: int32(i), Domain: fmt.Sprintf("d%d", g%3)}, Presence: p}
			if rng.IntN(10) != 0 {
				a.InstanceKey = &modelsv1.ActualLRPInstanceKey{CellId: fmt.Sprintf("cell-%04d", rng.IntN(cells)), InstanceGuid: fmt.Sprintf("i-%d-%d", g, i)}
			}
			st.set(k, item{msg: a})
		}
	}
	return st
}

// TestActualLRPsOnCellListsWhatAWalkFinds checks that a list naming a cell, read from the
// index by cell, holds exactly the records, in the same order, that a walk of every record
// finds on that cell, alone and with every other filter (guids, index, domain, selector), and
// after records move, leave or lose their cell.
func TestActualLRPsOnCellListsWhatAWalkFinds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	st := cellListState(t, rng, 60, 8, 6)
	odd, err := labels.Parse("parity=1")
	if err != nil {
		t.Fatal(err)
	}
	idx := int32(3)
	filters := []ListFilter{
		{},
		{Guids: map[string]struct{}{"guid-00001": {}, "guid-00007": {}, "guid-00042": {}, "missing": {}}},
		{Index: &idx},
		{Domain: "d1"},
		{Selector: odd},
		{Domain: "d2", Selector: odd, Index: &idx},
	}
	check := func(round int) {
		t.Helper()
		for c := range 7 { // cell-0006 holds nothing
			cell := fmt.Sprintf("cell-%04d", c)
			for fi, f := range filters {
				var walked []*modelsv1.ActualLRP
				eachActual(st, &f, func(it item) {
					if a := it.msg.(*modelsv1.ActualLRP); a.GetInstanceKey().GetCellId() == cell {
						walked = append(walked, a)
					}
				})
				f.CellID = cell
				var listed []*modelsv1.ActualLRP
				eachActual(st, &f, func(it item) { listed = append(listed, it.msg.(*modelsv1.ActualLRP)) })
				if !slices.Equal(walked, listed) {
					t.Fatalf("round %d, %s, filter %d: a walk finds %d records, the index lists %d (or in another order)", round, cell, fi, len(walked), len(listed))
				}
			}
		}
	}
	check(0)
	for round := 1; round <= 3; round++ {
		for range 100 {
			k := parsedKey{kind: kindActual, id: fmt.Sprintf("guid-%05d", rng.IntN(60)), index: int32(rng.IntN(8)), presence: modelsv1.ActualLRP_PRESENCE_ORDINARY}
			switch rng.IntN(3) {
			case 0:
				st.del(k)
			case 1: // unclaimed again
				st.set(k, item{msg: &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: k.id, Index: k.index, Domain: "d0"}}})
			default: // moved to another cell
				st.set(k, item{msg: &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: k.id, Index: k.index, Domain: "d1"},
					InstanceKey: &modelsv1.ActualLRPInstanceKey{CellId: fmt.Sprintf("cell-%04d", rng.IntN(6)), InstanceGuid: "moved"}}})
			}
		}
		check(round)
	}
}

// BenchmarkActualLRPsOnCell is one cell's list of its instance records (what its rep's
// reconcile asks every bulk interval) in a cache of 250,000 records on 5,000 cells: read from
// the index by cell, and, for comparison, by the walk of every record that answered it before.
func BenchmarkActualLRPsOnCell(b *testing.B) {
	const guids, instances, cells = 25_000, 10, 5_000
	st := cellListState(b, rand.New(rand.NewPCG(5, 6)), guids, instances, cells)
	for _, mode := range []string{"index", "walk"} {
		b.Run(mode, func(b *testing.B) {
			n := 0
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				cell := fmt.Sprintf("cell-%04d", i%cells)
				if mode == "index" {
					f := ListFilter{CellID: cell}
					eachActual(st, &f, func(item) { n++ })
					continue
				}
				eachActual(st, &ListFilter{}, func(it item) {
					if cellOf(it) == cell {
						n++
					}
				})
			}
			if n == 0 {
				b.Fatal("no record listed")
			}
		})
	}
}

// TestTasksOnCellListsWhatAWalkFinds sets and deletes tasks at random (pending on no cell,
// placed, moved, removed) and checks after each round that the index by cell holds exactly the
// tasks each cell runs, with no empty entry, and that a list naming a cell, alone or with a
// domain or guids, finds what a walk of every task finds there.
func TestTasksOnCellListsWhatAWalkFinds(t *testing.T) {
	st := newState()
	rng := rand.New(rand.NewPCG(7, 8))
	cells := []string{"", "cell-a", "cell-b", "cell-c"}
	filters := []ListFilter{{}, {Domain: "d1"}, {Guids: map[string]struct{}{"task-01": {}, "task-02": {}, "task-19": {}, "missing": {}}}}
	for round := range 50 {
		for range 20 {
			k := parsedKey{kind: kindTask, id: fmt.Sprintf("task-%02d", rng.IntN(30))}
			if rng.IntN(4) == 0 {
				st.del(k)
				continue
			}
			st.set(k, item{msg: &modelsv1.Task{TaskGuid: k.id, Domain: fmt.Sprintf("d%d", rng.IntN(2)), CellId: cells[rng.IntN(len(cells))]}})
		}
		for cell, guids := range st.tasksOn {
			if len(guids) == 0 {
				t.Fatalf("round %d: an empty index entry for %s", round, cell)
			}
			for g := range guids {
				if got := st.tasks[g].msg.(*modelsv1.Task).GetCellId(); got != cell {
					t.Fatalf("round %d: the index has %s on %s, the task is on %q", round, g, cell, got)
				}
			}
		}
		for _, cell := range cells[1:] {
			for fi, f := range filters {
				var walked []*modelsv1.Task
				for _, task := range tasksOf(st, &f) {
					if task.GetCellId() == cell {
						walked = append(walked, task)
					}
				}
				f.CellID = cell
				if listed := tasksOf(st, &f); !slices.Equal(walked, listed) {
					t.Fatalf("round %d, %s, filter %d: a walk finds %d tasks, the index lists %d (or in another order)", round, cell, fi, len(walked), len(listed))
				}
			}
		}
	}
}
