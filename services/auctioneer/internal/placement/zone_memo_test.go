package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// cloneCells deep-copies a round's cells.
func cloneCells(cells []*Cell) []*Cell {
	out := make([]*Cell, len(cells))
	for i, c := range cells {
		cp := *c
		cp.Instances = map[string]int{}
		for g, n := range c.Instances {
			cp.Instances[g] = n
		}
		out[i] = &cp
	}
	return out
}

// TestZoneMemoChoosesAsTheFullCount: over random rounds (cells in three zones with random
// room, instances already placed, unreachable and evacuating cells; LRPs and tasks of varied
// sizes; reservations, some releases and refused retries), the stack with its per-round zone
// memo chooses exactly the cell, or gives exactly the failure, that counting every cell for every
// item gives.
func TestZoneMemoChoosesAsTheFullCount(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for round := 0; round < 200; round++ {
		var cells []*Cell
		for i := 0; i < 5+r.IntN(40); i++ {
			c := newCell(fmt.Sprintf("cell-%d", i), fmt.Sprintf("z%d", r.IntN(3)))
			c.Available = Capacity{MemoryMB: 128 * r.IntN(9), DiskMB: 4096, Containers: r.IntN(10)}
			c.Starting = r.IntN(3)
			c.Instances = map[string]int{}
			for g := 0; g < 3; g++ {
				if r.IntN(3) == 0 {
					c.Instances[fmt.Sprintf("lrp-%d", g)] = 1 + r.IntN(2)
				}
			}
			c.Unreachable = r.IntN(15) == 0
			c.Evacuating = r.IntN(15) == 0
			cells = append(cells, c)
		}
		fast, slow := NewStack(), NewStack()
		slow.spread = ZoneSpread{}
		fc, sc := cloneCells(cells), cloneCells(cells)
		type placedWork struct {
			w    *Work
			f, s *Cell
		}
		var placed []placedWork
		for i := 0; i < 60; i++ {
			var w *Work
			if r.IntN(5) == 0 {
				w = taskWork(fmt.Sprintf("task-%d", i), 64*(1+r.IntN(3)))
			} else {
				w = lrpWork(fmt.Sprintf("lrp-%d", r.IntN(6)), int32(i), 64*(1+r.IntN(3)))
			}
			var fr, sr Refused
			if len(placed) > 0 && r.IntN(6) == 0 {
				p := placed[r.IntN(len(placed))]
				fr, sr = Refused{p.f.ID: true}, Refused{p.s.ID: true}
			}
			f, ff := fast.Select(w, fc, fr)
			s, sf := slow.Select(w, sc, sr)
			if (f == nil) != (s == nil) || (f != nil && f.ID != s.ID) || (ff != nil) != (sf != nil) || (ff != nil && ff.Message != sf.Message) {
				t.Fatalf("round %d item %d (%s): memo chose %v (%v), full count %v (%v)", round, i, w, f, ff, s, sf)
			}
			if f == nil {
				continue
			}
			f.Reserve(w)
			s.Reserve(w)
			placed = append(placed, placedWork{w, f, s})
			if r.IntN(8) == 0 {
				j := r.IntN(len(placed))
				p := placed[j]
				p.f.Release(p.w)
				p.s.Release(p.w)
				placed = append(placed[:j], placed[j+1:]...)
			}
		}
	}
}
