package placement

import (
	"slices"
	"testing"
)

func TestResourcesFilter(t *testing.T) {
	tests := []struct {
		name      string
		available Capacity
		memory    int
		disk      int
		want      []string
	}{
		{"fits", Capacity{MemoryMB: 512, DiskMB: 1024, Containers: 1}, 512, 1024, nil},
		{"memory", Capacity{MemoryMB: 511, DiskMB: 1024, Containers: 1}, 512, 1024, []string{DimMemory}},
		{"disk", Capacity{MemoryMB: 512, DiskMB: 1000, Containers: 1}, 512, 1024, []string{DimDisk}},
		{"containers", Capacity{MemoryMB: 512, DiskMB: 1024, Containers: 0}, 512, 1024, []string{DimContainers}},
		{"all", Capacity{MemoryMB: 0, DiskMB: 0, Containers: 0}, 1, 1, []string{DimMemory, DimDisk, DimContainers}},
		{"zero-sized work still needs a container", Capacity{}, 0, 0, []string{DimContainers}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cell{ID: "c", Available: tc.available}
			w := &Work{Kind: KindTask, TaskGuid: "t", MemoryMB: tc.memory, DiskMB: tc.disk}
			var got []string
			for _, r := range (Resources{}).Check(w, c) {
				got = append(got, r.Many)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("lacking %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReserveAndRelease(t *testing.T) {
	c := newCell("c", "z1")
	w := lrpWork("web", 1, 256)
	c.Reserve(w)
	if c.Available != (Capacity{MemoryMB: 768, DiskMB: 3996, Containers: 9}) || c.Starting != 1 || c.Instances["web"] != 1 {
		t.Fatalf("after reserve: %+v starting=%d instances=%v", c.Available, c.Starting, c.Instances)
	}
	c.Release(w)
	if c.Available != c.Total || c.Starting != 0 || c.Instances["web"] != 0 {
		t.Fatalf("after release: %+v starting=%d instances=%v", c.Available, c.Starting, c.Instances)
	}
	task := taskWork("t", 100)
	c.Reserve(task)
	if len(c.Instances) != 1 || c.Instances["web"] != 0 || c.Starting != 1 {
		t.Fatalf("a task counted as an instance: %v", c.Instances)
	}
}
