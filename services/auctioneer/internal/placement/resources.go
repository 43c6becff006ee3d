package placement

// Dimensions of capacity, as named in INSUFFICIENT_RESOURCES messages.
const (
	// DimMemory is memory.
	DimMemory = "memory"
	// DimDisk is disk.
	DimDisk = "disk"
	// DimContainers is the container count.
	DimContainers = "containers"
)

// Resources passes cells with room for the work: its memory, its disk and one container. A
// cell failing it gets one reason per exhausted dimension, named by DimMemory, DimDisk and
// DimContainers.
type Resources struct{}

// Passes implements FastFilter.
func (Resources) Passes(w *Work, c *Cell) bool {
	return c.Available.MemoryMB >= w.MemoryMB && c.Available.DiskMB >= w.DiskMB && c.Available.Containers >= 1
}

// Check implements Filter.
func (Resources) Check(w *Work, c *Cell) []Reason {
	var out []Reason
	if c.Available.MemoryMB < w.MemoryMB {
		out = append(out, Reason{One: DimMemory, Many: DimMemory})
	}
	if c.Available.DiskMB < w.DiskMB {
		out = append(out, Reason{One: DimDisk, Many: DimDisk})
	}
	if c.Available.Containers < 1 {
		out = append(out, Reason{One: DimContainers, Many: DimContainers})
	}
	return out
}
