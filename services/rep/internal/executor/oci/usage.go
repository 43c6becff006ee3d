package oci

import (
	"context"
	"fmt"
	"strings"
	"time"

	cgroupsv1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroupsv2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

var _ executor.Measurable = (*container)(nil)

// Usage implements executor.Measurable from the containerd task's metrics (its cgroup, v1 or
// v2): CPU time, and memory as the working set (usage less inactive file pages, as cAdvisor
// and the kubelet count it); disk is what the container's overlay upper directory holds.
func (c *container) Usage(ctx context.Context) (executor.Usage, error) {
	m, err := c.task.Metrics(c.b.ctx(ctx))
	if err != nil {
		return executor.Usage{}, fmt.Errorf("task metrics: %w", err)
	}
	var u executor.Usage
	data := m.GetData()
	switch {
	case strings.HasSuffix(data.GetTypeUrl(), "cgroups.v1.Metrics"):
		var s cgroupsv1.Metrics
		if err := proto.Unmarshal(data.GetValue(), &s); err != nil {
			return u, fmt.Errorf("task metrics: %w", err)
		}
		u.CPU = time.Duration(s.GetCPU().GetUsage().GetTotal())
		u.MemoryBytes = workingSet(s.GetMemory().GetUsage().GetUsage(), s.GetMemory().GetTotalInactiveFile())
	case strings.HasSuffix(data.GetTypeUrl(), "cgroups.v2.Metrics"):
		var s cgroupsv2.Metrics
		if err := proto.Unmarshal(data.GetValue(), &s); err != nil {
			return u, fmt.Errorf("task metrics: %w", err)
		}
		u.CPU = time.Duration(s.GetCPU().GetUsageUsec()) * time.Microsecond
		u.MemoryBytes = workingSet(s.GetMemory().GetUsage(), s.GetMemory().GetInactiveFile())
	default:
		return u, fmt.Errorf("task metrics: unknown type %q", data.GetTypeUrl())
	}
	u.DiskBytes = executor.DirSize(ctx, c.ov.upper)
	return u, nil
}

// workingSet is usage less the inactive file pages (never below zero).
func workingSet(usage, inactiveFile uint64) uint64 {
	if inactiveFile > usage {
		return 0
	}
	return usage - inactiveFile
}
