package core

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
	"github.com/gavel-sched/gavel/services/nsync/internal/deploy"
)

// keptHistory bounds the finished deployments and the versions an app record keeps.
const keptHistory = 10

// Outcomes of DeployApp.
const (
	OutcomeCreated   = "created"
	OutcomeInPlace   = "updated in place"
	OutcomeUnchanged = "unchanged"
	OutcomeDeploying = "deploying"
	OutcomeQueued    = "queued"
	OutcomeStopped   = "recorded (the app is stopped)"
)

// validateOptions checks deployment options.
func validateOptions(field string, o *nsyncv1.DeploymentOptions) error {
	e := &rpcerr.InvalidError{}
	if _, ok := nsyncv1.DeploymentStrategy_name[int32(o.GetStrategy())]; !ok {
		e.Add(field+".strategy", "unknown strategy %d", o.GetStrategy())
	}
	if o.GetMaxInFlight() < 0 {
		e.Add(field+".max_in_flight", "must not be negative, got %d", o.GetMaxInFlight())
	}
	if o.GetCanaries() < 0 {
		e.Add(field+".canaries", "must not be negative, got %d", o.GetCanaries())
	}
	if o.GetCanaries() > 0 && o.GetStrategy() != nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY {
		e.Add(field+".canaries", "needs strategy canary, got %s", o.GetStrategy())
	}
	if o.GetMinHealthyTimeMs() < 0 {
		e.Add(field+".min_healthy_time_ms", "must not be negative, got %d", o.GetMinHealthyTimeMs())
	}
	if o.GetProgressDeadlineMs() < 0 {
		e.Add(field+".progress_deadline_ms", "must not be negative, got %d", o.GetProgressDeadlineMs())
	}
	return e.Err()
}

// DeployApp desires a new app (as DesireApp) or changes an existing one. A changed runnable
// definition (everything but instances and routes) becomes the next version and a deployment
// from the serving version to it, driven by the leader's loop (AdvanceDeployments); instances
// and routes are applied in place at once. While a deployment is active, a new change
// supersedes it: the active deployment is cancelled (and so reverted by the same steps) and the
// new one is queued to start from the serving version once the revert is over; a later change
// replaces the queued one. Bad input is refused before anything is stored.
func (c *Core) DeployApp(ctx context.Context, req *nsyncv1.DeployAppRequest) (app *nsyncv1.App, started *nsyncv1.Deployment, outcome string, err error) {
	ctx, span := startStep(ctx, "nsync.deploy", req.GetApp().GetGuid()) // trace.go
	defer func() {
		span.SetAttributes(attribute.String("gavel.deploy.outcome", outcome))
		endStep(span, err)
	}()
	in := req.GetApp()
	e := &rpcerr.InvalidError{}
	e.Merge("app", build.ValidateApp("app", in, c.cfg.Limits))
	e.Merge("app.routes", build.ValidateRoutePorts("app.routes", in))
	e.Merge("options", validateOptions("options", req.GetOptions()))
	if err := e.Err(); err != nil {
		return nil, nil, "", err
	}
	cur, err := c.store.GetApp(ctx, in.GetGuid())
	if rpcerr.Code(err) == codes.NotFound || (err == nil && cur.Record.GetState() == nsyncv1.AppState_APP_STATE_DELETED) {
		app, _, err := c.DesireApp(ctx, in)
		return app, nil, OutcomeCreated, err
	}
	if err != nil {
		return nil, nil, "", err
	}
	rootfs, constraint, err := c.placement(ctx, "app", in)
	if err != nil {
		return nil, nil, "", err
	}
	rec, err := c.update(ctx, in.GetGuid(), func(rec *nsyncv1.AppRecord) error {
		outcome, started = OutcomeInPlace, nil
		if rec.GetPendingVersion() != 0 {
			return rpcerr.FailedPrecondition("app %q is restarting (version %d); deploy once the restart is over", in.GetGuid(), rec.GetPendingVersion())
		}
		target := latestDefinition(rec)
		inPlace := rec.GetApp().GetInstances() != in.GetInstances() || !proto.Equal(rec.GetApp().GetRoutes(), in.GetRoutes())
		rec.App.Instances, rec.App.Routes = in.GetInstances(), in.GetRoutes()
		if build.SameRunnable(target, in) {
			if !inPlace {
				outcome = OutcomeUnchanged
			}
			return nil
		}
		next := lastVersion(rec) + 1
		def := proto.Clone(in).(*nsyncv1.App)
		def.Version = next
		if _, err := c.lrp(ctx, def, next, rootfs, constraint); err != nil {
			return err
		}
		now := c.cfg.Now()
		rec.Versions = trim(append([]*nsyncv1.AppVersion{{Version: next, App: def, Rootfs: rootfs, PlacementConstraint: constraint, CreatedUnixMs: now.UnixMilli()}}, rec.GetVersions()...))
		if rec.GetState() != nsyncv1.AppState_APP_STATE_STARTED {
			// Nothing runs: the new definition simply serves from the next start.
			rec.App, rec.Rootfs, rec.PlacementConstraint = proto.Clone(def).(*nsyncv1.App), rootfs, constraint
			outcome = OutcomeStopped
			return nil
		}
		d := deploy.Start(nextDeploymentID(rec), in.GetGuid(), rec.GetApp().GetVersion(), next, in.GetInstances(),
			deploy.WithDefaults(req.GetOptions(), c.cfg.ProgressDeadline), now)
		d.TraceContext = tracing.InjectSampled(ctx)
		started, outcome = d, OutcomeDeploying
		if active := rec.GetDeployment(); active != nil {
			d.State, outcome = nsyncv1.DeploymentState_DEPLOYMENT_STATE_QUEUED, OutcomeQueued
			if q := rec.GetQueued(); q != nil {
				q.State, q.Message, q.FinishedUnixMs = nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED, "superseded by "+d.GetId()+" before it started", now.UnixMilli()
				rec.Deployments = trim(append([]*nsyncv1.Deployment{q}, rec.GetDeployments()...))
			}
			rec.Queued = d
			if active.GetRevertOf() == "" && !active.GetCancelRequested() {
				active.CancelRequested, active.Message = true, "superseded by "+d.GetId()
			}
			return nil
		}
		rec.Deployment = d
		return nil
	})
	if err != nil {
		return nil, nil, "", err
	}
	if outcome == OutcomeInPlace {
		c.applyInPlace(ctx, rec)
	}
	if started != nil {
		c.kickDeployments()
	}
	return rec.GetApp(), started, outcome, nil
}

// latestDefinition is the definition the app is heading to: the queued deployment's version,
// else the active one's, else the serving one.
func latestDefinition(rec *nsyncv1.AppRecord) *nsyncv1.App {
	v := rec.GetApp().GetVersion()
	if d := rec.GetDeployment(); d != nil {
		v = d.GetToVersion()
	}
	if q := rec.GetQueued(); q != nil {
		v = q.GetToVersion()
	}
	def, _ := build.VersionWork(rec, v)
	return def
}

// trim keeps the newest keptHistory entries.
func trim[T any](s []T) []T { return s[:min(len(s), keptHistory)] }

// nextDeploymentID is "<app guid>-d<n>", n one more than any deployment the record knows.
func nextDeploymentID(rec *nsyncv1.AppRecord) string {
	guid := rec.GetApp().GetGuid()
	n := 0
	for _, d := range append([]*nsyncv1.Deployment{rec.GetDeployment(), rec.GetQueued()}, rec.GetDeployments()...) {
		if k, err := strconv.Atoi(strings.TrimPrefix(d.GetId(), guid+"-d")); err == nil && k > n {
			n = k
		}
	}
	return fmt.Sprintf("%s-d%d", guid, n+1)
}

// applyInPlace brings every live version of rec to its routes and instance count at the BBS;
// a failure is left to the bulk loop.
func (c *Core) applyInPlace(ctx context.Context, rec *nsyncv1.AppRecord) {
	for _, v := range build.LiveVersions(rec) {
		pg := build.ProcessGuid(rec.GetApp().GetGuid(), v)
		u, err := build.LRPUpdateFor(rec, v)
		if err == nil {
			_, err = c.bbs.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: pg, Update: u})
		}
		if err != nil {
			c.log.Warn("update at the BBS failed; the bulk loop corrects it", "process_guid", pg, "error", err)
		}
	}
}

// kickDeployments wakes the leader's deployment loop (when this instance leads).
func (c *Core) kickDeployments() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// RunDeployments drives every deployment while ctx (the leadership) lasts: a step every
// deploy poll, at once when this instance records a new deployment, and, while a deployment is
// active, when the BBS reports a change of an instance of the apps' domain (watchInstances, run
// only then), so that a step follows the instance it waited for instead of the next poll. The
// apps with a deployment are found by listing every record at the start, on a kick and every
// fullListEvery polls; in between only those apps are read.
func (c *Core) RunDeployments(ctx context.Context) {
	synced := map[string]bool{} // deployments whose counts this leader has applied at the BBS
	t := time.NewTicker(c.cfg.DeployPoll)
	defer t.Stop()
	wake := make(chan struct{}, 1)
	watch := &instanceWatch{c: c, wake: wake}
	defer watch.set(ctx, false)
	var deploying []string // nil: list every record
	for polls := 0; ; polls++ {
		if polls%fullListEvery == 0 {
			deploying = nil
		}
		next, err := c.AdvanceDeployments(ctx, synced, deploying)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("deployment step incomplete", "error", err)
		}
		deploying = next
		watch.set(ctx, len(deploying) > 0)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
			// Let the burst of events one change makes (claim, start, route published) arrive
			// before stepping: one step per burst, not one per event.
			if !retry.Sleep(ctx, wakeCoalesce) {
				return
			}
		case <-c.kick:
			deploying = nil // a new deployment (or promote/cancel) may be on an app not in the list
		}
	}
}

// instanceWatch runs watchInstances while a deployment is active, so that the leader follows
// the apps' instance events only when a step may wait on them.
type instanceWatch struct {
	c      *Core
	wake   chan<- struct{}
	cancel context.CancelFunc // ends the running watch; nil while none runs
	done   sync.WaitGroup
}

// set starts the watch (under ctx) when on and none runs, or ends it and waits for it when off.
func (w *instanceWatch) set(ctx context.Context, on bool) {
	switch {
	case on && w.cancel == nil:
		wctx, cancel := context.WithCancel(ctx)
		w.cancel = cancel
		w.done.Go(func() { w.c.watchInstances(wctx, w.wake) })
	case !on && w.cancel != nil:
		w.cancel()
		w.cancel = nil
		w.done.Wait()
	}
}

// wakeCoalesce is how long the deployment loop waits after an instance event before stepping,
// so that the events of one change wake it once.
const wakeCoalesce = 20 * time.Millisecond

// watchInstances follows the BBS's events of the apps' domain while ctx lasts (while a
// deployment is active) and wakes the deployment loop (wake, never blocking) on every batch of
// events. A broken stream is resumed after a backoff; the loop's poll is the backstop
// meanwhile, so nothing waits on the stream.
func (c *Core) watchInstances(ctx context.Context, wake chan<- struct{}) {
	b := watchRetry.BackOff()
	for ctx.Err() == nil {
		stream, err := c.bbs.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{Filter: &bbsv1.Filter{Domain: build.AppsDomain}})
		for err == nil {
			var resp *bbsv1.SubscribeToEventsResponse
			if resp, err = stream.Recv(); err != nil {
				break
			}
			b.Reset()
			if len(resp.GetEvents()) == 0 {
				continue
			}
			select {
			case wake <- struct{}{}:
			default:
			}
		}
		if ctx.Err() == nil {
			c.log.Debug("the BBS event stream ended; deployments step on the poll until it is back", "error", err)
			retry.Sleep(ctx, b.NextBackOff())
		}
	}
}

// watchRetry paces the resumption of watchInstances' event stream.
var watchRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}

// fullListEvery is how many deploy polls pass between full listings of the app records (a
// deployment recorded by another nsync instance is found within this many polls).
const fullListEvery = 20

// AdvanceDeployments moves the deployment of every app in guids (nil: of every app with one)
// one step, serialized with the bulk pass so that neither applies counts the other has already
// moved past. synced holds the deployments whose counts this leader applied at the BBS; a
// deployment not in it gets its counts applied again (a new leader resuming mid-way). It
// returns the apps that still have a deployment (active or queued).
func (c *Core) AdvanceDeployments(ctx context.Context, synced map[string]bool, guids []string) ([]string, error) {
	c.leaderMu.Lock()
	defer c.leaderMu.Unlock()
	if guids == nil {
		recs, _, err := c.store.Apps(ctx)
		if err != nil {
			return nil, err
		}
		guids = []string{}
		for _, r := range recs {
			if r.Record.GetDeployment() != nil || r.Record.GetQueued() != nil {
				guids = append(guids, r.Record.GetApp().GetGuid())
			}
		}
	}
	var (
		errs []error
		left = []string{}
	)
	for _, guid := range guids {
		still, err := c.advanceDeployment(ctx, guid, synced)
		if err != nil && !errors.Is(err, rpcerr.ErrAborted) {
			errs = append(errs, fmt.Errorf("deployment of %s: %w", guid, err))
		}
		if still || err != nil {
			left = append(left, guid)
		}
	}
	return left, errors.Join(errs...)
}

// advanceDeployment records the next step of app guid's deployment (one compare-and-swap of
// its record), then applies it at the BBS.
func (c *Core) advanceDeployment(ctx context.Context, guid string, synced map[string]bool) (bool, error) {
	err := c.stepDeployment(ctx, guid, synced)
	cur, gerr := c.store.GetApp(ctx, guid)
	still := gerr == nil && (cur.Record.GetDeployment() != nil || cur.Record.GetQueued() != nil)
	if rpcerr.Code(gerr) == codes.NotFound {
		return false, nil
	}
	return still, err
}

// stepDeployment is one step of advanceDeployment.
func (c *Core) stepDeployment(ctx context.Context, guid string, synced map[string]bool) error {
	cur, err := c.store.GetApp(ctx, guid)
	if rpcerr.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	rec := proto.Clone(cur.Record).(*nsyncv1.AppRecord)
	if rec.GetState() != nsyncv1.AppState_APP_STATE_STARTED {
		return nil
	}
	now := c.cfg.Now()
	if rec.GetDeployment() == nil {
		q := rec.GetQueued()
		if q == nil || rec.GetPendingVersion() != 0 {
			return nil
		}
		rec.Deployment = deploy.Start(q.GetId(), guid, rec.GetApp().GetVersion(), q.GetToVersion(), rec.GetApp().GetInstances(), q.GetOptions(), now)
		rec.Deployment.TraceContext = q.GetTraceContext()
		rec.Queued = nil
		if _, err := c.store.PutApp(ctx, rec, cur.ModRevision); err != nil {
			return err
		}
		c.log.Info("deployment started", "deployment", q.GetId(), "from", rec.GetApp().GetVersion(), "to", q.GetToVersion())
		return c.applyDeployment(ctx, rec, synced)
	}
	d := rec.GetDeployment()
	obs, err := c.observe(ctx, rec, d)
	if err != nil {
		return err
	}
	step := deploy.Advance(d, obs, now)
	if !step.Changed {
		if !synced[d.GetId()] {
			return c.applyDeployment(ctx, rec, synced)
		}
		return nil
	}
	rec.Deployment = step.Deployment
	var remove []int64
	switch step.Outcome {
	case deploy.Succeeded:
		fin := step.Deployment
		def, w := build.VersionWork(rec, fin.GetToVersion())
		def.Instances = rec.GetApp().GetInstances()
		rec.App, rec.Rootfs, rec.PlacementConstraint = def, w.Rootfs, w.Constraint
		if fin.GetRevertOf() == "" {
			rec.LastError = nil // a revert keeps the error it reverted for
		}
		for _, av := range rec.GetVersions() {
			if av.GetVersion() == fin.GetToVersion() {
				av.Healthy = true
			}
		}
		rec.Deployment, rec.Deployments = nil, trim(append([]*nsyncv1.Deployment{fin}, rec.GetDeployments()...))
		if fin.GetFromVersion() != fin.GetToVersion() {
			remove = append(remove, fin.GetFromVersion())
		}
		c.cfg.Observer.Deployment("succeeded")
	case deploy.Failed, deploy.Cancelled:
		fin := step.Deployment
		rec.Deployments = trim(append([]*nsyncv1.Deployment{fin}, rec.GetDeployments()...))
		if pe := fin.GetPlacementError(); pe != nil && step.Outcome == deploy.Failed {
			rec.LastError = &modelsv1.PlacementError{Code: pe.GetCode(), Message: fin.GetMessage()}
		} else if step.Outcome == deploy.Failed {
			rec.LastError = &modelsv1.PlacementError{Message: fin.GetMessage()}
		}
		revert := fin.GetRevertOf() == "" && (step.Outcome == deploy.Cancelled || !fin.GetOptions().GetNoAutoRevert())
		if revert {
			rec.Deployment = deploy.Revert(nextDeploymentID(rec), fin, now)
			rec.Deployment.TraceContext = fin.GetTraceContext()
		} else {
			// Abandoned: the version that is not the serving one goes, the serving one gets
			// back its instances at once.
			rec.Deployment = nil
			for _, v := range []int64{fin.GetFromVersion(), fin.GetToVersion()} {
				if v != rec.GetApp().GetVersion() {
					remove = append(remove, v)
				}
			}
		}
		outcome := "failed"
		if step.Outcome == deploy.Cancelled {
			outcome = "cancelled"
		}
		c.cfg.Observer.Deployment(outcome)
		c.log.Warn("deployment "+outcome, "deployment", fin.GetId(), "message", fin.GetMessage(), "reverting", revert)
	}
	if _, err := c.store.PutApp(ctx, rec, cur.ModRevision); err != nil {
		return err
	}
	if step.Outcome != deploy.Continue {
		recordOutcome(ctx, step.Deployment, step.Outcome)
	}
	if step.Outcome == deploy.Succeeded {
		c.log.Info("deployment succeeded", "deployment", d.GetId(), "version", rec.GetApp().GetVersion())
	}
	if rec.GetDeployment() != nil && (step.Scaled || !synced[rec.GetDeployment().GetId()]) {
		if err := c.applyDeployment(ctx, rec, synced); err != nil {
			return err
		}
	}
	if rec.GetDeployment() == nil && step.Outcome != deploy.Continue {
		c.applyInPlace(ctx, rec)
	}
	var errs []error
	for _, v := range remove {
		if err := c.remove(ctx, build.ProcessGuid(guid, v)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// applyDeployment brings both LRPs of rec's deployment to their recorded counts and spread
// peers (build.SpreadWith): the new version is desired when missing.
func (c *Core) applyDeployment(ctx context.Context, rec *nsyncv1.AppRecord, synced map[string]bool) (err error) {
	d := rec.GetDeployment()
	guid := rec.GetApp().GetGuid()
	ctx, span := startDeploymentStep(ctx, "nsync.deployment.scale", d, // trace.go
		attribute.Int("gavel.deploy.new_instances", int(build.Instances(rec, d.GetToVersion()))),
		attribute.Int("gavel.deploy.old_instances", int(build.Instances(rec, d.GetFromVersion()))))
	defer func() { endStep(span, err) }()
	for _, v := range []int64{d.GetToVersion(), d.GetFromVersion()} {
		pg := build.ProcessGuid(guid, v)
		n := build.Instances(rec, v)
		// The new LRP spreads with the old one (its peer; decision 0037); the old one has no
		// peer (a revert's old LRP had the failed version's as its peer: cleared).
		sw := build.SpreadWith(rec, v)
		u := &modelsv1.DesiredLRPUpdate{Instances: &n, SpreadWith: &modelsv1.SpreadWithUpdate{SpreadWith: sw}}
		_, err := c.bbs.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: pg, Update: u})
		if status.Code(err) == codes.NotFound {
			def, w := build.VersionWork(rec, v)
			var lrp *modelsv1.DesiredLRP
			if lrp, err = c.lrp(ctx, def, v, w.Rootfs, w.Constraint); err == nil {
				lrp.SpreadWith = sw
				err = c.desire(ctx, lrp)
			}
		}
		if err != nil {
			return fmt.Errorf("scale %s to %d: %w", pg, n, err)
		}
	}
	synced[d.GetId()] = true
	return nil
}

// observe reads what runs of d's two LRPs at the BBS.
func (c *Core) observe(ctx context.Context, rec *nsyncv1.AppRecord, d *nsyncv1.Deployment) (deploy.Observed, error) {
	guid := rec.GetApp().GetGuid()
	newPG, oldPG := build.ProcessGuid(guid, d.GetToVersion()), build.ProcessGuid(guid, d.GetFromVersion())
	resp, err := c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{newPG, oldPG}}})
	if err != nil {
		return deploy.Observed{}, err
	}
	o := deploy.Observed{Total: rec.GetApp().GetInstances()}
	for _, a := range resp.GetActualLrps() {
		idx := a.GetKey().GetIndex()
		switch a.GetKey().GetProcessGuid() {
		case newPG:
			if idx >= d.GetNewDesired() {
				continue
			}
			if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY && a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetRoutable() {
				o.NewReady++
			}
			if a.GetCrashCount() > 0 || a.GetState() == modelsv1.ActualLRP_STATE_CRASHED {
				o.NewCrashed++
				o.CrashReason = a.GetCrashReason()
			}
			if pe := a.GetPlacementError(); pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED && a.GetState() == modelsv1.ActualLRP_STATE_UNCLAIMED {
				o.NewPlacement = pe
			}
		case oldPG:
			o.OldLeft++
			if idx >= d.GetOldDesired() {
				o.OldBeyond++
			}
		}
	}
	return o, nil
}

// deploymentOf reads app guid and checks it has a deployment in one of states.
func (c *Core) changeDeployment(ctx context.Context, guid string, f func(rec *nsyncv1.AppRecord, d *nsyncv1.Deployment) error) (*nsyncv1.Deployment, error) {
	if err := models.ValidateGuid("app_guid", guid); err != nil {
		return nil, err
	}
	rec, err := c.update(ctx, guid, func(rec *nsyncv1.AppRecord) error { return f(rec, rec.GetDeployment()) })
	if err != nil {
		return nil, err
	}
	c.kickDeployments()
	return rec.GetDeployment(), nil
}

// PromoteDeployment continues app guid's paused canary deployment.
func (c *Core) PromoteDeployment(ctx context.Context, guid string) (*nsyncv1.Deployment, error) {
	return c.changeDeployment(ctx, guid, func(_ *nsyncv1.AppRecord, d *nsyncv1.Deployment) error {
		if d.GetState() != nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED {
			return rpcerr.FailedPrecondition("app %q has no paused deployment to promote%s", guid, describe(d))
		}
		d.State, d.Promoted, d.Message, d.ProgressUnixMs = nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING, true, "", c.cfg.Now().UnixMilli()
		return nil
	})
}

// CancelDeployment asks the leader's loop to cancel app guid's active deployment (which then
// reverts by the same steps) and drops a queued one.
func (c *Core) CancelDeployment(ctx context.Context, guid string) (*nsyncv1.Deployment, error) {
	return c.changeDeployment(ctx, guid, func(rec *nsyncv1.AppRecord, d *nsyncv1.Deployment) error {
		if !deploy.Active(d) || d.GetCancelRequested() || d.GetRevertOf() != "" {
			return rpcerr.FailedPrecondition("app %q has no deployment to cancel%s", guid, describe(d))
		}
		d.CancelRequested, d.Message = true, "cancelled"
		if q := rec.GetQueued(); q != nil {
			q.State, q.Message, q.FinishedUnixMs = nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED, "cancelled before it started", c.cfg.Now().UnixMilli()
			rec.Deployments, rec.Queued = trim(append([]*nsyncv1.Deployment{q}, rec.GetDeployments()...)), nil
		}
		return nil
	})
}

// describe says what d is, for a FailedPrecondition message.
func describe(d *nsyncv1.Deployment) string {
	switch {
	case d == nil:
		return " (none is active)"
	case d.GetRevertOf() != "":
		return fmt.Sprintf(" (%s reverts %s and cannot be cancelled)", d.GetId(), d.GetRevertOf())
	case d.GetCancelRequested():
		return fmt.Sprintf(" (%s is being cancelled)", d.GetId())
	}
	return fmt.Sprintf(" (%s is %s)", d.GetId(), strings.TrimPrefix(d.GetState().String(), "DEPLOYMENT_STATE_"))
}

// Deployments returns app guid's queued, active and finished deployments, newest first.
func (c *Core) Deployments(ctx context.Context, guid string) ([]*nsyncv1.Deployment, error) {
	if err := models.ValidateGuid("app_guid", guid); err != nil {
		return nil, err
	}
	cur, err := c.getApp(ctx, guid)
	if err != nil {
		return nil, err
	}
	var out []*nsyncv1.Deployment
	for _, d := range []*nsyncv1.Deployment{cur.Record.GetQueued(), cur.Record.GetDeployment()} {
		if d != nil {
			out = append(out, d)
		}
	}
	return append(out, cur.Record.GetDeployments()...), nil
}

// AppVersions returns app guid's recorded versions, newest first (the serving one included).
func (c *Core) AppVersions(ctx context.Context, guid string) ([]*nsyncv1.AppVersion, error) {
	if err := models.ValidateGuid("app_guid", guid); err != nil {
		return nil, err
	}
	cur, err := c.getApp(ctx, guid)
	if err != nil {
		return nil, err
	}
	return versions(cur.Record), nil
}

// versions are rec's versions, the serving one added when it predates the version history.
func versions(rec *nsyncv1.AppRecord) []*nsyncv1.AppVersion {
	out := rec.GetVersions()
	for _, av := range out {
		if av.GetVersion() == rec.GetApp().GetVersion() {
			return out
		}
	}
	serving := &nsyncv1.AppVersion{Version: rec.GetApp().GetVersion(), App: rec.GetApp(), Rootfs: rec.GetRootfs(), PlacementConstraint: rec.GetPlacementConstraint(), Healthy: true}
	return append([]*nsyncv1.AppVersion{serving}, out...)
}

// RollbackApp deploys the definition of an earlier version of app guid (version 0: the newest
// healthy version before the serving one) as a new version.
func (c *Core) RollbackApp(ctx context.Context, req *nsyncv1.RollbackAppRequest) (*nsyncv1.Deployment, error) {
	e := &rpcerr.InvalidError{}
	e.Merge("app_guid", models.ValidateGuid("app_guid", req.GetAppGuid()))
	if req.GetVersion() < 0 {
		e.Add("version", "must not be negative, got %d", req.GetVersion())
	}
	e.Merge("options", validateOptions("options", req.GetOptions()))
	if err := e.Err(); err != nil {
		return nil, err
	}
	cur, err := c.getApp(ctx, req.GetAppGuid())
	if err != nil {
		return nil, err
	}
	rec := cur.Record
	var target *nsyncv1.AppVersion
	for _, av := range versions(rec) {
		if req.GetVersion() == 0 && av.GetVersion() < rec.GetApp().GetVersion() && (target == nil || av.GetHealthy() && !target.GetHealthy()) {
			target = av
		}
		if req.GetVersion() != 0 && av.GetVersion() == req.GetVersion() {
			target = av
		}
	}
	if target == nil {
		return nil, rpcerr.FailedPrecondition("app %q has no recorded version %d to roll back to (the last %d are kept)", req.GetAppGuid(), req.GetVersion(), keptHistory)
	}
	def := proto.Clone(target.GetApp()).(*nsyncv1.App)
	def.Instances, def.Routes = rec.GetApp().GetInstances(), rec.GetApp().GetRoutes()
	_, d, outcome, err := c.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: def, Options: req.GetOptions()})
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, rpcerr.FailedPrecondition("app %q: version %d's definition is what the app runs already (%s)", req.GetAppGuid(), target.GetVersion(), outcome)
	}
	return d, nil
}
