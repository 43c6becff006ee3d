package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
)

// BulkResult counts what one bulk pass changed at the BBS.
type BulkResult struct {
	// Desired, Updated and Removed count LRPs desired again, corrected in place and removed.
	Desired, Updated, Removed int
}

// Bulk runs one bulk pass: it brings the BBS's cf-apps domain in line with the records, moves
// pending restarts along, and — only when every step succeeded — refreshes the cf-apps domain,
// so that the BBS retires extra instances only on the word of a complete pass (Diego's domain
// freshness). The BBS's LRPs are listed before the records: every LRP nsync desires is
// recorded first, so an LRP in the listing whose record is missing from the later record
// listing is truly unknown.
func (c *Core) Bulk(ctx context.Context) (BulkResult, error) {
	start := c.cfg.Now()
	res, err := c.bulk(ctx)
	c.cfg.Observer.BulkPass(c.cfg.Now().Sub(start), err == nil)
	c.cfg.Observer.Reconciled(res.Desired, res.Updated, res.Removed)
	return res, err
}

func (c *Core) bulk(ctx context.Context) (BulkResult, error) {
	var res BulkResult
	infos, err := c.bbs.DesiredLRPSchedulingInfos(ctx, &bbsv1.DesiredLRPSchedulingInfosRequest{Filter: &bbsv1.Filter{Domain: build.AppsDomain}})
	if err != nil {
		return res, fmt.Errorf("list cf-apps LRPs: %w", err)
	}
	recs, _, err := c.store.Apps(ctx)
	if err != nil {
		return res, err
	}
	atBBS := map[string]*modelsv1.DesiredLRPSchedulingInfo{}
	for _, si := range infos.GetSchedulingInfos() {
		atBBS[si.GetProcessGuid()] = si
	}
	var errs []error
	expected := map[string]bool{}
	for _, r := range recs {
		rec := r.Record
		app := rec.GetApp()
		for _, v := range liveVersions(rec) {
			pg := build.ProcessGuid(app.GetGuid(), v)
			expected[pg] = true
			si, ok := atBBS[pg]
			if !ok {
				rootfs, constraint := rec.GetRootfs(), rec.GetPlacementConstraint()
				if v == rec.GetPendingVersion() {
					rootfs, constraint = rec.GetPendingRootfs(), rec.GetPendingConstraint()
				}
				d, err := c.lrp(ctx, app, v, rootfs, constraint)
				if err == nil {
					err = c.desire(ctx, d)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("desire %s: %w", pg, err))
					continue
				}
				c.log.Info("desired a missing LRP", "process_guid", pg)
				res.Desired++
				continue
			}
			u, err := lrpUpdate(app)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if si.GetInstances() == u.GetInstances() && sameRoutes(si.GetRoutes(), u.GetRoutes().GetRoutes()) {
				continue
			}
			if _, err := c.bbs.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: pg, Update: u}); err != nil {
				errs = append(errs, fmt.Errorf("update %s: %w", pg, err))
				continue
			}
			c.log.Info("corrected a drifted LRP", "process_guid", pg, "instances", u.GetInstances())
			res.Updated++
		}
	}
	now := c.cfg.Now()
	for _, r := range recs {
		rec := r.Record
		d := rec.GetDrainingVersion()
		if d == 0 {
			continue
		}
		if now.Before(time.UnixMilli(rec.GetDrainUntilUnixMs())) {
			expected[build.ProcessGuid(rec.GetApp().GetGuid(), d)] = true
			continue
		}
		if err := c.finishDrain(ctx, rec.GetApp().GetGuid(), d); err != nil {
			errs = append(errs, fmt.Errorf("remove drained %s: %w", build.ProcessGuid(rec.GetApp().GetGuid(), d), err))
			continue
		}
		expected[build.ProcessGuid(rec.GetApp().GetGuid(), d)] = true // removed just now
	}
	for pg := range atBBS {
		if expected[pg] {
			continue
		}
		if err := c.remove(ctx, pg); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", pg, err))
			continue
		}
		c.log.Info("removed an LRP nsync does not know", "process_guid", pg)
		res.Removed++
	}
	for _, r := range recs {
		if p := r.Record.GetPendingVersion(); p != 0 && r.Record.GetState() == nsyncv1.AppState_APP_STATE_STARTED {
			if _, err := c.advanceRestart(ctx, r.Record.GetApp().GetGuid(), p); err != nil {
				errs = append(errs, fmt.Errorf("restart of %s: %w", r.Record.GetApp().GetGuid(), err))
			}
		}
	}
	// Tombstones of deleted apps go once none of their LRPs was listed (those listed were just
	// removed above; the next pass confirms they are gone).
	listedApps := map[string]bool{}
	for _, si := range atBBS {
		listedApps[si.GetLabels()[build.LabelApp]] = true
	}
	for _, r := range recs {
		if r.Record.GetState() == nsyncv1.AppState_APP_STATE_DELETED && !listedApps[r.Record.GetApp().GetGuid()] {
			if err := c.store.DeleteApp(ctx, r.Record.GetApp().GetGuid(), r.ModRevision); err != nil && !errors.Is(err, rpcerr.ErrAborted) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	ttl := int64(c.cfg.DomainTTL / time.Second)
	if _, err := c.bbs.UpsertDomain(ctx, &bbsv1.UpsertDomainRequest{Domain: build.AppsDomain, TtlSeconds: max(ttl, 1)}); err != nil {
		return res, fmt.Errorf("refresh domain %s: %w", build.AppsDomain, err)
	}
	return res, nil
}

func sameRoutes(a, b map[string][]byte) bool {
	return maps.EqualFunc(a, b, bytes.Equal)
}
