package cell

import (
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// Fixes the bulk loop makes, as passed to Observer.ReconcileFixed.
const (
	// FixRemoveRecord removes an instance record naming a container the cell does not hold.
	FixRemoveRecord = "remove_record"
	// FixFailTask completes as failed a task the BBS thinks runs here without a container.
	FixFailTask = "fail_task"
	// FixStopContainer stops a container the BBS does not know.
	FixStopContainer = "stop_container"
	// FixReportContainer reports a running instance the BBS has no record of (recorded as
	// an extra instance, see Cell.Reconcile).
	FixReportContainer = "report_container"
)

// Observer is told what the cell does, for metrics. Its methods are called from the cell's
// goroutines: they must be safe for concurrent use and must not block.
type Observer interface {
	// ContainerStarted is called when the backend started a container of kind.
	ContainerStarted(kind executor.Kind)
	// ContainerCrashed is called when a claimed LRP container ended (or failed to start)
	// without the rep stopping it.
	ContainerCrashed()
	// ContainerStopped is called once per container the rep stops itself (StopLRPInstance,
	// CancelTask, bulk, evacuation, shutdown).
	ContainerStopped(kind executor.Kind)
	// HookFailed is called when a hook of event (on_create, on_destroy) failed.
	HookFailed(event string)
	// Reconciled is called after every bulk reconcile with its duration; err is its failure.
	Reconciled(d time.Duration, err error)
	// ReconcileFixed is called for every repair of the bulk loop (FixRemoveRecord,
	// FixFailTask, FixStopContainer, FixReportContainer).
	ReconcileFixed(fix string)
}

// nopObserver ignores everything.
type nopObserver struct{}

func (nopObserver) ContainerStarted(executor.Kind)  {}
func (nopObserver) ContainerCrashed()               {}
func (nopObserver) ContainerStopped(executor.Kind)  {}
func (nopObserver) HookFailed(string)               {}
func (nopObserver) Reconciled(time.Duration, error) {}
func (nopObserver) ReconcileFixed(string)           {}

// Stats is a point-in-time view of the cell, for metrics.
type Stats struct {
	// Reserved, Starting, Running and Completing count the containers in each phase.
	Reserved, Starting, Running, Completing int
	// Total is the cell's capacity.
	Total *modelsv1.CellCapacity
	// Available is the capacity no container holds.
	Available *modelsv1.CellCapacity
	// Evacuating reports whether the cell drains.
	Evacuating bool
}

// Stats returns the containers by phase, the capacity and whether the cell evacuates.
func (c *Cell) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{Evacuating: c.evacuating}
	for _, ctr := range c.containers {
		switch ctr.phase {
		case phaseReserved:
			s.Reserved++
		case phaseStarting:
			s.Starting++
		case phaseRunning:
			s.Running++
		case phaseCompleted:
			s.Completing++
		}
	}
	memory, disk, containers := c.availableLocked()
	s.Available = &modelsv1.CellCapacity{MemoryMb: memory, DiskMb: disk, Containers: containers}
	s.Total = &modelsv1.CellCapacity{MemoryMb: c.cfg.Capacity.GetMemoryMb(), DiskMb: c.cfg.Capacity.GetDiskMb(), Containers: c.cfg.Capacity.GetContainers()}
	return s
}
