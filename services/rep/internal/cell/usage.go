package cell

import (
	"context"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/logs"
)

// DefaultSampleInterval is how often SampleUsage measures every container by default.
const DefaultSampleInterval = 5 * time.Second

// usageSample is a container's latest resource sample; the zero value is "not sampled yet".
type usageSample struct {
	at         time.Time
	cpu        time.Duration // cumulative
	cpuPercent float64       // over the interval up to at, percent of one core
	memory     uint64
	disk       uint64
}

// SampleUsage returns a member that measures every started container whose backend reports
// its use (executor.Measurable) every interval, keeping the latest sample of each with its CPU
// use over the interval. A measurement that fails keeps the previous sample.
func (c *Cell) SampleUsage(interval time.Duration) func(ctx context.Context, ready func()) error {
	if interval <= 0 {
		interval = DefaultSampleInterval
	}
	return func(ctx context.Context, ready func()) error {
		ready()
		t := time.NewTicker(interval)
		defer t.Stop()
		var targets []usageTarget // one list for every pass: a pass of a cell holds its containers
		for {
			targets = c.sampleOnce(ctx, targets)
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}

// usageTarget is a container a usage pass measures, with its measurement.
type usageTarget struct {
	ctr *container
	m   executor.Measurable
	s   usageSample // measured; the zero sample if the measurement failed
}

// sampleOnce measures every started container once, outside the cell's lock, listing them in
// targets' array (grown as needed), which it returns emptied for the next pass.
func (c *Cell) sampleOnce(ctx context.Context, targets []usageTarget) []usageTarget {
	c.mu.Lock()
	if n := len(c.containers); cap(targets) < n {
		targets = make([]usageTarget, 0, n)
	}
	targets = targets[:0]
	for _, ctr := range c.containers {
		if m, ok := ctr.exec.(executor.Measurable); ok && ctr.phase != phaseCompleted {
			targets = append(targets, usageTarget{ctr: ctr, m: m})
		}
	}
	c.mu.Unlock()
	// Measured outside the lock, kept under it once for the whole pass: the cell's lock is
	// what placement (State, Perform) waits on.
	for i := range targets {
		tg := &targets[i]
		if ctx.Err() != nil {
			targets = targets[:i]
			break
		}
		u, err := tg.m.Usage(ctx)
		if err != nil {
			c.log.Debug("measure container", "guid", tg.ctr.guid, "error", err)
			continue // the previous sample is kept
		}
		tg.s = usageSample{at: time.Now(), cpu: u.CPU, memory: u.MemoryBytes, disk: u.DiskBytes}
	}
	c.mu.Lock()
	for _, tg := range targets {
		s := tg.s
		if s.at.IsZero() {
			continue
		}
		if prev := tg.ctr.usage; !prev.at.IsZero() {
			if wall := s.at.Sub(prev.at); wall > 0 && s.cpu > prev.cpu {
				s.cpuPercent = 100 * float64(s.cpu-prev.cpu) / float64(wall)
			}
		}
		tg.ctr.usage = s
	}
	c.mu.Unlock()
	// The list keeps no container past its pass: a removed one is not held until the next.
	clear(targets[:cap(targets)])
	return targets[:0]
}

// ContainerMetrics returns the latest sample of every container f selects (all containers
// when all is true), by process guid, index and instance guid; nil when none is selected.
func (c *Cell) ContainerMetrics(f logs.Filter, all bool) []*repv1.ContainerMetrics {
	c.mu.Lock()
	var out []*repv1.ContainerMetrics
	for _, ctr := range c.containers {
		if !all && !f.Matches(ctr.logKey()) {
			continue
		}
		k := ctr.logKey()
		m := &repv1.ContainerMetrics{ProcessGuid: k.ProcessGuid, Index: k.Index, InstanceGuid: k.InstanceGuid,
			TaskGuid: k.TaskGuid, State: ctr.phase.String(), CellId: c.cfg.CellID,
			MemoryLimitBytes: mibBytes(ctr.resources.GetMemoryMb()), DiskLimitBytes: mibBytes(ctr.resources.GetDiskMb())}
		if u := ctr.usage; !u.at.IsZero() {
			m.SampledAt = timestamppb.New(u.at)
			m.CpuPercent, m.CpuSeconds = u.cpuPercent, u.cpu.Seconds()
			m.MemoryBytes, m.DiskBytes = u.memory, u.disk
		}
		out = append(out, m)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GetProcessGuid() != b.GetProcessGuid() {
			return a.GetProcessGuid() < b.GetProcessGuid()
		}
		if a.GetIndex() != b.GetIndex() {
			return a.GetIndex() < b.GetIndex()
		}
		return a.GetInstanceGuid() < b.GetInstanceGuid()
	})
	return out
}

// mibBytes is n MiB in bytes (0 for none).
func mibBytes(n int32) uint64 {
	if n <= 0 {
		return 0
	}
	return uint64(n) << 20
}
