package cell

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// Evacuate drains the cell: it takes no new work from now on, hands every LRP instance over to
// the BBS (a running one stays as an EVACUATING copy until its replacement runs), polls every
// EvacuationPollInterval and stops each container once the BBS no longer needs it. Instances
// still held after EvacuationTimeout are stopped and reported stopped. Tasks keep running to
// completion. Evacuate returns when the evacuation is over, or when ctx ends (the evacuation
// goes on in the background); calling it again joins the running evacuation.
func (c *Cell) Evacuate(ctx context.Context) error {
	c.mu.Lock()
	c.evacuating = true
	if c.evacDone == nil {
		c.evacDone = make(chan struct{})
		go c.evacuate(c.evacDone)
	}
	done := c.evacDone
	c.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("evacuation continues in the background: %w", ctx.Err())
	}
}

// evacuate polls until no LRP container is left or the timeout passes.
func (c *Cell) evacuate(done chan struct{}) {
	defer close(done)
	c.log.Info("evacuating", "timeout", c.cfg.EvacuationTimeout)
	deadline := time.Now().Add(c.cfg.EvacuationTimeout)
	tick := time.NewTicker(c.cfg.EvacuationPollInterval)
	defer tick.Stop()
	for {
		left := c.evacuateOnce()
		if left == 0 {
			c.log.Info("evacuation complete")
			return
		}
		if !time.Now().Before(deadline) {
			c.log.Warn("evacuation timed out, stopping the remaining instances", "instances", left)
			c.evacuationTimedOut()
			return
		}
		select {
		case <-c.base.Done():
			return
		case <-tick.C:
		}
	}
}

// lrpContainers lists the LRP containers the cell holds.
func (c *Cell) lrpContainers() []*container {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*container
	for _, ctr := range c.sortedLocked() {
		if ctr.kind == executor.KindLRP {
			out = append(out, ctr)
		}
	}
	return out
}

// evacuateOnce hands each claimed instance over and stops those the BBS does not keep. It
// returns how many LRP containers the cell still holds.
func (c *Cell) evacuateOnce() int {
	held := c.lrpContainers()
	for _, ctr := range held {
		c.mu.Lock()
		skip := ctr.stopping || ctr.phase == phaseCompleted || !ctr.claimed
		healthy, net := ctr.healthy, ctr.netInfo
		c.mu.Unlock()
		if skip {
			continue
		}
		log := c.log.With("process_guid", ctr.key.GetProcessGuid(), "index", ctr.key.GetIndex(), "instance_guid", ctr.guid)
		if healthy {
			c.evacuateRunning(ctr, log, net)
		} else {
			c.evacuateClaimed(ctr, log)
		}
	}
	return len(held)
}

// evacuateRunning asks the BBS whether to keep a running instance and stops it when not.
func (c *Cell) evacuateRunning(ctr *container, log hclog.Logger, net *modelsv1.ActualLRPNetInfo) {
	ctr.report.Lock()
	defer ctr.report.Unlock()
	if c.isStopping(ctr) {
		return
	}
	var keep bool
	err := c.call(c.base, "evacuate running actual lrp", func(ctx context.Context) error {
		resp, err := c.bbs.EvacuateRunningActualLRP(ctx, &bbsv1.EvacuateRunningActualLRPRequest{
			ProcessGuid: ctr.key.GetProcessGuid(), Index: ctr.key.GetIndex(),
			InstanceKey: ctr.instanceKey(c.cfg.CellID), NetInfo: net})
		keep = resp.GetKeepContainer()
		return err
	})
	if err != nil {
		log.Warn("could not evacuate the running instance, will retry", "error", err)
		return
	}
	if !keep {
		log.Info("instance handed over, stopping it")
		c.stopLocked(ctr)
	}
}

// evacuateClaimed gives a claimed, not yet running instance back to the BBS and stops it.
func (c *Cell) evacuateClaimed(ctr *container, log hclog.Logger) {
	ctr.report.Lock()
	defer ctr.report.Unlock()
	if c.isStopping(ctr) {
		return
	}
	err := c.call(c.base, "evacuate claimed actual lrp", func(ctx context.Context) error {
		_, err := c.bbs.EvacuateClaimedActualLRP(ctx, &bbsv1.EvacuateClaimedActualLRPRequest{
			ProcessGuid: ctr.key.GetProcessGuid(), Index: ctr.key.GetIndex(), InstanceKey: ctr.instanceKey(c.cfg.CellID)})
		return err
	})
	if err != nil && !gone(err) {
		log.Warn("could not evacuate the claimed instance, will retry", "error", err)
		return
	}
	log.Info("claimed instance given back, stopping it")
	c.stopLocked(ctr)
}

// stopLocked marks ctr stopping and stops it in the background. ctr.report must be held, so
// its lifecycle reports nothing more.
func (c *Cell) stopLocked(ctr *container) {
	c.mu.Lock()
	ctr.stopping = true
	c.mu.Unlock()
	go c.stop(ctr)
}

// maxParallelStops bounds the containers evacuationTimedOut stops at once.
const maxParallelStops = 64

// evacuationTimedOut stops every LRP container still held (up to maxParallelStops at once)
// and reports each stopped.
func (c *Cell) evacuationTimedOut() {
	var g errgroup.Group
	g.SetLimit(maxParallelStops)
	for _, ctr := range c.lrpContainers() {
		ctr.report.Lock()
		c.mu.Lock()
		already, claimed := ctr.stopping, ctr.claimed
		ctr.stopping = true
		c.mu.Unlock()
		ctr.report.Unlock()
		if already {
			continue
		}
		g.Go(func() error {
			c.stop(ctr)
			if !claimed {
				return nil
			}
			err := c.call(c.base, "evacuate stopped actual lrp", func(ctx context.Context) error {
				_, err := c.bbs.EvacuateStoppedActualLRP(ctx, &bbsv1.EvacuateStoppedActualLRPRequest{
					ProcessGuid: ctr.key.GetProcessGuid(), Index: ctr.key.GetIndex(), InstanceKey: ctr.instanceKey(c.cfg.CellID)})
				return err
			})
			if err != nil && !gone(err) {
				c.log.Warn("could not report the evacuated instance stopped", "instance_guid", ctr.guid, "error", err)
			}
			return nil
		})
	}
	_ = g.Wait() // each stop logs its own failure
}
