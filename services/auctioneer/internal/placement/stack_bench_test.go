package placement

import (
	"fmt"
	"testing"
)

// BenchmarkSelectRound places one round of 10,000 instances (1,000 LRPs × 10, two rootfs
// classes) on 1,000 cells in three zones, as one auction round does: each item is selected
// and reserved so the next one sees it. It reports the time per item.
func BenchmarkSelectRound(b *testing.B) {
	const ncells, lrps, perLRP = 1000, 1000, 10
	s := NewStack()
	for b.Loop() {
		b.StopTimer()
		cells := make([]*Cell, ncells)
		for i := range cells {
			c := newCell(fmt.Sprintf("cell-%04d", i), fmt.Sprintf("z%d", i%3))
			c.Available = Capacity{MemoryMB: 1 << 20, DiskMB: 1 << 20, Containers: 1000}
			c.Total = c.Available
			c.PreloadedRootfses["cflinuxfs3"] = i%2 == 0
			cells[i] = c
		}
		works := make([]*Work, 0, lrps*perLRP)
		for g := 0; g < lrps; g++ {
			for i := 0; i < perLRP; i++ {
				w := lrpWork(fmt.Sprintf("lrp-%d", g), int32(i), 64)
				if g%2 == 0 {
					w.Rootfs = "preloaded:cflinuxfs3"
				}
				works = append(works, w)
			}
		}
		b.StartTimer()
		for _, w := range works {
			c, f := s.Select(w, cells, nil)
			if f != nil {
				b.Fatalf("%s: %s", w.Key(), f.Message)
			}
			c.Reserve(w)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*lrps*perLRP), "µs/item")
}
