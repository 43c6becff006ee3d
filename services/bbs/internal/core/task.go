package core

import (
	"context"
	"fmt"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

const (
	pending    = modelsv1.Task_STATE_PENDING
	taskRun    = modelsv1.Task_STATE_RUNNING
	completed  = modelsv1.Task_STATE_COMPLETED
	resolving  = modelsv1.Task_STATE_RESOLVING
	cancelText = "task was cancelled"
)

// Tasks is the task lifecycle: desire, start, cancel, reject, complete, resolve and delete.
type Tasks struct{ *deps }

// taskOf reads a task or fails with NotFound.
func taskOf(t *store.Txn, guid string) (*modelsv1.Task, error) {
	task, err := t.Task(guid)
	if err != nil {
		return nil, err
	}
	if task == nil {
		return nil, rpcerr.NotFound("task %q not found", guid)
	}
	return task, nil
}

// changedTask returns a copy of task in state with its tag bumped and updated_at set.
func (c *Tasks) changedTask(task *modelsv1.Task, state modelsv1.Task_State) *modelsv1.Task {
	next := task.CloneVT()
	next.State = state
	next.UpdatedAt = c.now()
	next.ModificationTag = bump(task.GetModificationTag())
	return next
}

// complete returns task COMPLETED with the given outcome.
func (c *Tasks) complete(task *modelsv1.Task, failed bool, reason, result string) *modelsv1.Task {
	next := c.changedTask(task, completed)
	next.Failed = failed
	next.FailureReason = reason
	next.Result = result
	next.FirstCompletedAt = next.GetUpdatedAt()
	return next
}

func putTask(t *store.Txn, task *modelsv1.Task) error {
	return t.Put(store.TaskKey(task.GetTaskGuid()), task)
}

// DesireTask stores a new PENDING task and asks for it to be placed.
func (c *Tasks) DesireTask(ctx context.Context, guid, domain string, def *modelsv1.TaskDefinition) (int64, error) {
	def, err := c.transformTask(ctx, guid, domain, def)
	if err != nil {
		return 0, fmt.Errorf("desire task %s: %w", guid, err)
	}
	now := c.now()
	def = def.CloneVT()
	rootfs, err := models.CanonicalRootfs(def.GetRootfs())
	if err != nil {
		return 0, rpcerr.Invalid("definition.rootfs", "%s", err.Error())
	}
	def.Rootfs = rootfs // stored canonical: the auctioneer and the reps see one spelling
	task := &modelsv1.Task{
		TaskGuid:        guid,
		Domain:          domain,
		Definition:      def,
		State:           pending,
		CreatedAt:       now,
		UpdatedAt:       now,
		ModificationTag: newTag(),
	}
	rev, err := c.st.Update(ctx, func(t *store.Txn) error {
		existing, err := t.Task(guid)
		if err != nil {
			return err
		}
		if existing != nil {
			return rpcerr.AlreadyExists("task %q already exists", guid)
		}
		return putTask(t, task)
	})
	if err != nil {
		return 0, fmt.Errorf("desire task %s: %w", guid, err)
	}
	c.auctionTasks(ctx, []*modelsv1.Task{task})
	return rev, nil
}

// StartTask moves a PENDING task to RUNNING on cellID. It reports false when the task already
// runs on that cell (the cell must not start it twice).
func (c *Tasks) StartTask(ctx context.Context, guid, cellID string) (bool, error) {
	start, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (bool, error) {
		task, err := taskOf(t, guid)
		if err != nil {
			return false, err
		}
		switch {
		case task.GetState() == pending:
		case task.GetState() == taskRun && task.GetCellId() == cellID:
			return false, nil
		case task.GetState() == taskRun:
			return false, rpcerr.FailedPrecondition("task %q is running on cell %s, not %s", guid, task.GetCellId(), cellID)
		default:
			return false, rpcerr.FailedPrecondition("task %q cannot start in state %s", guid, task.GetState())
		}
		next := c.changedTask(task, taskRun)
		next.CellId = cellID
		next.PlacementError = nil
		return true, putTask(t, next)
	})
	if err != nil {
		return false, fmt.Errorf("start task %s: %w", guid, err)
	}
	return start, nil
}

// CancelTask completes a PENDING or RUNNING task as failed and asks its cell to stop it.
func (c *Tasks) CancelTask(ctx context.Context, guid string) error {
	type cancelled struct{ before, after *modelsv1.Task }
	out, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (cancelled, error) {
		task, err := taskOf(t, guid)
		if err != nil {
			return cancelled{}, err
		}
		if s := task.GetState(); s != pending && s != taskRun {
			return cancelled{}, rpcerr.FailedPrecondition("task %q cannot be cancelled in state %s", guid, s)
		}
		after := c.complete(task, true, cancelText, "")
		return cancelled{before: task, after: after}, putTask(t, after)
	})
	if err != nil {
		return fmt.Errorf("cancel task %s: %w", guid, err)
	}
	before, after := out.before, out.after
	if before.GetState() == taskRun {
		if cell := c.st.Cell(before.GetCellId()); cell != nil && c.cfg.Cells != nil {
			c.detach("cancel task on cell", func(ctx context.Context) error { return c.cfg.Cells.CancelTask(ctx, cell, guid) })
		}
	}
	c.callback(after)
	return nil
}

// RejectTask records that a cell or the auctioneer could not run a task. The task waits for
// placement again, or completes as failed once it has been rejected too often.
func (c *Tasks) RejectTask(ctx context.Context, guid, reason string, pe *modelsv1.PlacementError) error {
	if reason == "" {
		reason = pe.GetMessage()
	}
	after, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.Task, error) {
		task, err := taskOf(t, guid)
		if err != nil {
			return nil, err
		}
		if s := task.GetState(); s != pending && s != taskRun {
			return nil, rpcerr.FailedPrecondition("task %q cannot be rejected in state %s", guid, s)
		}
		limit := task.GetDefinition().GetMaxRejections()
		if limit <= 0 {
			limit = c.cfg.MaxTaskRejections
		}
		var after *modelsv1.Task
		count := task.GetRejectionCount() + 1
		if count >= limit {
			after = c.complete(task, true, fmt.Sprintf("task was rejected %d times: %s", count, reason), "")
		} else {
			after = c.changedTask(task, pending)
			after.CellId = ""
			after.FailureReason = reason
		}
		after.RejectionCount = count
		after.PlacementError = pe.CloneVT()
		return after, putTask(t, after)
	})
	if err != nil {
		return fmt.Errorf("reject task %s: %w", guid, err)
	}
	c.callback(after)
	return nil
}

// CompleteTask records the outcome of a task RUNNING on cellID.
func (c *Tasks) CompleteTask(ctx context.Context, guid, cellID string, failed bool, reason, result string) error {
	after, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.Task, error) {
		task, err := taskOf(t, guid)
		if err != nil {
			return nil, err
		}
		if task.GetState() != taskRun {
			return nil, rpcerr.FailedPrecondition("task %q cannot complete in state %s", guid, task.GetState())
		}
		if task.GetCellId() != cellID {
			return nil, rpcerr.FailedPrecondition("task %q runs on cell %s, not %s", guid, task.GetCellId(), cellID)
		}
		after := c.complete(task, failed, reason, result)
		return after, putTask(t, after)
	})
	if err != nil {
		return fmt.Errorf("complete task %s: %w", guid, err)
	}
	c.callback(after)
	return nil
}

// callback queues the completion callback of a task that completed.
func (c *Tasks) callback(task *modelsv1.Task) {
	if task.GetState() == completed && task.GetDefinition().GetCompletionCallbackUrl() != "" && c.cfg.Callbacks != nil {
		c.cfg.Callbacks.Enqueue(task)
	}
}

// ResolvingTask marks a COMPLETED task as being resolved by its client.
func (c *Tasks) ResolvingTask(ctx context.Context, guid string) error {
	_, err := c.st.Update(ctx, func(t *store.Txn) error {
		task, err := taskOf(t, guid)
		if err != nil {
			return err
		}
		if task.GetState() != completed {
			return rpcerr.FailedPrecondition("task %q cannot be resolved in state %s", guid, task.GetState())
		}
		return putTask(t, c.changedTask(task, resolving))
	})
	if err != nil {
		return fmt.Errorf("resolving task %s: %w", guid, err)
	}
	return nil
}

// DeleteTask deletes a RESOLVING task.
func (c *Tasks) DeleteTask(ctx context.Context, guid string) error {
	_, err := c.st.Update(ctx, func(t *store.Txn) error {
		task, err := taskOf(t, guid)
		if err != nil {
			return err
		}
		if task.GetState() != resolving {
			return rpcerr.FailedPrecondition("task %q cannot be deleted in state %s", guid, task.GetState())
		}
		t.Delete(store.TaskKey(guid))
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete task %s: %w", guid, err)
	}
	return nil
}

// Task returns one task or NotFound, with the revision read.
func (c *Tasks) Task(guid string) (*modelsv1.Task, int64, error) {
	t, rev := c.st.Task(guid)
	if t == nil {
		return nil, rev, rpcerr.NotFound("task %q not found", guid)
	}
	return t, rev, nil
}
