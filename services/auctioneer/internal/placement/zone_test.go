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
