package placement

import (
	"slices"
	"testing"
)

func TestZoneSpread(t *testing.T) {
	a1, a2 := newCell("a1", "a"), newCell("a2", "a")
	b1 := newCell("b1", "b")
	c1 := newCell("c1", "c")
	all := []*Cell{a1, a2, b1, c1}
	a1.Instances = map[string]int{"web": 1}
	b1.Instances = map[string]int{"web": 1, "other": 5}

	s := NewStack()
	w := lrpWork("web", 3, 64)
	if got, _ := s.Select(w, all, nil); got != c1 {
		t.Fatalf("chose %v, want c1: zone c runs no instance", got)
	}
	// Zone c cannot take it: a and b tie at one instance and are scored together, and a2
	// (holding none) beats a1 and b1 (holding one each).
	c1.Unreachable = true
	if got, _ := NewStack().Select(w, all, nil); got != a2 {
		t.Fatalf("chose %v, want a2", got)
	}
	// Instances on cells that cannot take the work still count for their zone: with a2 and
	// c1 left, zone c (no instance) wins although its cell's score is worse.
	c1.Unreachable, b1.Unreachable, a1.Unreachable = false, true, true
	c1.Starting = 3
	if got, _ := NewStack().Select(w, all, nil); got != c1 {
		t.Fatalf("chose %v, want c1", got)
	}
	// Tasks are not spread: the best score anywhere wins.
	if got, _ := NewStack().Select(taskWork("t", 64), all, nil); got != a2 {
		t.Fatalf("task chose %v, want a2", got)
	}
	if (ZoneSpread{}).Rank(taskWork("t", 64), 7) != 0 || (ZoneSpread{}).Rank(w, 7) != 7 {
		t.Fatal("rank: tasks rank alike, LRPs by their instances in the zone")
	}
}

func TestStackSpreadsInstancesAcrossZones(t *testing.T) {
	// Zone a has three big empty cells, zone b one small busy cell: spreading still puts the
	// second instance in zone b, although cells in zone a score better on resources.
	a1, a2, a3 := newCell("a1", "a"), newCell("a2", "a"), newCell("a3", "a")
	b1 := newCell("b1", "b")
	b1.Available.MemoryMB = 300
	cells := []*Cell{a1, a2, a3, b1}
	s := NewStack()
	var got []string
	for i := range 4 {
		w := lrpWork("web", int32(i), 128)
		c, f := s.Select(w, cells, nil)
		if f != nil {
			t.Fatalf("instance %d: %v", i, f)
		}
		c.Reserve(w)
		got = append(got, c.Zone)
	}
	// a, b (fewest instances), then a and b again: 2 per zone.
	if want := []string{"a", "b", "a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("zones %v, want %v", got, want)
	}
	// Within zone a the two instances landed on different cells.
	if a1.Instances["web"]+a2.Instances["web"]+a3.Instances["web"] != 2 || max(a1.Instances["web"], a2.Instances["web"], a3.Instances["web"]) != 1 {
		t.Fatalf("zone a instances: %d %d %d", a1.Instances["web"], a2.Instances["web"], a3.Instances["web"])
	}
}

// TestZoneSpreadCountsTheSpreadPeer: a spread peer's instances count in their cells' zones (not
// on the cell itself for the score), and a peer cell not in the round is ignored.
func TestZoneSpreadCountsTheSpreadPeer(t *testing.T) {
	a1, b1, c1, c2 := newCell("a1", "a"), newCell("b1", "b"), newCell("c1", "c"), newCell("c2", "c")
	all := []*Cell{a1, b1, c1, c2}
	a1.Instances = map[string]int{"web-v1": 2}
	b1.Instances = map[string]int{"web-v1": 2}
	c1.Instances = map[string]int{"web-v1": 2}
	w := lrpWork("web-v2", 0, 64)
	// Without a peer every zone holds none of web-v2: the lowest cell id wins.
	if got, _ := NewStack().Select(w, all, nil); got != a1 {
		t.Fatalf("without a peer chose %v, want a1", got)
	}
	// The peer's survivors are two in a and b, one in c (its other instance in c retires):
	// zone c wins. c1 and c2 are scored alike (the peer's instance on c1 is not web-v2's), so
	// the lower id wins.
	w.SpreadPeer = map[string]int{"a1": 2, "b1": 2, "c1": 1, "gone": 9}
	if got, _ := NewStack().Select(w, all, nil); got != c1 {
		t.Fatalf("with the peer chose %v, want c1", got)
	}
	// The peer adds to the LRP's own instances: one web-v2 in zone c makes it two there, and
	// the zones tie at two: a1 wins by id.
	c2.Instances = map[string]int{"web-v2": 1}
	if got, _ := NewStack().Select(w, all, nil); got != a1 {
		t.Fatalf("with the peer and an instance in c chose %v, want a1", got)
	}
	// Another LRP in the same round without a peer is not affected by the memo (the same
	// stack and cells).
	s := NewStack()
	if got, _ := s.Select(w, all, nil); got != a1 {
		t.Fatalf("chose %v, want a1", got)
	}
	w2 := lrpWork("web-v2", 1, 64)
	w2.SpreadPeer = map[string]int{"a1": 3, "b1": 2, "c1": 2}
	if got, _ := s.Select(w2, all, nil); got != b1 {
		t.Fatalf("second item with another peer count chose %v, want b1", got)
	}
	if got, _ := s.Select(lrpWork("other", 0, 64), all, nil); got != a1 {
		t.Fatalf("an LRP without a peer chose %v, want a1", got)
	}
}

// TestRollingStepsKeepTheAppSpread plays a rolling deployment of 6 instances over 3 zones (two
// cells each) as nsync drives it with max_in_flight 1: at each step the new version's next
// index is placed with the old version's survivors (index < 6 - new_desired) as its spread
// peer, then the old version's highest index is retired. The app's instances (both versions)
// must never be more than one apart between zones, during the surge or after the retirement.
// Without the peer the same rollout leaves a zone two above another, which is what the peer
// fixes.
func TestRollingStepsKeepTheAppSpread(t *testing.T) {
	for _, withPeer := range []bool{true, false} {
		cells := []*Cell{
			newCell("a1", "a"), newCell("a2", "a"), newCell("b1", "b"), newCell("b2", "b"), newCell("c1", "c"), newCell("c2", "c"),
		}
		s := NewStack()
		const n = 6
		old := make([]*Cell, n) // the cell of each old index
		for i := range n {
			w := lrpWork("web-v1", int32(i), 64)
			c, f := s.Select(w, cells, nil)
			if f != nil {
				t.Fatal(f)
			}
			c.Reserve(w)
			old[i] = c
		}
		// A placement order that the old version's retirement order does not follow: swap the
		// cells of indices so that the two highest indices share a zone.
		old[3], old[4] = old[4], old[3]
		skew := func(oldLeft int, fresh []*Cell) int {
			per := map[string]int{"a": 0, "b": 0, "c": 0}
			for _, c := range old[:oldLeft] {
				per[c.Zone]++
			}
			for _, c := range fresh {
				per[c.Zone]++
			}
			lo, hi := n, 0
			for _, k := range per {
				lo, hi = min(lo, k), max(hi, k)
			}
			return hi - lo
		}
		if got := skew(n, nil); got != 0 {
			t.Fatalf("old version placed with skew %d", got)
		}
		worst := 0
		var fresh []*Cell
		for h := 0; h < n; h++ {
			newDesired := h + 1
			w := lrpWork("web-v2", int32(h), 64)
			if withPeer {
				w.SpreadPeer = map[string]int{}
				for _, c := range old[:n-newDesired] {
					w.SpreadPeer[c.ID]++
				}
			}
			c, f := s.Select(w, cells, nil)
			if f != nil {
				t.Fatal(f)
			}
			c.Reserve(w)
			fresh = append(fresh, c)
			surge := skew(n-h, fresh) // old_desired is still 6-h while the new one starts
			old[n-newDesired].Release(lrpWork("web-v1", int32(n-newDesired), 64))
			retired := skew(n-newDesired, fresh)
			worst = max(worst, surge, retired)
			if withPeer && (surge > 1 || retired > 1) {
				t.Fatalf("step %d: app skew %d during the surge, %d after the retirement; want at most 1", h, surge, retired)
			}
		}
		if !withPeer && worst < 2 {
			t.Fatalf("without a peer the app skew stayed at %d; the scenario no longer shows what the peer fixes", worst)
		}
	}
}
