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

	w := lrpWork("web", 3, 64)
	if got := (ZoneSpread{}).Narrow(w, all, all); !sameIDs(got, "c1") {
		t.Fatalf("narrowed to %v, want zone c only", cellIDs(got))
	}
	// Zone c cannot take it: a2 and b1's zones tie at one instance and are tried together.
	if got := (ZoneSpread{}).Narrow(w, []*Cell{a1, a2, b1}, all); !sameIDs(got, "a1", "a2", "b1") {
		t.Fatalf("narrowed to %v, want zones a and b", cellIDs(got))
	}
	// Instances on cells that cannot take the work still count for their zone.
	if got := (ZoneSpread{}).Narrow(w, []*Cell{a2, c1}, all); !sameIDs(got, "c1") {
		t.Fatalf("narrowed to %v, want c1", cellIDs(got))
	}
	// Tasks are not spread.
	if got := (ZoneSpread{}).Narrow(taskWork("t", 64), all, all); len(got) != 4 {
		t.Fatalf("task narrowed to %v", cellIDs(got))
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

func cellIDs(cells []*Cell) []string {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = c.ID
	}
	slices.Sort(out)
	return out
}

func sameIDs(cells []*Cell, want ...string) bool {
	slices.Sort(want)
	return slices.Equal(cellIDs(cells), want)
}
