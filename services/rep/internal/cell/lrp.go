package cell

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/hashicorp/go-hclog"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// lrpStart is how Perform began an instance's start: the rep.start_lrp span, and the first
// claim, queued with the claims of the other instances of the same Perform.
type lrpStart struct {
	ctx  context.Context // carries span
	span trace.Span
	// claim is the first claim, queued; nil when the claims go as single calls (an older BBS).
	claim *pendingItem[*bbsv1.ClaimActualLRPRequest, *bbsv1.ClaimActualLRPResponse]
	// cancel ends the first claim's bound (the call timeout).
	cancel context.CancelFunc
}

// startLRPs starts the instances one Perform took, each in a goroutine of its own (runLRP),
// with their first claims queued together: one BBS call claims them all (the BBS then sends
// each desired LRP once), where goroutines queuing a claim each sent the first alone and the
// rest in a second call.
func (c *Cell) startLRPs(ctrs []*container) {
	if len(ctrs) == 0 {
		return
	}
	tracer := tracing.Tracer("rep")
	starts := make([]lrpStart, len(ctrs))
	ctxs, reqs := make([]context.Context, len(ctrs)), make([]*bbsv1.ClaimActualLRPRequest, len(ctrs))
	for i, ctr := range ctrs {
		guid, index := ctr.key.GetProcessGuid(), ctr.key.GetIndex()
		// The start — claim, create, the first RUNNING report — is one span in the trace of
		// the desire that asked for the instance.
		st := &starts[i]
		st.ctx, st.span = tracer.Start(tracing.Join(ctr.ctx, ctr.trace), "rep.start_lrp", trace.WithAttributes(
			attribute.String("gavel.process_guid", guid), attribute.Int("gavel.index", int(index)),
			attribute.String("gavel.instance_guid", ctr.guid), attribute.String("gavel.cell_id", c.cfg.CellID)))
		ctxs[i], st.cancel = context.WithTimeout(st.ctx, c.cfg.CallTimeout)
		reqs[i] = claimRequest(ctr, c.cfg.CellID)
	}
	items := c.claims.enqueue(ctxs, reqs)
	for i, ctr := range ctrs {
		if items != nil {
			starts[i].claim = items[i]
		}
		go c.runLRP(ctr, starts[i])
	}
}

// claimRequest is the claim of ctr's instance slot for cell, bringing the desired LRP back
// with it (include_desired_lrp): one BBS round trip before the container starts instead of two.
func claimRequest(ctr *container, cell string) *bbsv1.ClaimActualLRPRequest {
	return &bbsv1.ClaimActualLRPRequest{ProcessGuid: ctr.key.GetProcessGuid(), Index: ctr.key.GetIndex(),
		InstanceKey: ctr.instanceKey(cell), IncludeDesiredLrp: true}
}

// runLRP is an LRP instance's lifecycle, begun by startLRPs: claim (bringing the run info
// back) → create (rootfs, hooks, backend) → report RUNNING once healthy and every routability
// change → report the crash when it ends on its own → on_destroy hooks → release.
func (c *Cell) runLRP(ctr *container, st lrpStart) {
	defer c.release(ctr)
	defer st.cancel()
	guid, index := ctr.key.GetProcessGuid(), ctr.key.GetIndex()
	log := c.log.With("process_guid", guid, "index", index, "instance_guid", ctr.guid)
	tracer := tracing.Tracer("rep")
	sctx, span := st.ctx, st.span
	var endStart sync.Once
	started := func(why string) {
		endStart.Do(func() {
			if why != "" {
				span.SetStatus(otelcodes.Error, why)
			}
			span.End()
		})
	}
	defer started("ended before it ran")

	// The claim is tried until the BBS answers it either way (or the container is stopped),
	// never given up on a timeout: a claim that timed out may have landed, and a container
	// dropped then would leave its slot CLAIMED by nothing until convergence's claimed timeout
	// (5 minutes). Claiming again with the same instance key is a no-op, so the retry is safe;
	// and the reservation meanwhile counts as starting, so the auctioneer holds back. The first
	// attempt is the claim startLRPs queued.
	var desired *modelsv1.DesiredLRP
	failures := 0
	first := st.claim
	err := c.retry(sctx, "claim", 0, func(ctx context.Context) error {
		var resp *bbsv1.ClaimActualLRPResponse
		var err error
		if first != nil {
			resp, err = first.wait(ctx)
			first = nil
			st.cancel()
		} else {
			resp, err = c.claims.do(ctx, claimRequest(ctr, c.cfg.CellID))
		}
		desired = resp.GetDesiredLrp()
		if err != nil && retriable(err) {
			if failures++; failures == callAttempts {
				log.Warn("could not claim the instance yet, still trying", "error", err)
			}
		}
		return err
	})
	if err != nil {
		log.Info("claim failed, dropping the instance", "error", err)
		return
	}
	c.mu.Lock()
	ctr.claimed = true
	c.mu.Unlock()
	if c.isEvacuating() {
		c.evacuateClaimed(ctr, log)
		return
	}

	_, createSpan := tracer.Start(sctx, "rep.create_container")
	exec, cleanup, err := c.create(ctr, func(ctx context.Context) (executor.Spec, error) {
		if desired == nil { // a BBS that does not send it, or the LRP went away meanwhile
			if err := c.call(ctx, "fetch desired lrp", func(ctx context.Context) error {
				resp, err := c.bbs.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: guid})
				desired = resp.GetDesiredLrp()
				return err
			}); err != nil {
				return executor.Spec{}, err
			}
		}
		spec := lrpSpec(desired, ctr.key, ctr.guid)
		cons, err := c.addLinks(ctx, desired, &spec)
		if err != nil {
			return executor.Spec{}, err
		}
		c.mu.Lock()
		ctr.links = cons
		c.mu.Unlock()
		return spec, nil
	})
	if err != nil {
		createSpan.SetStatus(otelcodes.Error, err.Error())
		createSpan.End()
		c.setPhase(ctr, phaseCompleted)
		c.lrpEnded(ctr, log, fmt.Sprintf("failed to start: %v", err))
		return
	}
	createSpan.End()
	defer cleanup()
	log.Debug("container started")
	c.linksRegistered(ctr.ctx, ctr)
	c.watchLRP(ctr, exec, log, span, started)
}

// watchLRP follows a started LRP container until it ends: RUNNING reported (in span) once
// healthy, and again on every routability change, then its crash reported when it ends on
// its own. started is called once it is reported running.
func (c *Cell) watchLRP(ctr *container, exec executor.Container, log hclog.Logger, span trace.Span, started func(why string)) {
	net := exec.NetInfo()
	// A report of this container keeps trying until it lands, the container ends, or the rep
	// stops it: an instance that runs must not stay CLAIMED because the BBS was busy. Only a
	// report under way watches for the container's end (between reports this loop does), so a
	// running instance holds one goroutine, not two.
	report := func(ctx context.Context, routable, first bool) {
		rctx, end := untilClosed(ctx, exec.Done())
		defer end()
		c.reportRunning(rctx, ctr, log, net, routable, first)
	}
	healthy, routableCh := exec.Healthy(), exec.Routable()
	routable := false
	for waiting := true; waiting; {
		select {
		case <-healthy:
			healthy = nil
			ctr.logs.Cell("health check passed, instance running")
			routable = latest(routableCh, routable)
			report(trace.ContextWithSpan(ctr.ctx, span), routable, true)
			started("")
		case r, ok := <-routableCh:
			if !ok {
				routableCh = nil
				continue
			}
			if r != routable {
				routable = r
				if healthy == nil {
					report(ctr.ctx, routable, false)
				}
			}
		case <-exec.Done():
			waiting = false
		}
	}
	c.setPhase(ctr, phaseCompleted)
	res := exec.Result()
	reason := res.Reason
	if reason == "" {
		reason = "exited"
	}
	c.lrpEnded(ctr, log, reason)
}

// untilClosed is ctx, ended also once done is closed; end releases it.
func untilClosed(ctx context.Context, done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, end := context.WithCancel(ctx)
	go func() {
		select {
		case <-done:
			end()
		case <-ctx.Done():
		}
	}()
	return ctx, end
}

// latest drains the readiness changes already sent and returns the last one.
func latest(ch <-chan bool, current bool) bool {
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				return current
			}
			current = r
		default:
			return current
		}
	}
}

// create resolves the container's rootfs, runs the on_create hooks and starts it. cleanup,
// called once the container is done, runs the on_destroy hooks and releases the rootfs.
func (c *Cell) create(ctr *container, spec func(ctx context.Context) (executor.Spec, error)) (executor.Container, func(), error) {
	s, err := spec(ctr.ctx)
	if err != nil {
		return nil, nil, err
	}
	c.openLog(ctr, &s)
	ctr.logs.Cell("creating container")
	rfs, err := c.resolver.Resolve(ctr.ctx, s.Rootfs, ctr.guid, ImageAuth{Username: s.ImageUsername, Password: s.ImagePassword})
	if err != nil {
		return nil, nil, fmt.Errorf("resolve rootfs %s: %w", s.Rootfs, err)
	}
	s.RootfsPath, s.Chroot = rfs.Path, rfs.Chroot
	cleanup := func() {
		if err := c.runHooks(c.base, hookOnDestroy, c.cfg.Hooks.OnDestroy, s); err != nil {
			c.log.Warn("on_destroy hook failed", "guid", ctr.guid, "error", err)
		}
		if rfs.Release != nil {
			rfs.Release()
		}
	}
	if err := c.runHooks(ctr.ctx, hookOnCreate, c.cfg.Hooks.OnCreate, s); err != nil {
		cleanup()
		return nil, nil, err
	}
	if err := ctr.ctx.Err(); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("stopped before start: %w", err)
	}
	// The backend container outlives the lifecycle's context: only Stop ends it.
	exec, err := c.backend.Start(c.base, s)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("create container: %w", err)
	}
	c.setExec(ctr, exec)
	ctr.logs.Cell("container created")
	return exec, cleanup, nil
}

// reportRunning marks the instance healthy and tells the BBS it runs (first) or that its
// routability changed. While the cell evacuates the evacuation reports instead. When the BBS
// says the slot is no longer this container's, the container is stopped. A report the BBS
// cannot take yet (unavailable, busy, timed out) is retried with backoff until it lands or ctx
// ends (the container ended or is being stopped), whatever the bulk interval.
func (c *Cell) reportRunning(ctx context.Context, ctr *container, log hclog.Logger, net *modelsv1.ActualLRPNetInfo, routable, first bool) {
	ctr.report.Lock()
	defer ctr.report.Unlock()
	c.mu.Lock()
	if first {
		ctr.phase = phaseRunning
		ctr.healthy = true
		ctr.netInfo = net
	}
	ctr.routable = routable
	skip := ctr.stopping || c.evacuating
	c.mu.Unlock()
	if skip {
		return
	}
	key := ctr.key
	failures := 0
	err := c.retry(ctx, "start actual lrp", 0, func(ctx context.Context) error {
		_, err := c.starts.do(ctx, &bbsv1.StartActualLRPRequest{
			ProcessGuid: key.GetProcessGuid(), Index: key.GetIndex(), InstanceKey: ctr.instanceKey(c.cfg.CellID),
			NetInfo: net, Routable: routable,
		})
		if err != nil && retriable(err) {
			if failures++; failures == callAttempts {
				log.Warn("could not report the instance running yet, still trying", "error", err)
			}
		}
		return err
	})
	switch {
	case err == nil:
		if first {
			log.Info("instance running", "routable", routable)
		}
	case gone(err):
		log.Info("instance slot is no longer this container's, stopping it", "error", err)
		go c.stop(ctr)
	case first && ctx.Err() == nil:
		// Refused for good (not a timeout, not gone): the BBS does not know this container
		// runs, and once the claimed timeout passes it places the slot again. Stopped now, it
		// never runs twice.
		log.Warn("could not report the instance running, stopping it", "error", err)
		go c.stop(ctr)
	default:
		log.Warn("could not report the instance running", "error", err)
	}
}

// lrpEnded reports an instance that ended without the rep stopping it: a crash, or during
// evacuation an evacuated crash.
func (c *Cell) lrpEnded(ctr *container, log hclog.Logger, reason string) {
	ctr.report.Lock()
	defer ctr.report.Unlock()
	c.mu.Lock()
	stopping, evacuating, claimed := ctr.stopping, c.evacuating, ctr.claimed
	c.mu.Unlock()
	if stopping {
		ctr.logs.Cell("container stopped (%s)", reason)
	} else {
		ctr.logs.Cell("crashed: %s", reason)
	}
	if stopping || !claimed {
		log.Debug("container stopped by the rep", "reason", reason)
		return
	}
	c.obs.ContainerCrashed()
	key, ik := ctr.key, ctr.instanceKey(c.cfg.CellID)
	var err error
	if evacuating {
		err = c.call(c.base, "evacuate crashed actual lrp", func(ctx context.Context) error {
			_, err := c.bbs.EvacuateCrashedActualLRP(ctx, &bbsv1.EvacuateCrashedActualLRPRequest{
				ProcessGuid: key.GetProcessGuid(), Index: key.GetIndex(), InstanceKey: ik, ErrorMessage: reason})
			return err
		})
	} else {
		err = c.call(c.base, "crash actual lrp", func(ctx context.Context) error {
			_, err := c.bbs.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{
				ProcessGuid: key.GetProcessGuid(), Index: key.GetIndex(), InstanceKey: ik, ErrorMessage: reason})
			return err
		})
	}
	switch {
	case err == nil:
		log.Info("instance crashed", "reason", reason, "evacuating", evacuating)
	case gone(err):
		log.Debug("crashed instance's slot is no longer this container's", "reason", reason, "error", err)
	default:
		log.Warn("could not report the crash", "reason", reason, "error", err)
	}
}

// StopLRPInstance stops the container holding an instance (when this cell has it) and then
// removes the instance's record, ordinary or evacuating, from the BBS if it still names that
// container. It keeps going in the background when ctx ends first.
func (c *Cell) StopLRPInstance(ctx context.Context, key *modelsv1.ActualLRPKey, ik *modelsv1.ActualLRPInstanceKey) error {
	if ik.GetCellId() != c.cfg.CellID {
		return c.errWrongCell(ik.GetCellId())
	}
	log := c.log.With("process_guid", key.GetProcessGuid(), "index", key.GetIndex(), "instance_guid", ik.GetInstanceGuid())
	err := c.detached(ctx, c.stopBudget(), func(ctx context.Context) error {
		// From here until its records are gone the slot is this stop's to clear: the bulk
		// loop must not count the gap between the container's end and the removal as an orphan.
		c.mu.Lock()
		c.removing[ik.GetInstanceGuid()] = true
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			delete(c.removing, ik.GetInstanceGuid())
			c.mu.Unlock()
		}()
		if ctr := c.findLRP(key, ik.GetInstanceGuid()); ctr != nil {
			c.stop(ctr)
			select {
			case <-ctr.done:
			case <-ctx.Done():
				return fmt.Errorf("container %s did not stop: %w", ctr.guid, ctx.Err())
			}
			log.Info("instance stopped")
		}
		return c.removeRecords(ctx, key, ik)
	})
	if err != nil {
		return fmt.Errorf("stop lrp %s/%d instance %s: %w", key.GetProcessGuid(), key.GetIndex(), ik.GetInstanceGuid(), err)
	}
	return nil
}

// removeRecords removes the ordinary record of an instance slot if it names ik, else the
// evacuating one if it does.
func (c *Cell) removeRecords(ctx context.Context, key *modelsv1.ActualLRPKey, ik *modelsv1.ActualLRPInstanceKey) error {
	err := c.call(ctx, "remove actual lrp", func(ctx context.Context) error {
		_, err := c.bbs.RemoveActualLRP(ctx, &bbsv1.RemoveActualLRPRequest{ProcessGuid: key.GetProcessGuid(), Index: key.GetIndex(), InstanceKey: ik})
		return err
	})
	if err == nil || !gone(err) {
		return err
	}
	err = c.call(ctx, "remove evacuating actual lrp", func(ctx context.Context) error {
		_, err := c.bbs.RemoveEvacuatingActualLRP(ctx, &bbsv1.RemoveEvacuatingActualLRPRequest{ProcessGuid: key.GetProcessGuid(), Index: key.GetIndex(), InstanceKey: ik})
		return err
	})
	if err != nil && !gone(err) {
		return err
	}
	return nil
}

// stopBudget bounds a stop: the grace period, the on_destroy hooks and the BBS calls.
func (c *Cell) stopBudget() time.Duration {
	return c.cfg.StopGrace + time.Duration(max(1, len(c.cfg.Hooks.OnDestroy)))*c.cfg.Hooks.Timeout + 4*callAttempts*c.cfg.CallTimeout
}
