package process

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

var _ executor.Measurable = (*container)(nil)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// Usage implements executor.Measurable. With a cgroup it reads the cgroup's cpu.stat and
// memory.current; without one (cgroup v1 hosts, or no write access) it adds up the /proc
// entries of the processes in the container's process groups: their CPU time and that of
// their waited-for children, and their resident sets. Disk is what the container directory
// holds (for a chrooted container on a shared rootfs, its own directory only).
func (c *container) Usage(ctx context.Context) (executor.Usage, error) {
	var u executor.Usage
	if c.cg != nil {
		u.CPU, u.MemoryBytes = cgroupUsage(c.cg.path)
	} else {
		u.CPU, u.MemoryBytes = procUsage(c.groups())
	}
	u.DiskBytes = executor.DirSize(ctx, c.dir)
	return u, nil
}

// cgroupUsage reads a cgroup v2 group's CPU time and memory in use; what it cannot read is 0.
func cgroupUsage(path string) (time.Duration, uint64) {
	var cpu time.Duration
	if b, err := os.ReadFile(filepath.Join(path, "cpu.stat")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				cpu = time.Duration(n) * time.Microsecond
			}
		}
	}
	var mem uint64
	if b, err := os.ReadFile(filepath.Join(path, "memory.current")); err == nil {
		mem, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	return cpu, mem
}

// procUsage adds up the CPU time (user and system, with the waited-for children's) and the
// resident set of every process whose process group is one of groups. A process that left its
// group (setsid) is not counted.
func procUsage(groups []int) (time.Duration, uint64) {
	if len(groups) == 0 {
		return 0, 0
	}
	in := make(map[int]bool, len(groups))
	for _, g := range groups {
		in[g] = true
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0
	}
	page := uint64(os.Getpagesize())
	var ticks, rss uint64
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // it exited
		}
		f := statFields(b)
		// After the command: state(0) ppid(1) pgrp(2) ... utime(11) stime(12) cutime(13)
		// cstime(14) ... rss(21).
		if len(f) < 22 {
			continue
		}
		pgrp, _ := strconv.Atoi(f[2])
		if !in[pgrp] {
			continue
		}
		for _, i := range []int{11, 12, 13, 14} {
			n, _ := strconv.ParseUint(f[i], 10, 64)
			ticks += n
		}
		n, _ := strconv.ParseUint(f[21], 10, 64)
		rss += n * page
	}
	return time.Duration(ticks) * clockTick, rss
}

// statFields splits /proc/<pid>/stat after the command name (which may hold spaces and
// parentheses).
func statFields(b []byte) []string {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}
