package placement

import (
	"fmt"
	"slices"
)

// proposalCells are the nine cells of the placement pools proposal: 1–4 "staging", 5–8
// "production", "skynet" on 1, 2, 5, 6 and 9. Each has 1 GiB of memory, 4 GiB of disk and 10
// containers free, cflinuxfs4 preloaded and the docker provider, in zones z1–z3 round robin.
func proposalCells() []*Cell {
	tags := map[int][]string{
		1: {"staging", "skynet"}, 2: {"staging", "skynet"}, 3: {"staging"}, 4: {"staging"},
		5: {"production", "skynet"}, 6: {"production", "skynet"}, 7: {"production"}, 8: {"production"},
		9: {"skynet"},
	}
	cells := make([]*Cell, 0, 9)
	for i := 1; i <= 9; i++ {
		cells = append(cells, newCell(fmt.Sprintf("cell-%d", i), fmt.Sprintf("z%d", (i-1)%3+1), tags[i]...))
	}
	return cells
}

// newCell is an empty cell with 1 GiB memory, 4 GiB disk, 10 containers.
func newCell(id, zone string, tags ...string) *Cell {
	capacity := Capacity{MemoryMB: 1024, DiskMB: 4096, Containers: 10}
	return &Cell{
		ID:                id,
		Zone:              zone,
		Total:             capacity,
		Available:         capacity,
		Tags:              TagSet(tags...),
		PreloadedRootfses: NameSet("cflinuxfs4"),
		RootfsProviders:   TagSet("docker"),
	}
}

func lrpWork(guid string, index int32, memory int) *Work {
	return &Work{Kind: KindLRP, ProcessGuid: guid, Index: index, Domain: "apps", MemoryMB: memory, DiskMB: 100, Rootfs: "preloaded:cflinuxfs4"}
}

func taskWork(guid string, memory int) *Work {
	return &Work{Kind: KindTask, TaskGuid: guid, Domain: "apps", MemoryMB: memory, DiskMB: 100, Rootfs: "preloaded:cflinuxfs4"}
}

// ids names cells by number ("cell-3" → 3), sorted.
func ids(cells []*Cell) []int {
	out := make([]int, 0, len(cells))
	for _, c := range cells {
		var n int
		fmt.Sscanf(c.ID, "cell-%d", &n)
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// passing are the cells f lets through for w.
func passing(f Filter, w *Work, cells []*Cell) []*Cell {
	var out []*Cell
	for _, c := range cells {
		if len(f.Check(w, c)) == 0 {
			out = append(out, c)
		}
	}
	return out
}
