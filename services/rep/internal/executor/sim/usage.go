package sim

import (
	"context"
	"hash/fnv"
	"time"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

var _ executor.Measurable = (*container)(nil)

// simUsage is what a simulated container pretends to use: a steady share of a core and a
// fixed share of its memory and disk limits, picked from its guid (so each container differs
// and keeps its figures).
type simUsage struct {
	started  time.Time
	cpuShare float64 // of one core, 0.02 to 0.30
	memory   uint64
	disk     uint64
}

// simDefaultMB is what a container without a limit pretends to use.
const simDefaultMB = 64

func newSimUsage(spec executor.Spec) simUsage {
	h := fnv.New64a()
	_, _ = h.Write([]byte(spec.Guid))
	x := h.Sum64()
	frac := func(shift uint, lo, hi float64) float64 {
		return lo + (hi-lo)*float64((x>>shift)&0xffff)/0xffff
	}
	share := func(limitMB int32, f float64) uint64 {
		if limitMB <= 0 {
			return simDefaultMB << 20
		}
		return uint64(float64(int64(limitMB)<<20) * f)
	}
	return simUsage{
		started:  time.Now(),
		cpuShare: frac(0, 0.02, 0.30),
		memory:   share(spec.MemoryMB, frac(16, 0.3, 0.7)),
		disk:     share(spec.DiskMB, frac(32, 0.05, 0.3)),
	}
}

// Usage implements executor.Measurable with the container's synthetic figures.
func (c *container) Usage(context.Context) (executor.Usage, error) {
	u := c.usage
	return executor.Usage{
		CPU:         time.Duration(float64(time.Since(u.started)) * u.cpuShare),
		MemoryBytes: u.memory,
		DiskBytes:   u.disk,
	}, nil
}
