package cell

import (
	"context"
	"errors"
	"fmt"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// ReasonVanished is the failure reason of a task the BBS thinks runs on this cell but that has
// no container here.
const ReasonVanished = "container vanished"

// Bulk returns a lifecycle runner that reconciles the cell with the BBS at once and then every
// interval.
func (c *Cell) Bulk(interval time.Duration) func(ctx context.Context, ready func()) error {
	return func(ctx context.Context, ready func()) error {
		ready()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if err := c.Reconcile(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("bulk reconcile failed", "error", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}

// Reconcile compares the BBS records naming this cell with the containers it holds:
// a CLAIMED or RUNNING instance record (ordinary or evacuating) whose container is not here is
// removed, a RUNNING task without a container is completed as failed ("container vanished"),
// a running LRP container whose slot has no record at all is reported to the BBS (an extra
// instance, see reportUnknown), and any other started container whose record is gone or names
// another container is stopped.
func (c *Cell) Reconcile(ctx context.Context) error {
	start := time.Now()
	err := c.reconcile(ctx)
	if ctx.Err() == nil { // a reconcile cut short by shutdown is not observed
		c.obs.Reconciled(time.Since(start), err)
	}
	return err
}

// reconcile is Reconcile, unobserved.
func (c *Cell) reconcile(ctx context.Context) error {
	// Snapshot the candidates for stopping before listing: a container claimed after the
	// snapshot may be missing from the list without being an orphan.
	c.mu.Lock()
	var candidates []*container
	for _, ctr := range c.containers {
		if ctr.claimed && !ctr.stopping && ctr.phase != phaseCompleted {
			candidates = append(candidates, ctr)
		}
	}
	c.mu.Unlock()

	filter := &bbsv1.Filter{CellId: c.cfg.CellID}
	var lrps *bbsv1.ActualLRPsResponse
	err := c.call(ctx, "list actual lrps", func(ctx context.Context) error {
		var err error
		lrps, err = c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: filter})
		return err
	})
	if err != nil {
		return fmt.Errorf("bulk: %w", err)
	}
	var tasks *bbsv1.TasksResponse
	err = c.call(ctx, "list tasks", func(ctx context.Context) error {
		var err error
		tasks, err = c.bbs.Tasks(ctx, &bbsv1.TasksRequest{Filter: filter})
		return err
	})
	if err != nil {
		return fmt.Errorf("bulk: %w", err)
	}

	var errs []error
	named := map[string]bool{} // guids of containers the BBS says run here
	for _, a := range lrps.GetActualLrps() {
		ik := a.GetInstanceKey()
		if ik.GetCellId() != c.cfg.CellID || (a.GetState() != modelsv1.ActualLRP_STATE_CLAIMED && a.GetState() != modelsv1.ActualLRP_STATE_RUNNING) {
			continue
		}
		if c.holdsKey(ik.GetInstanceGuid(), a.GetKey()) {
			named[ik.GetInstanceGuid()] = true
			continue
		}
		if err := c.removeOrphanRecord(ctx, a); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range tasks.GetTasks() {
		if t.GetCellId() != c.cfg.CellID || t.GetState() != modelsv1.Task_STATE_RUNNING {
			continue
		}
		if c.holdsTask(t.GetTaskGuid()) {
			named[t.GetTaskGuid()] = true
			continue
		}
		if err := c.completeVanished(ctx, t.GetTaskGuid()); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ctr := range candidates {
		if named[ctr.guid] {
			continue
		}
		if c.reportUnknown(ctx, ctr) {
			continue
		}
		c.log.Info("stopping a container the BBS does not know", "container", ctr.describe())
		c.obs.ReconcileFixed(FixStopContainer)
		go c.stop(ctr)
	}
	return errors.Join(errs...)
}

// reportUnknown reports a running LRP instance whose slot the BBS has no record of (the store
// was restored from a backup taken before it was desired, say) instead of stopping it: the BBS
// records it in its domain as an extra instance, which convergence retires only while the
// domain is fresh (Diego's rule), so a restore never silently kills work. It reports whether
// the BBS took the instance; a slot held by another instance, or any failure, leaves the
// container to be stopped.
func (c *Cell) reportUnknown(ctx context.Context, ctr *container) bool {
	c.mu.Lock()
	running := ctr.kind == executor.KindLRP && ctr.phase == phaseRunning && !ctr.stopping && !c.evacuating
	net, routable := ctr.netInfo, ctr.routable
	c.mu.Unlock()
	if !running || net == nil || ctr.key.GetDomain() == "" {
		return false
	}
	key := ctr.key
	err := c.call(ctx, "report unknown actual lrp", func(ctx context.Context) error {
		_, err := c.bbs.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{
			ProcessGuid: key.GetProcessGuid(), Index: key.GetIndex(), InstanceKey: ctr.instanceKey(c.cfg.CellID),
			NetInfo: net, Routable: routable, Domain: key.GetDomain(),
		})
		return err
	})
	if err != nil {
		c.log.Info("the BBS did not take a container it does not know", "container", ctr.describe(), "error", err)
		return false
	}
	c.log.Info("reported a running container the BBS did not know; it is an extra instance until desired", "container", ctr.describe())
	c.obs.ReconcileFixed(FixReportContainer)
	return true
}

// holdsKey reports whether the cell holds the container guid for the instance slot key, or a
// stop of that container is removing its records.
func (c *Cell) holdsKey(guid string, key *modelsv1.ActualLRPKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removing[guid] {
		return true
	}
	ctr := c.containers[guid]
	return ctr != nil && ctr.kind == executor.KindLRP &&
		ctr.key.GetProcessGuid() == key.GetProcessGuid() && ctr.key.GetIndex() == key.GetIndex()
}

// holdsTask reports whether the cell holds the task's container.
func (c *Cell) holdsTask(guid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctr := c.containers[guid]
	return ctr != nil && ctr.kind == executor.KindTask
}

// removeOrphanRecord removes an instance record naming a container this cell does not hold.
func (c *Cell) removeOrphanRecord(ctx context.Context, a *modelsv1.ActualLRP) error {
	key, ik := a.GetKey(), a.GetInstanceKey()
	c.log.Info("removing an instance record without a container", "process_guid", key.GetProcessGuid(), "index", key.GetIndex(),
		"instance_guid", ik.GetInstanceGuid(), "presence", a.GetPresence())
	var err error
	if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_EVACUATING {
		err = c.call(ctx, "remove evacuating actual lrp", func(ctx context.Context) error {
			_, err := c.bbs.RemoveEvacuatingActualLRP(ctx, &bbsv1.RemoveEvacuatingActualLRPRequest{ProcessGuid: key.GetProcessGuid(), Index: key.GetIndex(), InstanceKey: ik})
			return err
		})
	} else {
		err = c.call(ctx, "remove actual lrp", func(ctx context.Context) error {
			_, err := c.bbs.RemoveActualLRP(ctx, &bbsv1.RemoveActualLRPRequest{ProcessGuid: key.GetProcessGuid(), Index: key.GetIndex(), InstanceKey: ik})
			return err
		})
	}
	if err != nil && !gone(err) {
		return fmt.Errorf("orphaned %s/%d: %w", key.GetProcessGuid(), key.GetIndex(), err)
	}
	if err == nil {
		c.obs.ReconcileFixed(FixRemoveRecord)
	}
	return nil
}

// completeVanished fails a task the BBS thinks runs here.
func (c *Cell) completeVanished(ctx context.Context, guid string) error {
	c.log.Info("failing a task without a container", "task_guid", guid)
	err := c.call(ctx, "complete task", func(ctx context.Context) error {
		_, err := c.bbs.CompleteTask(ctx, &bbsv1.CompleteTaskRequest{TaskGuid: guid, CellId: c.cfg.CellID, Failed: true, FailureReason: ReasonVanished})
		return err
	})
	if err != nil && !gone(err) {
		return fmt.Errorf("vanished task %s: %w", guid, err)
	}
	if err == nil {
		c.obs.ReconcileFixed(FixFailTask)
	}
	return nil
}
