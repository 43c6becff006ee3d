// Package plan is convergence's decision, kept pure: from a snapshot of desired LRPs, actual
// LRPs, tasks, cell presences, domains and the time, Make returns the changes that repair the
// difference. It reads no store and writes nothing; core applies each change as one
// compare-and-swap transaction that re-checks the change's rule on the data it reads.
//
// LRP rules:
//   - missing: a desired index without an ordinary record gets an UNCLAIMED instance (CreateMissing);
//   - extra: an ordinary record no longer desired (its LRP is gone or its index is past the
//     instance count) is retired, but only while its domain is fresh (RetireExtra);
//   - stale UNCLAIMED: an UNCLAIMED instance with a placement error, or UNCLAIMED for the
//     unclaimed timeout, is auctioned again (AuctionLRP);
//   - crashes: a CRASHED instance is restarted once its backoff has passed (RestartCrashed,
//     pkg/models restart policy);
//   - vanished cells: a CLAIMED or RUNNING instance on a cell without presence is replaced, a
//     RUNNING one being kept as a SUSPECT copy meanwhile (MarkSuspect);
//   - stale CLAIMED: an instance CLAIMED for the claimed timeout on a cell that is present (its
//     rep claimed it and never reported it running, nor gave it up) is unclaimed and auctioned
//     again (UnclaimStale), so it reaches RUNNING in bounded time whatever the rep's bulk
//     interval;
//   - SUSPECT copies are removed once their replacement runs or their slot is no longer desired
//     (RemoveSuspect), and promoted back when their cell returns first (PromoteSuspect);
//   - EVACUATING copies are removed once their cell is gone or their slot is no longer desired
//     (RemoveEvacuating), unless they are draining on a present cell (their rep finishes that);
//   - draining records (draining_since set: withdrawn from routing before a stop) are finished
//     once the drain timeout has passed, or at once when their cell is gone (FinishDrain): the
//     BBS that began the drain may have died before stopping them. They are not retired again.
//
// Task rules: a PENDING task is failed when not started within the pending timeout
// (ExpirePendingTask), else auctioned again after the unclaimed timeout (AuctionTask); a RUNNING
// task on a cell without presence is failed (FailTaskOnVanishedCell); a COMPLETED or RESOLVING
// task is deleted after the completed timeout (DeleteTask), else its completion callback is
// retried after the unclaimed timeout (RetryTaskCallback).
package plan

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
)

// Snapshot is the state one convergence pass judges.
type Snapshot struct {
	// Desired is the scheduling info of every desired LRP.
	Desired []*modelsv1.DesiredLRPSchedulingInfo
	// Actual is every actual LRP record (ordinary, SUSPECT and EVACUATING).
	Actual []*modelsv1.ActualLRP
	// Tasks is every task.
	Tasks []*modelsv1.Task
	// Cells is the presence of every live cell.
	Cells []*modelsv1.CellPresence
	// Domains is every fresh domain.
	Domains []*modelsv1.Domain
	// Now is the time the pass judges at.
	Now time.Time
}

// Timeouts are the ages at which convergence acts.
type Timeouts struct {
	// Unclaimed is how long an instance stays UNCLAIMED (and a task PENDING, and a completed
	// task's callback waits) before it is retried.
	Unclaimed time.Duration
	// PendingTask fails a task not started this long after it was created.
	PendingTask time.Duration
	// CompletedTask deletes a completed or resolving task this long after it first completed.
	CompletedTask time.Duration
	// Claimed is how long an instance may stay CLAIMED on a present cell before it is unclaimed
	// and auctioned again; zero never does.
	Claimed time.Duration
	// Drain is the drain timeout: a record draining this long is finished (FinishDrain).
	Drain time.Duration
}

// Found counts what a pass found wrong, whether or not it acts on it.
type Found struct {
	// LRPsMissing counts desired instances without an ordinary record.
	LRPsMissing int
	// LRPsExtra counts ordinary records no longer desired (in fresh and stale domains).
	LRPsExtra int
	// CrashedLRPs counts CRASHED instances.
	CrashedLRPs int
	// SuspectLRPs counts SUSPECT records.
	SuspectLRPs int
	// StaleClaimedLRPs counts instances CLAIMED on a present cell for the claimed timeout.
	StaleClaimedLRPs int
}

// Plan is the outcome of Make.
type Plan struct {
	// Found counts what the snapshot has wrong.
	Found Found
	// Changes are the repairs, in a deterministic order: LRPs by process guid and index, then
	// tasks by guid.
	Changes []Change
}

// Change is one repair. Every change but the auctions is one transaction.
type Change interface {
	fmt.Stringer
	change()
}

// CreateMissing creates UNCLAIMED instances for the desired indices of an LRP that have no
// ordinary record, and auctions them.
type CreateMissing struct {
	// ProcessGuid is the desired LRP.
	ProcessGuid string
	// Missing is how many indices the snapshot showed without a record.
	Missing int
}

// RetireExtra retires an ordinary instance that is no longer desired in a fresh domain.
type RetireExtra struct {
	// ProcessGuid and Index name the instance slot.
	ProcessGuid string
	Index       int32
}

// AuctionLRP auctions stale UNCLAIMED instances of one desired LRP again.
type AuctionLRP struct {
	// SchedulingInfo is the desired LRP.
	SchedulingInfo *modelsv1.DesiredLRPSchedulingInfo
	// Indices are the stale instances, ascending.
	Indices []int32
}

// RestartCrashed makes a CRASHED instance whose backoff has passed UNCLAIMED and auctions it.
type RestartCrashed struct {
	// ProcessGuid and Index name the instance slot.
	ProcessGuid string
	Index       int32
}

// MarkSuspect replaces an instance whose cell vanished: a RUNNING one is kept as a SUSPECT copy
// and the slot is unclaimed for a replacement.
type MarkSuspect struct {
	// ProcessGuid and Index name the instance slot.
	ProcessGuid string
	Index       int32
	// Instance is the container on the vanished cell.
	Instance *modelsv1.ActualLRPInstanceKey
}

// UnclaimStale unclaims an instance that stayed CLAIMED by Instance, on a present cell, since at
// or before Deadline, and auctions it again.
type UnclaimStale struct {
	// ProcessGuid and Index name the instance slot.
	ProcessGuid string
	Index       int32
	// Instance is the container that claimed it.
	Instance *modelsv1.ActualLRPInstanceKey
	// Deadline is the latest claim time that is stale.
	Deadline time.Time
}

// PromoteSuspect makes a SUSPECT copy whose cell returned the ordinary record again.
type PromoteSuspect struct {
	// ProcessGuid and Index name the instance slot.
	ProcessGuid string
	Index       int32
}

// RemoveSuspect deletes a SUSPECT copy whose replacement runs or whose slot is not desired.
type RemoveSuspect struct {
	// ProcessGuid and Index name the instance slot.
	ProcessGuid string
	Index       int32
}

// RemoveEvacuating deletes an EVACUATING copy whose cell vanished or whose slot is not desired.
type RemoveEvacuating struct {
	// ProcessGuid and Index name the instance slot.
	ProcessGuid string
	Index       int32
}

// FinishDrain stops the container of a record that has been draining for the drain timeout, or
// removes the record when its cell is gone.
type FinishDrain struct {
	// ProcessGuid and Index name the instance slot.
	ProcessGuid string
	Index       int32
	// Presence is the record's presence (ORDINARY or EVACUATING).
	Presence modelsv1.ActualLRP_Presence
	// Instance is the draining container.
	Instance *modelsv1.ActualLRPInstanceKey
}

// ExpirePendingTask fails a task still PENDING that was created at or before Deadline.
type ExpirePendingTask struct {
	// TaskGuid is the task.
	TaskGuid string
	// Deadline is the latest creation time that expires.
	Deadline time.Time
}

// AuctionTask auctions a PENDING task again.
type AuctionTask struct {
	// Task is the task as the snapshot saw it.
	Task *modelsv1.Task
}

// FailTaskOnVanishedCell fails a task RUNNING on a cell without presence.
type FailTaskOnVanishedCell struct {
	// TaskGuid is the task.
	TaskGuid string
}

// RetryTaskCallback queues the completion callback of a completed task again.
type RetryTaskCallback struct {
	// TaskGuid is the task.
	TaskGuid string
}

// DeleteTask deletes a COMPLETED or RESOLVING task that first completed at or before Deadline.
type DeleteTask struct {
	// TaskGuid is the task.
	TaskGuid string
	// Deadline is the latest completion time that is deleted.
	Deadline time.Time
}

func (CreateMissing) change()          {}
func (RetireExtra) change()            {}
func (AuctionLRP) change()             {}
func (RestartCrashed) change()         {}
func (MarkSuspect) change()            {}
func (UnclaimStale) change()           {}
func (PromoteSuspect) change()         {}
func (RemoveSuspect) change()          {}
func (RemoveEvacuating) change()       {}
func (FinishDrain) change()            {}
func (ExpirePendingTask) change()      {}
func (AuctionTask) change()            {}
func (FailTaskOnVanishedCell) change() {}
func (RetryTaskCallback) change()      {}
func (DeleteTask) change()             {}

func (c CreateMissing) String() string {
	return fmt.Sprintf("create-missing %s (%d)", c.ProcessGuid, c.Missing)
}
func (c RetireExtra) String() string {
	return fmt.Sprintf("retire-extra %s/%d", c.ProcessGuid, c.Index)
}
func (c AuctionLRP) String() string {
	return fmt.Sprintf("auction-lrp %s %v", c.SchedulingInfo.GetProcessGuid(), c.Indices)
}
func (c RestartCrashed) String() string {
	return fmt.Sprintf("restart-crashed %s/%d", c.ProcessGuid, c.Index)
}
func (c MarkSuspect) String() string {
	return fmt.Sprintf("mark-suspect %s/%d on %s", c.ProcessGuid, c.Index, c.Instance.GetCellId())
}
func (c UnclaimStale) String() string {
	return fmt.Sprintf("unclaim-stale %s/%d on %s", c.ProcessGuid, c.Index, c.Instance.GetCellId())
}
func (c PromoteSuspect) String() string {
	return fmt.Sprintf("promote-suspect %s/%d", c.ProcessGuid, c.Index)
}
func (c RemoveSuspect) String() string {
	return fmt.Sprintf("remove-suspect %s/%d", c.ProcessGuid, c.Index)
}
func (c RemoveEvacuating) String() string {
	return fmt.Sprintf("remove-evacuating %s/%d", c.ProcessGuid, c.Index)
}
func (c FinishDrain) String() string {
	return fmt.Sprintf("finish-drain %s/%d (%s) on %s", c.ProcessGuid, c.Index, c.Presence, c.Instance.GetCellId())
}
func (c ExpirePendingTask) String() string { return "expire-pending-task " + c.TaskGuid }
func (c AuctionTask) String() string       { return "auction-task " + c.Task.GetTaskGuid() }
func (c FailTaskOnVanishedCell) String() string {
	return "fail-task-on-vanished-cell " + c.TaskGuid
}
func (c RetryTaskCallback) String() string { return "retry-task-callback " + c.TaskGuid }
func (c DeleteTask) String() string        { return "delete-task " + c.TaskGuid }

// CompletedAt is when a task first completed (its last update for records without the field).
func CompletedAt(task *modelsv1.Task) time.Time {
	if task.GetFirstCompletedAt() != nil {
		return task.GetFirstCompletedAt().AsTime()
	}
	return task.GetUpdatedAt().AsTime()
}

// slot is the records of one instance index.
type slot struct {
	guid           string
	index          int32
	ord, sus, evac *modelsv1.ActualLRP
}

// expired reports whether at+d is not after now.
func expired(at time.Time, d time.Duration, now time.Time) bool { return !at.Add(d).After(now) }

// Make decides the changes that converge the snapshot.
func Make(s Snapshot, t Timeouts) Plan {
	var p Plan
	now := s.Now
	cells := make(map[string]bool, len(s.Cells))
	for _, cell := range s.Cells {
		cells[cell.GetCellId()] = true
	}
	domains := make(map[string]bool, len(s.Domains))
	for _, d := range s.Domains {
		domains[d.GetName()] = true
	}
	desired := make(map[string]*modelsv1.DesiredLRPSchedulingInfo, len(s.Desired))
	for _, d := range s.Desired {
		desired[d.GetProcessGuid()] = d
	}
	isDesired := func(guid string, index int32) bool {
		d := desired[guid]
		return d != nil && index < d.GetInstances()
	}
	slots := slotsOf(s.Actual)
	// have counts each desired LRP's slots with an ordinary record among its desired indexes
	// (a slot is one guid and index, so none is counted twice).
	have := make(map[string]int32, len(desired))
	for _, sl := range slots {
		if sl.ord != nil && sl.index >= 0 && isDesired(sl.guid, sl.index) {
			have[sl.guid]++
		}
	}

	// Missing instances.
	scheds := slices.SortedFunc(slices.Values(s.Desired), func(a, b *modelsv1.DesiredLRPSchedulingInfo) int {
		return cmp.Compare(a.GetProcessGuid(), b.GetProcessGuid())
	})
	for _, d := range scheds {
		missing := int(max(d.GetInstances()-have[d.GetProcessGuid()], 0))
		if missing > 0 {
			p.Found.LRPsMissing += missing
			p.Changes = append(p.Changes, CreateMissing{ProcessGuid: d.GetProcessGuid(), Missing: missing})
		}
	}

	// Instance slots, by process guid and index.
	var stale *AuctionLRP
	flush := func() {
		if stale != nil {
			p.Changes = append(p.Changes, *stale)
			stale = nil
		}
	}
	for _, sl := range slots {
		guid, index := sl.guid, sl.index
		if stale != nil && stale.SchedulingInfo.GetProcessGuid() != guid {
			flush()
		}
		finish := func(a *modelsv1.ActualLRP) bool {
			if a == nil || a.GetDrainingSince() == nil {
				return false
			}
			if !cells[a.GetInstanceKey().GetCellId()] || expired(a.GetDrainingSince().AsTime(), t.Drain, now) {
				p.Changes = append(p.Changes, FinishDrain{ProcessGuid: guid, Index: index, Presence: a.GetPresence(), Instance: a.GetInstanceKey()})
			}
			return true
		}
		if a := sl.ord; a != nil {
			switch {
			case finish(a):
				if !isDesired(guid, index) {
					p.Found.LRPsExtra++
				}
			case !isDesired(guid, index):
				p.Found.LRPsExtra++
				if domains[a.GetKey().GetDomain()] {
					p.Changes = append(p.Changes, RetireExtra{ProcessGuid: guid, Index: index})
				}
			case a.GetState() == modelsv1.ActualLRP_STATE_UNCLAIMED:
				if a.GetPlacementError() != nil || expired(a.GetSince().AsTime(), t.Unclaimed, now) {
					if stale == nil {
						stale = &AuctionLRP{SchedulingInfo: desired[guid]}
					}
					stale.Indices = append(stale.Indices, index)
				}
			case a.GetState() == modelsv1.ActualLRP_STATE_CLAIMED, a.GetState() == modelsv1.ActualLRP_STATE_RUNNING:
				ik := a.GetInstanceKey()
				switch {
				case !cells[ik.GetCellId()]:
					p.Changes = append(p.Changes, MarkSuspect{ProcessGuid: guid, Index: index, Instance: ik})
				case a.GetState() == modelsv1.ActualLRP_STATE_CLAIMED && t.Claimed > 0 && expired(a.GetSince().AsTime(), t.Claimed, now):
					p.Found.StaleClaimedLRPs++
					p.Changes = append(p.Changes, UnclaimStale{ProcessGuid: guid, Index: index, Instance: ik, Deadline: now.Add(-t.Claimed)})
				}
			case a.GetState() == modelsv1.ActualLRP_STATE_CRASHED:
				p.Found.CrashedLRPs++
				if models.ShouldRestartCrashed(a, now) {
					p.Changes = append(p.Changes, RestartCrashed{ProcessGuid: guid, Index: index})
				}
			}
		}
		if finish(sl.evac) {
			// a draining evacuating copy: finished above, never removed under its rep
		} else if sl.evac != nil && (!cells[sl.evac.GetInstanceKey().GetCellId()] || !isDesired(guid, index)) {
			p.Changes = append(p.Changes, RemoveEvacuating{ProcessGuid: guid, Index: index})
		}
		if sl.sus != nil {
			p.Found.SuspectLRPs++
			replaced := sl.ord != nil && sl.ord.GetState() == modelsv1.ActualLRP_STATE_RUNNING
			switch {
			case !isDesired(guid, index) || replaced:
				p.Changes = append(p.Changes, RemoveSuspect{ProcessGuid: guid, Index: index})
			case cells[sl.sus.GetInstanceKey().GetCellId()]:
				p.Changes = append(p.Changes, PromoteSuspect{ProcessGuid: guid, Index: index})
			}
		}
	}
	flush()

	// Tasks, by guid.
	tasks := slices.SortedFunc(slices.Values(s.Tasks), func(a, b *modelsv1.Task) int {
		return cmp.Compare(a.GetTaskGuid(), b.GetTaskGuid())
	})
	for _, task := range tasks {
		guid := task.GetTaskGuid()
		switch task.GetState() {
		case modelsv1.Task_STATE_PENDING:
			if expired(task.GetCreatedAt().AsTime(), t.PendingTask, now) {
				p.Changes = append(p.Changes, ExpirePendingTask{TaskGuid: guid, Deadline: now.Add(-t.PendingTask)})
			} else if expired(task.GetUpdatedAt().AsTime(), t.Unclaimed, now) {
				p.Changes = append(p.Changes, AuctionTask{Task: task})
			}
		case modelsv1.Task_STATE_RUNNING:
			if !cells[task.GetCellId()] {
				p.Changes = append(p.Changes, FailTaskOnVanishedCell{TaskGuid: guid})
			}
		case modelsv1.Task_STATE_COMPLETED, modelsv1.Task_STATE_RESOLVING:
			if expired(CompletedAt(task), t.CompletedTask, now) {
				p.Changes = append(p.Changes, DeleteTask{TaskGuid: guid, Deadline: now.Add(-t.CompletedTask)})
			} else if task.GetDefinition().GetCompletionCallbackUrl() != "" && expired(task.GetUpdatedAt().AsTime(), t.Unclaimed, now) {
				p.Changes = append(p.Changes, RetryTaskCallback{TaskGuid: guid})
			}
		}
	}
	return p
}

// CellLoss is the part of Make that a cell's disappearance calls for, without judging the rest
// of the snapshot: MarkSuspect for desired CLAIMED or RUNNING ordinary instances on cells without
// presence, RemoveEvacuating for EVACUATING copies on such cells, FailTaskOnVanishedCell for
// tasks RUNNING on them. s.Actual need only hold the records of the vanished cells (store
// OnLostCells); given only those, and only their tasks, s.Cells may be empty. Each change is
// the one Make would plan for the same record, in the same order. A convergence pass triggered by a lost cell runs it instead of Make, so a wave of cells
// expiring one after another at 100,000 instances costs a walk of the records per cell, not a
// full plan; the timer's passes still run Make.
func CellLoss(s Snapshot) Plan {
	var p Plan
	cells := make(map[string]bool, len(s.Cells))
	for _, cell := range s.Cells {
		cells[cell.GetCellId()] = true
	}
	instances := make(map[string]int32, len(s.Desired))
	for _, d := range s.Desired {
		instances[d.GetProcessGuid()] = d.GetInstances()
	}
	for _, sl := range slotsOf(s.Actual) {
		if a := sl.ord; a != nil {
			desired := sl.index < instances[sl.guid]
			if _, ok := instances[sl.guid]; !ok {
				desired = false
			}
			st := a.GetState()
			if desired && (st == modelsv1.ActualLRP_STATE_CLAIMED || st == modelsv1.ActualLRP_STATE_RUNNING) && !cells[a.GetInstanceKey().GetCellId()] {
				p.Changes = append(p.Changes, MarkSuspect{ProcessGuid: sl.guid, Index: sl.index, Instance: a.GetInstanceKey()})
			}
		}
		if sl.evac != nil && !cells[sl.evac.GetInstanceKey().GetCellId()] {
			p.Changes = append(p.Changes, RemoveEvacuating{ProcessGuid: sl.guid, Index: sl.index})
		}
	}
	tasks := slices.SortedFunc(slices.Values(s.Tasks), func(a, b *modelsv1.Task) int {
		return cmp.Compare(a.GetTaskGuid(), b.GetTaskGuid())
	})
	for _, task := range tasks {
		if task.GetState() == modelsv1.Task_STATE_RUNNING && !cells[task.GetCellId()] {
			p.Changes = append(p.Changes, FailTaskOnVanishedCell{TaskGuid: task.GetTaskGuid()})
		}
	}
	return p
}

// slotsOf groups actual LRP records by instance slot, ordered by process guid and index. The
// store lists records in that order (and by presence within a slot), so the slots are found
// in one pass over the records, without a map of every slot; records given in another order
// are sorted first.
func slotsOf(actuals []*modelsv1.ActualLRP) []*slot {
	bySlot := func(a, b *modelsv1.ActualLRP) int {
		return cmp.Or(cmp.Compare(a.GetKey().GetProcessGuid(), b.GetKey().GetProcessGuid()), cmp.Compare(a.GetKey().GetIndex(), b.GetKey().GetIndex()))
	}
	if !slices.IsSortedFunc(actuals, bySlot) {
		actuals = slices.SortedStableFunc(slices.Values(actuals), bySlot)
	}
	slots := make([]slot, 0, len(actuals)) // never grown: out points into it
	for _, a := range actuals {
		guid, index := a.GetKey().GetProcessGuid(), a.GetKey().GetIndex()
		if n := len(slots); n == 0 || slots[n-1].guid != guid || slots[n-1].index != index {
			slots = append(slots, slot{guid: guid, index: index})
		}
		sl := &slots[len(slots)-1]
		switch a.GetPresence() {
		case modelsv1.ActualLRP_PRESENCE_ORDINARY:
			sl.ord = a
		case modelsv1.ActualLRP_PRESENCE_SUSPECT:
			sl.sus = a
		case modelsv1.ActualLRP_PRESENCE_EVACUATING:
			sl.evac = a
		}
	}
	out := make([]*slot, len(slots))
	for i := range slots {
		out[i] = &slots[i]
	}
	return out
}
