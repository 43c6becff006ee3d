package converge

// The apply step: a convergence plan's changes (package plan decides them, purely, from a
// snapshot) are carried out here, each by the core's compare-and-swap transaction for it
// (core/converge.go), which re-checks on the data it reads the condition the planner saw; the
// instances of one lost cell are replaced together, in as few transactions as etcd allows.

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sync/semaphore"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/internal/converge/plan"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
)

// Applied is what applying a convergence plan did.
type Applied struct {
	// Created counts instances created for missing slots.
	Created int
	// Retired counts extra instances retired (deleted, or their stop requested).
	Retired int
	// Reauctioned counts stale UNCLAIMED instances sent to the auctioneer again.
	Reauctioned int
	// Restarted counts CRASHED instances restarted after their backoff.
	Restarted int
	// Suspected counts instances of vanished cells unclaimed for replacement.
	Suspected int
	// Unclaimed counts instances unclaimed after staying CLAIMED for the claimed timeout.
	Unclaimed int
	// Promoted counts suspects promoted back to ordinary after their cell returned.
	Promoted int
	// SuspectsRemoved counts suspects removed because their replacement runs.
	SuspectsRemoved int
	// EvacuatingRemoved counts EVACUATING copies removed because their cell vanished or their
	// slot is no longer desired.
	EvacuatingRemoved int
	// DrainsFinished counts draining instances stopped (or removed, their cell gone) after
	// their drain timeout.
	DrainsFinished int

	// TasksReauctioned counts PENDING tasks sent to the auctioneer again.
	TasksReauctioned int
	// TasksFailed counts tasks failed (not started in time, or cell vanished).
	TasksFailed int
	// TaskCallbacksRetried counts completion callbacks queued again.
	TaskCallbacksRetried int
	// TasksDeleted counts expired completed or resolving tasks deleted.
	TasksDeleted int

	// Errors counts changes that failed; the next pass plans them again.
	Errors int
}

// maxApplyErrors bounds the errors applyPlan returns (the rest are only counted).
const maxApplyErrors = 10

// applyPlan applies the changes of a convergence plan through c: the MarkSuspect changes of
// each lost cell together, in transactions of at most perTxn instances
// (core.ConvergeSuspectLRPs), every other transactional change as its own transaction; changes
// of as many records at a time as slots (of workers) lets them (the store group-commits
// them; passes that share slots share the bound); then the
// auctions, in one request for instances and one for tasks. It stops starting changes when ctx
// ends. A group that fails counts each of its changes as failed. A cell's group is left out
// when leave reports the cell as another pass's when its turn comes (nil leaves none). It
// returns what it did and the errors of failed changes (at most maxApplyErrors).
func applyPlan(ctx context.Context, c *core.Core, changes []plan.Change, slots *semaphore.Weighted, perTxn int, leave func(cellID string) bool) (Applied, []error) {
	var a Applied
	var starts []core.LRPStart
	var tasks []*modelsv1.Task
	var jobs []applyJob
	suspects := map[string]int{} // cell → its open group in jobs
	for _, ch := range changes {
		switch ch := ch.(type) {
		case plan.AuctionLRP:
			starts = append(starts, core.LRPStart{SchedulingInfo: ch.SchedulingInfo, Indices: ch.Indices})
			a.Reauctioned += len(ch.Indices)
		case plan.AuctionTask:
			tasks = append(tasks, ch.Task)
		case plan.MarkSuspect:
			cell := ch.Instance.GetCellId()
			i, ok := suspects[cell]
			if !ok || len(jobs[i].suspects) >= perTxn {
				i = len(jobs)
				suspects[cell] = i
				jobs = append(jobs, applyJob{cell: cell})
			}
			jobs[i].suspects = append(jobs[i].suspects, ch)
		default:
			jobs = append(jobs, applyJob{change: ch})
		}
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, j := range jobs {
		if j.change == nil && leave != nil && leave(j.cell) {
			continue
		}
		w := int64(min(j.weight(), workers))
		if ctx.Err() != nil || slots.Acquire(ctx, w) != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer slots.Release(w)
			n, err := j.apply(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			*a.counter(j.kind()) += n
			if err != nil {
				a.Errors += j.weight()
				if len(errs) < maxApplyErrors {
					errs = append(errs, err)
				}
			}
		}()
	}
	wg.Wait()
	c.ActualLRPs.RequestLRPAuctions(starts)
	c.Tasks.RequestTaskAuctions(tasks)
	a.TasksReauctioned = len(tasks)
	return a, errs
}

// DefaultSuspectsPerTxn is how many instances of one lost cell one transaction replaces by
// default: a RUNNING instance writes two records (its SUSPECT copy and its unclaimed slot), so
// 64 stay within etcd's default of 128 operations per transaction.
const DefaultSuspectsPerTxn = 64

// applyJob is one transaction of applyPlan: a transactional change, or a group of MarkSuspect
// changes of one cell.
type applyJob struct {
	change   plan.Change
	cell     string
	suspects []plan.MarkSuspect
}

// weight is how many of applyPlan's workers the job takes, and how many changes fail with it:
// one per instance of a group, one for any other change.
func (j applyJob) weight() int { return max(len(j.suspects), 1) }

// kind is the change whose count the job adds to.
func (j applyJob) kind() plan.Change {
	if j.change == nil {
		return plan.MarkSuspect{}
	}
	return j.change
}

// apply runs the job's transaction and returns how many records it changed.
func (j applyJob) apply(ctx context.Context, c *core.Core) (int, error) {
	if j.change == nil {
		return c.ActualLRPs.ConvergeSuspectLRPs(ctx, j.cell, j.suspects)
	}
	return applyChange(ctx, c, j.change)
}

// counter is the count a transactional change adds to.
func (a *Applied) counter(ch plan.Change) *int {
	switch ch.(type) {
	case plan.CreateMissing:
		return &a.Created
	case plan.RetireExtra:
		return &a.Retired
	case plan.RestartCrashed:
		return &a.Restarted
	case plan.MarkSuspect:
		return &a.Suspected
	case plan.UnclaimStale:
		return &a.Unclaimed
	case plan.PromoteSuspect:
		return &a.Promoted
	case plan.RemoveSuspect:
		return &a.SuspectsRemoved
	case plan.RemoveEvacuating:
		return &a.EvacuatingRemoved
	case plan.FinishDrain:
		return &a.DrainsFinished
	case plan.ExpirePendingTask, plan.FailTaskOnVanishedCell:
		return &a.TasksFailed
	case plan.RetryTaskCallback:
		return &a.TaskCallbacksRetried
	case plan.DeleteTask:
		return &a.TasksDeleted
	}
	return new(int) // no transaction: apply reports it as an error
}

// applyChange runs the core's transaction of one change and returns how many records it
// changed.
func applyChange(ctx context.Context, c *core.Core, ch plan.Change) (int, error) {
	one := func(ok bool, err error) (int, error) {
		if ok {
			return 1, err
		}
		return 0, err
	}
	switch ch := ch.(type) {
	case plan.CreateMissing:
		created, err := c.DesiredLRPs.ConvergeMissingLRP(ctx, ch.ProcessGuid)
		return len(created), err
	case plan.RetireExtra:
		return one(c.ActualLRPs.ConvergeExtraLRP(ctx, ch.ProcessGuid, ch.Index))
	case plan.RestartCrashed:
		return one(c.ActualLRPs.ConvergeCrashedLRP(ctx, ch.ProcessGuid, ch.Index))
	case plan.UnclaimStale:
		return one(c.ActualLRPs.ConvergeStaleClaimedLRP(ctx, ch.ProcessGuid, ch.Index, ch.Instance, ch.Deadline))
	case plan.PromoteSuspect:
		return one(c.ActualLRPs.ConvergePromoteSuspectLRP(ctx, ch.ProcessGuid, ch.Index))
	case plan.RemoveSuspect:
		return one(c.ActualLRPs.ConvergeRemoveSuspectLRP(ctx, ch.ProcessGuid, ch.Index))
	case plan.RemoveEvacuating:
		return one(c.ActualLRPs.ConvergeRemoveEvacuatingLRP(ctx, ch.ProcessGuid, ch.Index))
	case plan.FinishDrain:
		return one(c.ActualLRPs.ConvergeFinishDrain(ctx, ch.ProcessGuid, ch.Index, ch.Presence, ch.Instance))
	case plan.ExpirePendingTask:
		return one(c.Tasks.ConvergeExpirePendingTask(ctx, ch.TaskGuid, ch.Deadline))
	case plan.FailTaskOnVanishedCell:
		return one(c.Tasks.ConvergeTaskOnVanishedCell(ctx, ch.TaskGuid))
	case plan.RetryTaskCallback:
		return one(c.Tasks.ConvergeRetryTaskCallback(ctx, ch.TaskGuid))
	case plan.DeleteTask:
		return one(c.Tasks.ConvergeDeleteTask(ctx, ch.TaskGuid, ch.Deadline))
	}
	return 0, fmt.Errorf("convergence change %T has no transaction", ch)
}
