package core

import (
	"context"
	"fmt"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/services/bbs/internal/converge/plan"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// Convergence transactions. The converger plans changes from a snapshot of the cache (package
// plan) and applies each (package converge) by calling one of these: one compare-and-swap
// transaction that re-checks, on the data it reads, the condition the planner saw; when the
// condition no longer holds it changes nothing and reports false.

// Task failure reasons written by convergence.
const (
	// ReasonNotStarted fails a task that stayed PENDING past the pending timeout.
	ReasonNotStarted = "not started within time limit"
	// ReasonCellDisappeared fails a task RUNNING on a cell whose presence vanished.
	ReasonCellDisappeared = "cell disappeared before completion"
)

// ConvergeMissingLRP creates UNCLAIMED instances for every desired index of guid without an
// ordinary record and asks for them to be placed. It returns the indices created.
func (c *DesiredLRPs) ConvergeMissingLRP(ctx context.Context, guid string) ([]int32, error) {
	start, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (LRPStart, error) {
		sched, err := t.SchedulingInfo(guid)
		if err != nil || sched == nil {
			return LRPStart{}, err
		}
		actuals, err := t.ActualLRPs(guid)
		if err != nil {
			return LRPStart{}, err
		}
		created, err := c.createMissing(t, sched, actuals)
		return LRPStart{SchedulingInfo: sched, Indices: created}, err
	})
	if err != nil {
		return nil, fmt.Errorf("converge missing instances of %s: %w", guid, err)
	}
	c.auctionLRPs(ctx, []LRPStart{start})
	return start.Indices, nil
}

// ConvergeExtraLRP retires the ordinary instance guid/index when it is no longer desired (its
// desired LRP is gone or its index is past the instance count) and its domain is fresh: a
// record without a container is deleted, a container on a live cell is stopped by its rep.
// It reports whether the instance was retired (or its stop requested).
func (c *ActualLRPs) ConvergeExtraLRP(ctx context.Context, guid string, index int32) (bool, error) {
	type retired struct {
		done bool
		r    retirement
	}
	out, rev, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (retired, error) {
		a, err := t.ActualLRP(guid, index, ordinary)
		if err != nil || a == nil {
			return retired{}, err
		}
		sched, err := t.SchedulingInfo(guid)
		if err != nil {
			return retired{}, err
		}
		if sched != nil && index < sched.GetInstances() {
			return retired{}, nil // desired again
		}
		dom, err := t.Domain(a.GetKey().GetDomain())
		if err != nil || dom == nil {
			return retired{}, err // a stale domain keeps its instances
		}
		out := retired{done: true}
		if err := c.retire(t, a, &out.r); err != nil {
			return retired{}, err
		}
		return out, nil
	})
	if err != nil {
		return false, fmt.Errorf("converge extra %s: %w", describe(guid, index), err)
	}
	c.retireAll(rev, out.r)
	return out.done, nil
}

// ConvergeFinishDrain finishes the drain of the record guid/index/presence held by ik, which
// began at least the drain timeout ago (a drain whose BBS died or changed leadership before
// stopping it): the cell is asked to stop the container, or, when the cell is gone, the record
// is removed. A record no longer draining in that container is left alone. Asking a cell again
// to stop a container that is already stopping is harmless. It reports whether it acted.
func (c *ActualLRPs) ConvergeFinishDrain(ctx context.Context, guid string, index int32, p modelsv1.ActualLRP_Presence, ik *modelsv1.ActualLRPInstanceKey) (bool, error) {
	a, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.ActualLRP, error) {
		a, err := t.ActualLRP(guid, index, p)
		if err != nil || a == nil || !draining(a) || !sameInstance(a.GetInstanceKey(), ik) {
			return nil, err
		}
		return a, nil
	})
	if err != nil {
		return false, fmt.Errorf("converge finish drain %s: %w", describe(guid, index), err)
	}
	if a == nil {
		return false, nil
	}
	c.stopInstances([]stopRequest{{key: a.GetKey(), instance: a.GetInstanceKey(), presence: p}})
	return true, nil
}

// ConvergeCrashedLRP restarts a CRASHED instance whose restart delay has passed (and that has
// crashed fewer than models.MaxCrashes times): it becomes UNCLAIMED, keeping its crash count,
// and is sent for placement. It reports whether it was restarted.
func (c *ActualLRPs) ConvergeCrashedLRP(ctx context.Context, guid string, index int32) (bool, error) {
	next, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.ActualLRP, error) {
		a, err := t.ActualLRP(guid, index, ordinary)
		if err != nil || a == nil {
			return nil, err
		}
		if !models.ShouldRestartCrashed(a, c.cfg.Now()) {
			return nil, nil
		}
		sched, err := t.SchedulingInfo(guid)
		if err != nil || sched == nil || index >= sched.GetInstances() {
			return nil, err // extra: left to ConvergeExtraLRP
		}
		next := c.changed(a, unclaimed)
		return next, putActual(t, next)
	})
	if err != nil {
		return false, fmt.Errorf("converge crashed %s: %w", describe(guid, index), err)
	}
	if next == nil {
		return false, nil
	}
	c.restartIfUnclaimed(ctx, next)
	return true, nil
}

// ConvergeSuspectLRPs handles instances of one cell without presence, cellID, in one
// transaction: each ordinary instance of marks still held by the instance the plan saw (CLAIMED
// or RUNNING on cellID) is replaced. A RUNNING one is kept as a SUSPECT copy (still routed) and
// its slot is unclaimed for a replacement; a CLAIMED one is only unclaimed. An instance that
// changed meanwhile is left as it is, and nothing changes if the cell is back. The replacements
// are sent for placement in one request. It returns how many instances were handled.
//
// One transaction per lost cell's instances (the converger splits a cell's marks into groups
// that fit etcd's operation limit) rather than one per instance: a lost cell of 50 instances
// costs one read of its presence, one commit and one auction request instead of 50 of each.
func (c *ActualLRPs) ConvergeSuspectLRPs(ctx context.Context, cellID string, marks []plan.MarkSuspect) (int, error) {
	nexts, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) ([]*modelsv1.ActualLRP, error) {
		if cell, err := t.Cell(cellID); err != nil || cell != nil {
			return nil, err // the cell is back
		}
		var nexts []*modelsv1.ActualLRP
		for _, m := range marks {
			if m.Instance.GetCellId() != cellID {
				continue
			}
			a, err := t.ActualLRP(m.ProcessGuid, m.Index, ordinary)
			if err != nil {
				return nil, err
			}
			if s := a.GetState(); a == nil || (s != claimed && s != running) || !sameInstance(a.GetInstanceKey(), m.Instance) {
				continue
			}
			if a.GetState() == running {
				sus := a.CloneVT()
				sus.Presence = suspect
				sus.ModificationTag = bump(a.GetModificationTag())
				if err := putActual(t, sus); err != nil {
					return nil, err
				}
			}
			next := c.unclaim(a)
			next.PlacementError = nil
			if err := putActual(t, next); err != nil {
				return nil, err
			}
			nexts = append(nexts, next)
		}
		return nexts, nil
	})
	if err != nil {
		return 0, fmt.Errorf("converge suspects of cell %s (%d instances): %w", cellID, len(marks), err)
	}
	c.restartUnclaimed(ctx, nexts)
	return len(nexts), nil
}

// ConvergeStaleClaimedLRP unclaims the ordinary instance guid/index when it is still CLAIMED by
// ik since at or before deadline (its rep never reported it running nor gave it up) and asks
// for it to be placed again. Should the claiming rep still have the container, whichever of it
// and the replacement reports first keeps the slot and the other is refused. It reports whether
// the instance was unclaimed.
func (c *ActualLRPs) ConvergeStaleClaimedLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey, deadline time.Time) (bool, error) {
	next, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.ActualLRP, error) {
		a, err := t.ActualLRP(guid, index, ordinary)
		if err != nil || a == nil {
			return nil, err
		}
		if a.GetState() != claimed || !sameInstance(a.GetInstanceKey(), ik) || a.GetSince().AsTime().After(deadline) {
			return nil, nil // started, given up, or claimed again meanwhile
		}
		next := c.unclaim(a)
		next.PlacementError = nil
		return next, putActual(t, next)
	})
	if err != nil {
		return false, fmt.Errorf("converge stale claimed %s: %w", describe(guid, index), err)
	}
	if next == nil {
		return false, nil
	}
	c.restartIfUnclaimed(ctx, next)
	return true, nil
}

// ConvergePromoteSuspectLRP promotes the SUSPECT copy of guid/index back to the ordinary
// record when its cell is present again and the replacement is not running yet: the
// replacement's record (UNCLAIMED or CLAIMED) is dropped in the same transaction; a claimed
// replacement's container is stopped by its rep, whose calls no longer match the slot. It
// reports whether the suspect was promoted.
func (c *ActualLRPs) ConvergePromoteSuspectLRP(ctx context.Context, guid string, index int32) (bool, error) {
	return c.convergeStep(ctx, "converge promote suspect", guid, index, func(t *store.Txn) (bool, error) {
		sus, err := t.ActualLRP(guid, index, suspect)
		if err != nil || sus == nil {
			return false, err
		}
		if cell, err := t.Cell(sus.GetInstanceKey().GetCellId()); err != nil || cell == nil {
			return false, err
		}
		ord, err := t.ActualLRP(guid, index, ordinary)
		if err != nil {
			return false, err
		}
		if ord != nil && ord.GetState() != unclaimed && ord.GetState() != claimed {
			return false, nil // the replacement runs (or crashed): the suspect is left for removal
		}
		promoted := sus.CloneVT()
		promoted.Presence = ordinary
		promoted.ModificationTag = bump(sus.GetModificationTag())
		if ord != nil {
			// Keep the slot's epoch moving forward from the replacement's tag.
			promoted.ModificationTag = bump(ord.GetModificationTag())
		}
		deleteActual(t, sus)
		return true, putActual(t, promoted)
	})
}

// ConvergeRemoveSuspectLRP deletes the SUSPECT copy of guid/index once it has no reason to
// stay: its replacement runs, or the slot is no longer desired. It reports whether it did.
func (c *ActualLRPs) ConvergeRemoveSuspectLRP(ctx context.Context, guid string, index int32) (bool, error) {
	return c.convergeStep(ctx, "converge remove suspect", guid, index, func(t *store.Txn) (bool, error) {
		sus, err := t.ActualLRP(guid, index, suspect)
		if err != nil || sus == nil {
			return false, err
		}
		ord, err := t.ActualLRP(guid, index, ordinary)
		if err != nil {
			return false, err
		}
		sched, err := t.SchedulingInfo(guid)
		if err != nil {
			return false, err
		}
		desired := sched != nil && index < sched.GetInstances()
		if desired && (ord == nil || ord.GetState() != running) {
			return false, nil
		}
		deleteActual(t, sus)
		return true, nil
	})
}

// ConvergeRemoveEvacuatingLRP deletes the EVACUATING copy of an instance slot whose cell has
// vanished (its container is gone with the cell; the slot was already handed to a replacement
// when the evacuation started) or whose slot is no longer desired, unless it is draining on a
// present cell (its rep's evacuation finishes that). It reports whether it did.
func (c *ActualLRPs) ConvergeRemoveEvacuatingLRP(ctx context.Context, guid string, index int32) (bool, error) {
	return c.convergeStep(ctx, "converge remove evacuating", guid, index, func(t *store.Txn) (bool, error) {
		evac, err := t.ActualLRP(guid, index, evacuating)
		if err != nil || evac == nil {
			return false, err
		}
		cell, err := t.Cell(evac.GetInstanceKey().GetCellId())
		if err != nil {
			return false, err
		}
		sched, err := t.SchedulingInfo(guid)
		if err != nil {
			return false, err
		}
		if cell != nil && (draining(evac) || (sched != nil && index < sched.GetInstances())) {
			return false, nil // still desired, or draining under its rep (ConvergeFinishDrain)
		}
		deleteActual(t, evac)
		return true, nil
	})
}

// ConvergeExpirePendingTask fails a task that is still PENDING and was created at or before
// deadline with ReasonNotStarted. It reports whether it did.
func (c *Tasks) ConvergeExpirePendingTask(ctx context.Context, guid string, deadline time.Time) (bool, error) {
	return c.convergeFailTask(ctx, guid, ReasonNotStarted, func(_ *store.Txn, task *modelsv1.Task) (bool, error) {
		return task.GetState() == pending && !task.GetCreatedAt().AsTime().After(deadline), nil
	})
}

// ConvergeTaskOnVanishedCell fails a task RUNNING on a cell that has no presence with
// ReasonCellDisappeared. It reports whether it did.
func (c *Tasks) ConvergeTaskOnVanishedCell(ctx context.Context, guid string) (bool, error) {
	return c.convergeFailTask(ctx, guid, ReasonCellDisappeared, func(t *store.Txn, task *modelsv1.Task) (bool, error) {
		if task.GetState() != taskRun {
			return false, nil
		}
		cell, err := t.Cell(task.GetCellId())
		return cell == nil, err
	})
}

func (c *Tasks) convergeFailTask(ctx context.Context, guid, reason string, cond func(*store.Txn, *modelsv1.Task) (bool, error)) (bool, error) {
	after, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.Task, error) {
		task, err := t.Task(guid)
		if err != nil || task == nil {
			return nil, err
		}
		ok, err := cond(t, task)
		if err != nil || !ok {
			return nil, err
		}
		after := c.complete(task, true, reason, "")
		return after, putTask(t, after)
	})
	if err != nil {
		return false, fmt.Errorf("converge fail task %s: %w", guid, err)
	}
	if after == nil {
		return false, nil
	}
	c.callback(after)
	return true, nil
}

// ConvergeRetryTaskCallback retries the completion callback of a COMPLETED task, or of a
// RESOLVING one whose resolution stalled (it is put back to COMPLETED first). It reports
// whether a callback was queued.
func (c *Tasks) ConvergeRetryTaskCallback(ctx context.Context, guid string) (bool, error) {
	after, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.Task, error) {
		task, err := t.Task(guid)
		if err != nil || task == nil || task.GetDefinition().GetCompletionCallbackUrl() == "" {
			return nil, err
		}
		switch task.GetState() {
		case completed:
			return task, nil
		case resolving:
			after := c.changedTask(task, completed)
			return after, putTask(t, after)
		}
		return nil, nil
	})
	if err != nil {
		return false, fmt.Errorf("converge retry callback of task %s: %w", guid, err)
	}
	if after == nil || c.cfg.Callbacks == nil {
		return false, nil
	}
	c.callback(after)
	return true, nil
}

// ConvergeDeleteTask deletes a COMPLETED or RESOLVING task that first completed at or before
// deadline (its client never resolved it, or its callback never succeeded). It reports
// whether it did.
func (c *Tasks) ConvergeDeleteTask(ctx context.Context, guid string, deadline time.Time) (bool, error) {
	done, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (bool, error) {
		task, err := t.Task(guid)
		if err != nil || task == nil {
			return false, err
		}
		if s := task.GetState(); s != completed && s != resolving {
			return false, nil
		}
		if plan.CompletedAt(task).After(deadline) {
			return false, nil
		}
		t.Delete(store.TaskKey(guid))
		return true, nil
	})
	if err != nil {
		return false, fmt.Errorf("converge delete task %s: %w", guid, err)
	}
	return done, nil
}

// convergeStep runs step, one convergence fix of the slot guid/index, in one transaction
// (again on a lost race); step reports whether it changed anything. An error names op and the
// slot.
func (c *ActualLRPs) convergeStep(ctx context.Context, op, guid string, index int32, step func(t *store.Txn) (bool, error)) (bool, error) {
	done, _, err := store.UpdateValue(ctx, c.st, step)
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", op, describe(guid, index), err)
	}
	return done, nil
}
