package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// referenceSelect is Select written out plainly, as it was before its round memo and single
// pass: every filter asked with Check for every cell, the fitting cells collected, narrowed to
// the zones running the fewest instances of the LRP (counted over every cell), and scored with
// the instances read from each cell. The differential tests hold Select to it.
func referenceSelect(s *Stack, w *Work, cells []*Cell, refused Refused) (*Cell, *Failure) {
	t := tally{total: len(cells)}
	var fits []*Cell
	for _, c := range cells {
		var rs []Reason
		for _, f := range s.compatible {
			if rs = f.Check(w, c); len(rs) > 0 {
				break
			}
		}
		if len(rs) > 0 {
			t.incompatible(rs)
			continue
		}
		t.compatible++
		if rs := firstFailure(w, c, refused, s.available); rs != nil {
			t.unavailable(rs)
			continue
		}
		if rs := firstFailure(w, c, nil, s.capacity); rs != nil {
			t.full(rs)
			continue
		}
		fits = append(fits, c)
	}
	if len(fits) == 0 {
		return nil, t.failure()
	}
	if w.Kind == KindLRP {
		perZone := map[string]int{}
		for _, c := range cells {
			perZone[c.Zone] += c.Instances[w.ProcessGuid] + w.SpreadPeer[c.ID]
		}
		fewest := -1
		for _, c := range fits {
			if n := perZone[c.Zone]; fewest < 0 || n < fewest {
				fewest = n
			}
		}
		fits = slices.DeleteFunc(fits, func(c *Cell) bool { return perZone[c.Zone] != fewest })
	}
	var best *Cell
	var bestScore float64
	for _, c := range fits {
		same := 0
		if w.Kind == KindLRP {
			same = c.Instances[w.ProcessGuid]
		}
		sc := s.score.Score(w, c, same)
		if best == nil || sc < bestScore || (sc == bestScore && c.ID < best.ID) {
			best, bestScore = c, sc
		}
	}
	return best, nil
}

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

// TestSelectChoosesAsTheReference: over random rounds (cells in up to four zones with random
// room, tags and rootfses, instances already placed, unreachable and evacuating cells; LRPs and
// tasks of varied sizes, rootfses and constraints; reservations, some releases and refused
// retries, and several rounds through one stack), Select chooses exactly the cell, or gives
// exactly the failure, that the reference gives.
func TestSelectChoosesAsTheReference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	fast, slow := NewStack(), NewStack()
	tagPool := []string{"staging", "production", "gpu"}
	for round := 0; round < 300; round++ {
		uniform := round%3 == 0 // identical empty cells: scores tie, and the lowest id must win
		var cells []*Cell
		for i := 0; i < 1+r.IntN(40); i++ {
			var tags []string
			for _, tag := range tagPool {
				if r.IntN(3) == 0 {
					tags = append(tags, tag)
				}
			}
			c := newCell(fmt.Sprintf("cell-%d", i), fmt.Sprintf("z%d", r.IntN(4)), tags...)
			if r.IntN(4) == 0 {
				c.PreloadedRootfses = NameSet("cflinuxfs3")
			}
			c.Available = Capacity{MemoryMB: 128 * r.IntN(9), DiskMB: 100 * r.IntN(40), Containers: r.IntN(10)}
			if r.IntN(3) == 0 { // a few cells of another shape, so totals differ
				c.Total = Capacity{MemoryMB: 4096, DiskMB: 8192, Containers: 40}
			}
			c.Starting = r.IntN(3)
			c.Instances = map[string]int{}
			for g := 0; g < 3; g++ {
				if r.IntN(3) == 0 {
					c.Instances[fmt.Sprintf("lrp-%d", g)] = 1 + r.IntN(2)
				}
			}
			c.Unreachable = r.IntN(15) == 0
			c.Evacuating = r.IntN(15) == 0
			c.PresenceLapsed = r.IntN(15) == 0
			if uniform {
				c = newCell(c.ID, c.Zone)
			}
			cells = append(cells, c)
		}
		r.Shuffle(len(cells), func(i, j int) { cells[i], cells[j] = cells[j], cells[i] })
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
				if r.IntN(3) == 0 { // a spread peer on some cells, and one on a cell not in the round
					w.SpreadPeer = map[string]int{"gone": 3}
					for _, c := range cells {
						if r.IntN(4) == 0 {
							w.SpreadPeer[c.ID] = r.IntN(3)
						}
					}
				}
			}
			if r.IntN(6) == 0 {
				w.Rootfs = "preloaded:cflinuxfs3"
			}
			if r.IntN(4) == 0 {
				w.Require = []string{tagPool[r.IntN(len(tagPool))]}
			}
			if r.IntN(6) == 0 {
				w.Disallow = []string{tagPool[r.IntN(len(tagPool))]}
			}
			var fr, sr Refused
			if len(placed) > 0 && r.IntN(6) == 0 {
				p := placed[r.IntN(len(placed))]
				fr, sr = Refused{p.f.ID: true}, Refused{p.s.ID: true}
			}
			f, ff := fast.Select(w, fc, fr)
			s, sf := referenceSelect(slow, w, sc, sr)
			if (f == nil) != (s == nil) || (f != nil && f.ID != s.ID) || (ff != nil) != (sf != nil) ||
				(ff != nil && (ff.Message != sf.Message || ff.Code != sf.Code)) {
				t.Fatalf("round %d item %d (%s): Select chose %v (%v), the reference %v (%v)", round, i, w, f, ff, s, sf)
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

// TestFastFiltersAgreeWithTheirReasons: for every fast filter, Passes is exactly "Check gives no
// reason", over random cells and work.
func TestFastFiltersAgreeWithTheirReasons(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	filters := map[string]FastFilter{
		"Resources": Resources{}, "Reachable": Reachable{}, "NotEvacuating": NotEvacuating{}, "PresenceHeld": PresenceHeld{},
		"Refused": Refused{"cell-1": true},
	}
	for i := 0; i < 2000; i++ {
		c := newCell(fmt.Sprintf("cell-%d", r.IntN(3)), "z1")
		c.Available = Capacity{MemoryMB: r.IntN(300), DiskMB: r.IntN(300), Containers: r.IntN(3)}
		c.Unreachable, c.Evacuating, c.PresenceLapsed = r.IntN(2) == 0, r.IntN(2) == 0, r.IntN(2) == 0
		w := &Work{Kind: KindLRP, ProcessGuid: "web", MemoryMB: r.IntN(300), DiskMB: r.IntN(300)}
		for name, f := range filters {
			if got, want := f.Passes(w, c), len(f.Check(w, c)) == 0; got != want {
				t.Fatalf("%s: Passes %v, Check %v on %+v for %+v", name, got, f.Check(w, c), c, w)
			}
		}
	}
}

// TestSelectAllocatesNothingWhenItPlaces: once a round's memo holds the item's class and LRP,
// placing allocates nothing, whatever the number of cells.
func TestSelectAllocatesNothingWhenItPlaces(t *testing.T) {
	cells := make([]*Cell, 500)
	for i := range cells {
		cells[i] = newCell(fmt.Sprintf("cell-%03d", i), fmt.Sprintf("z%d", i%3))
		cells[i].Available.Containers = 1000
		cells[i].Available.MemoryMB = 1 << 20
		cells[i].Instances = map[string]int{"web": 0} // so Reserve allocates no map either
	}
	cells[7].Available.Containers = 0 // a full cell is skipped without its reasons
	s := NewStack()
	w := lrpWork("web", 0, 64)
	if _, f := s.Select(w, cells, nil); f != nil {
		t.Fatal(f)
	}
	if n := testing.AllocsPerRun(100, func() {
		c, _ := s.Select(w, cells, nil)
		c.Reserve(w)
	}); n != 0 {
		t.Fatalf("%v allocations per placement", n)
	}
}
