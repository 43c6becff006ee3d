// Package placement decides where work goes. It sees one auction round's snapshot of every
// cell (Cell), filters the cells that may run a piece of work (rootfs, placement constraint,
// resources), ranks the rest (zone spread, then Diego's score) and picks one; placing work
// updates the snapshot so the next item sees it. Each step is a small type in its own file;
// NewStack (stack.go) assembles them. When nothing fits, the Failure explains why, counting cells
// per reason.
package placement

import (
	"fmt"
	"strings"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Capacity is an amount of a cell's memory, disk and containers.
type Capacity struct {
	// MemoryMB is memory in mebibytes.
	MemoryMB int
	// DiskMB is disk in mebibytes.
	DiskMB int
	// Containers is a number of containers.
	Containers int
}

// Cell is one cell as an auction round sees it: what it offers, what it runs, and what this
// round has already placed on it.
type Cell struct {
	// ID identifies the cell.
	ID string
	// Address is the rep's gRPC address.
	Address string
	// Zone is the cell's availability zone.
	Zone string
	// Total is the cell's capacity.
	Total Capacity
	// Available is the capacity not yet reserved.
	Available Capacity
	// Tags are the cell's placement tags, lower-cased (see TagSet).
	Tags map[string]bool
	// PreloadedRootfses are the names of the cell's preloaded root filesystems.
	PreloadedRootfses map[string]bool
	// RootfsProviders are the rootfs URI schemes the cell can fetch, lower-cased.
	RootfsProviders map[string]bool
	// Instances counts the cell's instances per process guid.
	Instances map[string]int
	// Starting is how many containers are starting on the cell.
	Starting int
	// Evacuating is true while the cell drains; it takes no new work.
	Evacuating bool
	// Unreachable is true when the cell did not answer this round (State or Perform failed).
	Unreachable bool
	// PresenceLapsed is true when the cell's rep cannot confirm its presence in etcd: the cell
	// is about to disappear and takes no new work.
	PresenceLapsed bool
}

// Reserve records w as placed on c: it takes w's resources and a container, counts a starting
// container and, for an LRP instance, one more instance of its process guid.
func (c *Cell) Reserve(w *Work) {
	c.Available.MemoryMB -= w.MemoryMB
	c.Available.DiskMB -= w.DiskMB
	c.Available.Containers--
	c.Starting++
	if w.Kind == KindLRP {
		if c.Instances == nil {
			c.Instances = map[string]int{}
		}
		c.Instances[w.ProcessGuid]++
	}
}

// Release undoes Reserve, for work the cell did not take.
func (c *Cell) Release(w *Work) {
	c.Available.MemoryMB += w.MemoryMB
	c.Available.DiskMB += w.DiskMB
	c.Available.Containers++
	c.Starting--
	if w.Kind == KindLRP && c.Instances[w.ProcessGuid] > 0 {
		c.Instances[w.ProcessGuid]--
	}
}

// TagSet builds a set of placement tags, lower-cased and trimmed (tags compare
// case-insensitively).
func TagSet(tags ...string) map[string]bool {
	set := make(map[string]bool, len(tags))
	for _, t := range tags {
		if t = normTag(t); t != "" {
			set[t] = true
		}
	}
	return set
}

// NameSet builds a set of names compared exactly (preloaded rootfs names).
func NameSet(names ...string) map[string]bool {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set
}

func normTag(t string) string { return strings.ToLower(strings.TrimSpace(t)) }

// Kind says whether work is an LRP instance or a task.
type Kind int

// Kinds of work.
const (
	// KindLRP is one instance of a desired LRP.
	KindLRP Kind = iota + 1
	// KindTask is a task.
	KindTask
)

// Work is one LRP instance or one task to place.
type Work struct {
	// Kind says which of the identities below is set.
	Kind Kind
	// ProcessGuid names the desired LRP (KindLRP).
	ProcessGuid string
	// Index is the instance index (KindLRP).
	Index int32
	// TaskGuid names the task (KindTask).
	TaskGuid string
	// Domain is the work's domain.
	Domain string
	// MemoryMB is the memory the work reserves.
	MemoryMB int
	// DiskMB is the disk the work reserves.
	DiskMB int
	// MaxPids is the work's process limit, carried to the cell.
	MaxPids int32
	// Rootfs is the root filesystem URI the cell must support.
	Rootfs string
	// Require lists tags every eligible cell must carry.
	Require []string
	// Disallow lists tags no eligible cell may carry.
	Disallow []string
	// Trace is the W3C trace context of the request that asked for the work (pkg/tracing),
	// carried to the cell so that placing and starting it join that trace; nil for none.
	Trace *modelsv1.TraceContext
	// SpreadPeer (KindLRP, optional) counts another LRP's instances per cell id, which the zone
	// spread adds to this LRP's own: during a deployment, the old version's instances that
	// outlive the step (LRPStartRequest.spread_peer, resolved by the BBS). Cells not in the
	// round are ignored. All instances of one start request share the map; it is not changed.
	SpreadPeer map[string]int
}

// Key identifies the work for deduplication: "lrp/<process_guid>/<index>" or "task/<task_guid>".
func (w *Work) Key() string {
	if w.Kind == KindTask {
		return "task/" + w.TaskGuid
	}
	return fmt.Sprintf("lrp/%s/%d", w.ProcessGuid, w.Index)
}

// String names the work in logs, e.g. "lrp web/0" or "task t-1".
func (w *Work) String() string {
	if w.Kind == KindTask {
		return "task " + w.TaskGuid
	}
	return fmt.Sprintf("lrp %s/%d", w.ProcessGuid, w.Index)
}

// Failure is why work could not be placed, as reported to the BBS.
type Failure struct {
	// Code classifies the failure.
	Code modelsv1.PlacementError_Code
	// Message explains it to a human.
	Message string
}

// Error implements error.
func (f *Failure) Error() string { return f.Message }

// Proto converts f to the PlacementError stored on the instance or task.
func (f *Failure) Proto() *modelsv1.PlacementError {
	return &modelsv1.PlacementError{Code: f.Code, Message: f.Message}
}
