package placement

import (
	"math"
	"testing"
)

func TestDiegoScore(t *testing.T) {
	s := DiegoScore{StartingContainerWeight: DefaultStartingContainerWeight, LocalityWeight: DefaultLocalityWeight}
	total := Capacity{MemoryMB: 1000, DiskMB: 1000, Containers: 10}
	tests := []struct {
		name      string
		available Capacity
		starting  int
		instances int
		work      *Work
		want      float64
	}{
		// (0.1 + 0.1 + 0.1) / 3
		{"empty cell", total, 0, 0, &Work{Kind: KindTask, MemoryMB: 100, DiskMB: 100}, 0.1},
		// memory 0.6, disk 0.2, containers 0.6 → 1.4/3
		{"half used", Capacity{MemoryMB: 500, DiskMB: 900, Containers: 5}, 0, 0, &Work{Kind: KindTask, MemoryMB: 100, DiskMB: 100}, 1.4 / 3},
		{"starting containers", total, 3, 0, &Work{Kind: KindTask, MemoryMB: 100, DiskMB: 100}, 0.1 + 0.75},
		{"same LRP already there", total, 0, 2, &Work{Kind: KindLRP, ProcessGuid: "web", MemoryMB: 100, DiskMB: 100}, 0.1 + 2000},
		{"tasks ignore locality", total, 0, 2, &Work{Kind: KindTask, ProcessGuid: "web", MemoryMB: 100, DiskMB: 100}, 0.1},
		// a dimension without capacity counts as full: (1 + 0.1 + 0.1) / 3
		{"no memory capacity", Capacity{MemoryMB: 0, DiskMB: 1000, Containers: 10}, 0, 0, &Work{Kind: KindTask, DiskMB: 100}, 1.2 / 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cell{ID: "c", Total: total, Available: tc.available, Starting: tc.starting, Instances: map[string]int{"web": tc.instances}}
			if tc.name == "no memory capacity" {
				c.Total.MemoryMB = 0
			}
			if got := s.Score(tc.work, c, tc.instances); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("score %v, want %v", got, tc.want)
			}
		})
	}
}

func TestScorePrefersEmptierCell(t *testing.T) {
	s := DiegoScore{StartingContainerWeight: DefaultStartingContainerWeight, LocalityWeight: DefaultLocalityWeight}
	empty, busy := newCell("a", "z1"), newCell("b", "z1")
	busy.Available.MemoryMB = 512
	w := taskWork("t", 64)
	if s.Score(w, empty, 0) >= s.Score(w, busy, 0) {
		t.Fatal("a busier cell scored better than an empty one")
	}
}
