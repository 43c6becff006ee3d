package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
)

// RestartApp restarts an app without downtime:
//
//  1. record the next version as pending, with the space's current pool and the app's stack,
//     and desire it at the BBS (the serving version is untouched);
//  2. wait until every instance of the pending version is RUNNING;
//  3. make it the serving version in the record and take the old version's routes away, so
//     that routers stop sending it requests;
//  4. after the route drain time, remove the old version's LRP.
//
// When the pending version cannot be placed because no cell satisfies its rootfs and pool
// (CELL_MISMATCH), or it does not run within the restart timeout, it is removed, the old version
// keeps serving and the app records the error; RestartApp answers FailedPrecondition. A stopped
// app is simply started at its next version. The record is the source of truth throughout: when
// the caller goes away or nsync restarts mid-way, the bulk loop finishes (or abandons) the
// restart from the record.
func (c *Core) RestartApp(ctx context.Context, guid string) (_ *nsyncv1.App, _ string, err error) {
	if err := models.ValidateGuid("guid", guid); err != nil {
		return nil, "", err
	}
	ctx, span := startStep(ctx, "nsync.restart", guid) // trace.go
	defer func() { endStep(span, err) }()
	// The record may change under us (the bulk loop records its own bookkeeping): a lost
	// compare-and-swap is retried from a fresh read a few times before it is the caller's.
	var (
		started *nsyncv1.App
		d       *modelsv1.DesiredLRP
		next    int64
	)
	dctx, dspan := startStep(ctx, "nsync.restart.desire", guid)
	for attempt := 0; ; attempt++ {
		started, d, next, err = c.beginRestart(dctx, guid)
		if err == nil || !errors.Is(err, rpcerr.ErrAborted) || attempt == restartCASAttempts-1 {
			break
		}
	}
	endStep(dspan, err)
	if err != nil {
		return nil, "", err
	}
	if started != nil {
		return started, d.GetProcessGuid(), nil
	}
	t := time.NewTicker(c.cfg.RestartPoll)
	defer t.Stop()
	wctx, wspan := startStep(ctx, "nsync.restart.wait_running", guid)
	for {
		done, err := c.advanceRestart(wctx, guid, next)
		if errors.Is(err, rpcerr.ErrAborted) {
			// The bulk loop wrote the record between our read and our write (it may have
			// advanced this very restart): read it again on the next tick.
			done, err = false, nil
		}
		if err != nil {
			err = fmt.Errorf("restart of %s to version %d continues in the background: %w", guid, next, err)
			endStep(wspan, err)
			return nil, "", err
		}
		if done {
			app, pg, err := c.restartResult(wctx, guid, next)
			endStep(wspan, err)
			if err != nil {
				return nil, "", err
			}
			rctx, rspan := startStep(ctx, "nsync.restart.drain", guid)
			c.drain(rctx, guid, app.GetVersion()-1)
			endStep(rspan, nil)
			return app, pg, nil
		}
		select {
		case <-ctx.Done():
			err := fmt.Errorf("restart of %s continues in the background: %w", guid, ctx.Err())
			endStep(wspan, err)
			return nil, "", err
		case <-t.C:
		}
	}
}

// restartCASAttempts bounds how often RestartApp re-reads the record after losing its
// compare-and-swap to a concurrent write.
const restartCASAttempts = 5

// beginRestart records the pending next version of app guid (or, for an app that is not
// started, starts the next version directly and returns the app) and desires it at the BBS.
func (c *Core) beginRestart(ctx context.Context, guid string) (started *nsyncv1.App, d *modelsv1.DesiredLRP, next int64, err error) {
	cur, err := c.getApp(ctx, guid)
	if err != nil {
		return nil, nil, 0, err
	}
	rec := proto.Clone(cur.Record).(*nsyncv1.AppRecord)
	if rec.GetPendingVersion() != 0 {
		return nil, nil, 0, rpcerr.FailedPrecondition("app %q is already restarting (version %d)", guid, rec.GetPendingVersion())
	}
	if d := rec.GetDeployment(); d != nil || rec.GetQueued() != nil {
		return nil, nil, 0, rpcerr.FailedPrecondition("app %q is deploying (%s); restart once the deployment is over", guid, d.GetId())
	}
	app := rec.GetApp()
	rootfs, constraint, err := c.placement(ctx, "app", app)
	if err != nil {
		return nil, nil, 0, err
	}
	next = lastVersion(rec) + 1
	d, err = c.lrp(ctx, app, next, rootfs, constraint)
	if err != nil {
		return nil, nil, 0, err
	}
	rec.LastError = nil
	if rec.GetState() != nsyncv1.AppState_APP_STATE_STARTED {
		// Nothing serves: start the next version directly.
		rec.State, rec.App.Version, rec.Rootfs, rec.PlacementConstraint = nsyncv1.AppState_APP_STATE_STARTED, next, rootfs, constraint
		if _, err := c.store.PutApp(ctx, rec, cur.ModRevision); err != nil {
			return nil, nil, 0, err
		}
		if err := c.desire(ctx, d); err != nil {
			c.log.Warn("desire at the BBS failed; the bulk loop retries", "process_guid", d.GetProcessGuid(), "error", err)
		}
		return rec.GetApp(), d, next, nil
	}
	rec.PendingVersion, rec.PendingRootfs, rec.PendingConstraint = next, rootfs, constraint
	rec.PendingSinceUnixMs = c.cfg.Now().UnixMilli()
	if _, err := c.store.PutApp(ctx, rec, cur.ModRevision); err != nil {
		return nil, nil, 0, err
	}
	if err := c.desire(ctx, d); err != nil {
		c.log.Warn("desire of the new version failed; the bulk loop retries", "process_guid", d.GetProcessGuid(), "error", err)
	}
	return nil, d, next, nil
}

// restartResult answers a finished restart of guid to version: the app when version serves,
// FailedPrecondition with the recorded error when it was abandoned.
func (c *Core) restartResult(ctx context.Context, guid string, version int64) (*nsyncv1.App, string, error) {
	cur, err := c.store.GetApp(ctx, guid)
	if err != nil {
		return nil, "", err
	}
	app := cur.Record.GetApp()
	if app.GetVersion() != version {
		msg := cur.Record.GetLastError().GetMessage()
		if msg == "" {
			msg = "the restart was abandoned"
		}
		return nil, "", rpcerr.FailedPrecondition("app %q: version %d could not be placed, version %d keeps serving: %s", guid, version, app.GetVersion(), msg)
	}
	return app, build.ProcessGuid(guid, version), nil
}

// advanceRestart moves the restart of guid to version one step: it completes it when every
// instance runs, abandons it on CELL_MISMATCH or after the restart timeout, and otherwise
// waits. It reports whether the restart is over (completed, abandoned, or replaced by another).
func (c *Core) advanceRestart(ctx context.Context, guid string, version int64) (bool, error) {
	cur, err := c.store.GetApp(ctx, guid)
	if err != nil {
		return false, err
	}
	rec := cur.Record
	if rec.GetPendingVersion() != version {
		return true, nil
	}
	pg := build.ProcessGuid(guid, version)
	resp, err := c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{pg}}})
	if err != nil {
		return false, err
	}
	running := int32(0)
	var mismatch, lastPE *modelsv1.PlacementError
	for _, a := range resp.GetActualLrps() {
		if a.GetPresence() != modelsv1.ActualLRP_PRESENCE_ORDINARY {
			continue
		}
		if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
			running++
		}
		if pe := a.GetPlacementError(); pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED {
			lastPE = pe
			if pe.GetCode() == modelsv1.PlacementError_CODE_CELL_MISMATCH {
				mismatch = pe
			}
		}
	}
	next := proto.Clone(rec).(*nsyncv1.AppRecord)
	next.PendingVersion, next.PendingRootfs, next.PendingConstraint, next.PendingSinceUnixMs = 0, "", nil, 0
	switch {
	case running >= rec.GetApp().GetInstances():
		old := rec.GetApp().GetVersion()
		next.App.Version, next.Rootfs, next.PlacementConstraint, next.LastError = version, rec.GetPendingRootfs(), rec.GetPendingConstraint(), nil
		if prev := rec.GetDrainingVersion(); prev != 0 {
			// A previous restart's old version is still draining: it has been unrouted for a
			// while already, so it goes now.
			if err := c.remove(ctx, build.ProcessGuid(guid, prev)); err != nil {
				return false, err
			}
		}
		next.DrainingVersion, next.DrainUntilUnixMs = old, c.cfg.Now().Add(c.cfg.RouteDrain).UnixMilli()
		if _, err := c.store.PutApp(ctx, next, cur.ModRevision); err != nil {
			return false, err
		}
		c.cfg.Observer.Restart("completed")
		c.log.Info("restart completed; draining the old version", "app_guid", guid, "version", version, "old_version", old, "drain", c.cfg.RouteDrain)
		c.unroute(ctx, build.ProcessGuid(guid, old))
		return true, nil
	case mismatch != nil:
		next.LastError = mismatch
		return true, c.abandon(ctx, next, cur.ModRevision, pg, "cell_mismatch")
	case c.cfg.RestartTimeout > 0 && c.cfg.Now().Sub(time.UnixMilli(rec.GetPendingSinceUnixMs())) > c.cfg.RestartTimeout:
		msg := fmt.Sprintf("version %d did not run within %s (%d/%d instances running)", version, c.cfg.RestartTimeout, running, rec.GetApp().GetInstances())
		if lastPE != nil {
			msg += ": " + lastPE.GetMessage()
		}
		next.LastError = &modelsv1.PlacementError{Code: lastPE.GetCode(), Message: msg}
		return true, c.abandon(ctx, next, cur.ModRevision, pg, "timed_out")
	}
	return false, nil
}

// unroute takes every route away from an LRP (its instances keep running).
func (c *Core) unroute(ctx context.Context, pg string) {
	u := &modelsv1.DesiredLRPUpdate{Routes: &modelsv1.RoutesUpdate{Routes: map[string][]byte{}}}
	if _, err := c.bbs.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: pg, Update: u}); err != nil {
		c.log.Warn("unroute of the old version failed", "process_guid", pg, "error", err)
	}
}

// drain waits the route drain time, then removes the draining version of guid (when ctx ends
// first, the bulk loop removes it once its drain time has passed).
func (c *Core) drain(ctx context.Context, guid string, version int64) {
	t := time.NewTimer(c.cfg.RouteDrain)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	if err := c.finishDrain(ctx, guid, version); err != nil {
		c.log.Warn("removing the drained version failed; the bulk loop removes it", "app_guid", guid, "version", version, "error", err)
	}
}

// finishDrain removes the drained version of guid and forgets it in the record.
func (c *Core) finishDrain(ctx context.Context, guid string, version int64) error {
	if err := c.remove(ctx, build.ProcessGuid(guid, version)); err != nil {
		return err
	}
	_, err := c.update(ctx, guid, func(rec *nsyncv1.AppRecord) error {
		if rec.GetDrainingVersion() == version {
			rec.DrainingVersion, rec.DrainUntilUnixMs = 0, 0
		}
		return nil
	})
	return err
}

// abandon records a failed restart (the old version keeps serving) and removes the new LRP.
func (c *Core) abandon(ctx context.Context, rec *nsyncv1.AppRecord, modRev int64, pg, outcome string) error {
	if _, err := c.store.PutApp(ctx, rec, modRev); err != nil {
		return err
	}
	c.cfg.Observer.Restart(outcome)
	c.log.Warn("restart abandoned; the old version keeps serving", "process_guid", pg, "error", rec.GetLastError().GetMessage())
	if err := c.remove(ctx, pg); err != nil {
		c.log.Warn("remove of the abandoned version failed; the bulk loop removes it", "process_guid", pg, "error", err)
	}
	return nil
}
