package cell

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// adoptTimeout bounds the backend's adoption at start-up.
const adoptTimeout = 2 * time.Minute

// adopt takes over the containers the backend kept from an earlier run of the rep (a backend
// whose containers outlive the rep: executor.Adopter), before the cell takes work and before
// the bulk loop's first reconcile. Each is held as claimed, with its resources, and its
// lifecycle goes on from where the dead rep left it: an LRP is reported RUNNING again (same
// instance guid) once its checks pass and its crash reported if it ends, a task is completed
// with its outcome. The bulk loop then stops those the BBS no longer names, and a RUNNING
// report the BBS refuses (the slot moved meanwhile) stops the container.
func (c *Cell) adopt(ctx context.Context) {
	a, ok := c.backend.(executor.Adopter)
	if !ok {
		return
	}
	actx, cancel := context.WithTimeout(ctx, adoptTimeout)
	defer cancel()
	pending := map[string]*container{}
	adopted, err := a.Adopt(actx, func(s executor.Spec) executor.LogSink {
		ctr := c.adoptedContainer(s)
		pending[s.Guid] = ctr
		c.openLog(ctr, &s)
		if ctr.logs == nil {
			return nil
		}
		return ctr.logs
	})
	if err != nil {
		c.log.Error("could not adopt the backend's containers", "error", err)
	}
	for _, ad := range adopted {
		s := ad.Spec
		ctr := pending[s.Guid]
		delete(pending, s.Guid)
		if ctr == nil {
			ctr = c.adoptedContainer(s)
		}
		if s.Kind == executor.KindLRP && s.ProcessGuid == "" || s.Kind == executor.KindTask && s.Guid == "" {
			c.log.Warn("stopping an adopted container that names no work", "guid", s.Guid)
			go ad.Container.Stop(c.cfg.StopGrace)
			ctr.logs.Close()
			continue
		}
		c.mu.Lock()
		if c.containers[s.Guid] != nil {
			c.mu.Unlock()
			c.log.Warn("stopping an adopted container the cell already holds", "guid", s.Guid)
			go ad.Container.Stop(c.cfg.StopGrace)
			ctr.logs.Close()
			continue
		}
		ctr.exec = ad.Container
		c.containers[s.Guid] = ctr
		c.wg.Add(1)
		c.mu.Unlock()
		c.log.Info("adopted a container", "container", ctr.describe())
		go c.runAdopted(ctr, s)
	}
	for _, ctr := range pending { // adoption failed: the backend removed it
		ctr.logs.Close()
	}
}

// adoptedContainer is the cell's record of an adopted container: claimed, started, with the
// resources and rootfs of its spec.
func (c *Cell) adoptedContainer(s executor.Spec) *container {
	ctx, cancel := context.WithCancel(c.base)
	ctr := &container{
		guid:       s.Guid,
		kind:       s.Kind,
		domain:     s.Domain,
		resources:  &modelsv1.Resources{MemoryMb: s.MemoryMB, DiskMb: s.DiskMB, MaxPids: s.MaxPids},
		rootfs:     s.Rootfs,
		constraint: s.PlacementConstraint.CloneVT(),
		ctx:        ctx,
		cancel:     cancel,
		done:       make(chan struct{}),
		phase:      phaseStarting,
		claimed:    true,
	}
	if s.Kind == executor.KindLRP {
		ctr.key = &modelsv1.ActualLRPKey{ProcessGuid: s.ProcessGuid, Index: s.Index, Domain: s.Domain}
	}
	return ctr
}

// runAdopted is an adopted container's lifecycle from its start on: watched like any other
// (an LRP's link consumer registered again, adoptLinks), then its on_destroy hooks, then
// released.
func (c *Cell) runAdopted(ctr *container, s executor.Spec) {
	defer c.release(ctr)
	defer func() {
		if err := c.runHooks(c.base, hookOnDestroy, c.cfg.Hooks.OnDestroy, s); err != nil {
			c.log.Warn("on_destroy hook failed", "guid", ctr.guid, "error", err)
		}
	}()
	ctr.logs.Cell("container adopted by a restarted rep")
	if ctr.kind == executor.KindTask {
		c.watchTask(ctr, ctr.exec, c.log.With("task_guid", ctr.guid))
		return
	}
	log := c.log.With("process_guid", ctr.key.GetProcessGuid(), "index", ctr.key.GetIndex(), "instance_guid", ctr.guid)
	go c.adoptLinks(ctr, log)
	c.watchLRP(ctr, ctr.exec, log, trace.SpanFromContext(context.Background()), func(string) {})
}
