package cell

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// runTask is a task's lifecycle: start it in the BBS → fetch it → create (rootfs, hooks,
// backend) → wait → complete it in the BBS with its result unless the rep stopped it (a
// cancelled task is already completed) → on_destroy hooks → release.
func (c *Cell) runTask(ctr *container) {
	defer c.release(ctr)
	guid := ctr.guid
	log := c.log.With("task_guid", guid)

	var shouldStart bool
	err := c.call(ctr.ctx, "start task", func(ctx context.Context) error {
		resp, err := c.bbs.StartTask(ctx, &bbsv1.StartTaskRequest{TaskGuid: guid, CellId: c.cfg.CellID})
		shouldStart = resp.GetShouldStart()
		return err
	})
	if err != nil {
		log.Info("could not start the task, dropping it", "error", err)
		return
	}
	if !shouldStart {
		log.Info("task already runs on this cell, dropping the duplicate")
		return
	}
	c.mu.Lock()
	ctr.claimed = true
	c.mu.Unlock()

	exec, cleanup, err := c.create(ctr, func(ctx context.Context) (executor.Spec, error) {
		var resp *bbsv1.TaskByGuidResponse
		err := c.call(ctx, "fetch task", func(ctx context.Context) error {
			var err error
			resp, err = c.bbs.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: guid})
			return err
		})
		if err != nil {
			return executor.Spec{}, err
		}
		return taskSpec(resp.GetTask()), nil
	})
	if err != nil {
		c.setPhase(ctr, phaseCompleted)
		c.taskEnded(ctr, log, executor.Result{Failed: true, Reason: fmt.Sprintf("failed to start: %v", err)})
		return
	}
	defer cleanup()
	log.Debug("task container started")
	c.watchTask(ctr, exec, log)
}

// watchTask follows a started task container until it ends and completes the task in the BBS
// with its outcome.
func (c *Cell) watchTask(ctr *container, exec executor.Container, log hclog.Logger) {
	c.setPhase(ctr, phaseRunning)

	// Drain readiness changes, which mean nothing for a task, until it is done.
	for routable := exec.Routable(); routable != nil; {
		select {
		case _, ok := <-routable:
			if !ok {
				routable = nil
			}
		case <-exec.Done():
			routable = nil
		}
	}
	<-exec.Done()
	c.setPhase(ctr, phaseCompleted)
	c.taskEnded(ctr, log, exec.Result())
}

// taskEnded completes a task in the BBS with its outcome, unless the rep stopped it.
func (c *Cell) taskEnded(ctr *container, log hclog.Logger, res executor.Result) {
	ctr.report.Lock()
	defer ctr.report.Unlock()
	switch {
	case c.isStopping(ctr):
		ctr.logs.Cell("container stopped (%s)", res.Reason)
	case res.Failed:
		ctr.logs.Cell("task failed: %s", res.Reason)
	default:
		ctr.logs.Cell("task completed")
	}
	if c.isStopping(ctr) {
		log.Debug("task container stopped by the rep", "reason", res.Reason)
		return
	}
	reason := res.Reason
	if res.Failed && reason == "" {
		reason = "failed"
	}
	if !res.Failed {
		reason = ""
	}
	err := c.call(c.base, "complete task", func(ctx context.Context) error {
		_, err := c.bbs.CompleteTask(ctx, &bbsv1.CompleteTaskRequest{
			TaskGuid: ctr.guid, CellId: c.cfg.CellID, Failed: res.Failed, FailureReason: reason, Result: res.Output})
		return err
	})
	switch {
	case err == nil:
		log.Info("task completed", "failed", res.Failed, "reason", reason)
	case gone(err):
		log.Debug("task is no longer running on this cell", "error", err)
	default:
		log.Warn("could not complete the task", "error", err)
	}
}

// CancelTask stops a task's container, if this cell runs it; the BBS has already completed
// the task. It keeps going in the background when ctx ends first.
func (c *Cell) CancelTask(ctx context.Context, guid string) error {
	c.mu.Lock()
	ctr := c.containers[guid]
	c.mu.Unlock()
	if ctr == nil || ctr.kind != executor.KindTask {
		return nil
	}
	err := c.detached(ctx, c.stopBudget(), func(ctx context.Context) error {
		c.stop(ctr)
		select {
		case <-ctr.done:
			c.log.Info("task cancelled", "task_guid", guid)
			return nil
		case <-ctx.Done():
			return fmt.Errorf("container did not stop: %w", ctx.Err())
		}
	})
	if err != nil {
		return fmt.Errorf("cancel task %s: %w", guid, err)
	}
	return nil
}
