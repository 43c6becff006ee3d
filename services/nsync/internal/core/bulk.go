package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
	"github.com/gavel-sched/gavel/services/nsync/internal/bulk"
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
// listing is truly unknown. The pass is planned purely from what it listed (bulk.Make) and
// the plan applied here (applyBulk).
func (c *Core) Bulk(ctx context.Context) (BulkResult, error) {
	c.leaderMu.Lock()
	defer c.leaderMu.Unlock()
	start := c.cfg.Now()
	res, err := c.bulk(ctx)
	c.cfg.Observer.BulkPass(c.cfg.Now().Sub(start), err == nil)
	c.cfg.Observer.Reconciled(res.Desired, res.Updated, res.Removed)
	return res, err
}

// bulk lists the BBS's LRPs, then the records, plans, applies and, when all went well,
// refreshes the domain.
func (c *Core) bulk(ctx context.Context) (BulkResult, error) {
	listedAt, err := c.store.Revision(ctx)
	if err != nil {
		return BulkResult{}, err
	}
	infos, err := c.bbs.DesiredLRPSchedulingInfos(ctx, &bbsv1.DesiredLRPSchedulingInfosRequest{Filter: &bbsv1.Filter{Domain: build.AppsDomain}})
	if err != nil {
		return BulkResult{}, fmt.Errorf("list cf-apps LRPs: %w", err)
	}
	recs, _, err := c.store.Apps(ctx)
	if err != nil {
		return BulkResult{}, err
	}
	snap := bulk.Snapshot{LRPs: infos.GetSchedulingInfos(), Apps: make([]bulk.App, 0, len(recs)), Now: c.cfg.Now(), ListedAt: listedAt}
	for _, r := range recs {
		snap.Apps = append(snap.Apps, bulk.App{Record: r.Record, ModRevision: r.ModRevision})
	}
	p := bulk.Make(snap)
	res, errs := c.applyBulk(ctx, p.Changes)
	if err := errors.Join(append(p.Errors, errs...)...); err != nil {
		return res, err
	}
	ttl := int64(c.cfg.DomainTTL / time.Second)
	if _, err := c.bbs.UpsertDomain(ctx, &bbsv1.UpsertDomainRequest{Domain: build.AppsDomain, TtlSeconds: max(ttl, 1)}); err != nil {
		return res, fmt.Errorf("refresh domain %s: %w", build.AppsDomain, err)
	}
	return res, nil
}

// applyBulk applies the changes of a bulk plan in order, one at a time; a failed change is
// returned among the errors and the next pass plans it again.
func (c *Core) applyBulk(ctx context.Context, changes []bulk.Change) (BulkResult, []error) {
	var res BulkResult
	var errs []error
	for _, ch := range changes {
		switch ch := ch.(type) {
		case bulk.Desire:
			d, err := c.lrp(ctx, ch.App, ch.Version, ch.Rootfs, ch.Constraint)
			if err == nil {
				d.SpreadWith = ch.SpreadWith
				err = c.desire(ctx, d)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("desire %s: %w", ch.ProcessGuid, err))
				continue
			}
			c.log.Info("desired a missing LRP", "process_guid", ch.ProcessGuid)
			res.Desired++
		case bulk.Update:
			if _, err := c.bbs.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: ch.ProcessGuid, Update: ch.Update}); err != nil {
				errs = append(errs, fmt.Errorf("update %s: %w", ch.ProcessGuid, err))
				continue
			}
			c.log.Info("corrected a drifted LRP", "process_guid", ch.ProcessGuid, "instances", ch.Update.GetInstances())
			res.Updated++
		case bulk.FinishDrain:
			if err := c.finishDrain(ctx, ch.AppGuid, ch.Version); err != nil {
				errs = append(errs, fmt.Errorf("remove drained %s: %w", build.ProcessGuid(ch.AppGuid, ch.Version), err))
			}
		case bulk.Remove:
			if err := c.remove(ctx, ch.ProcessGuid); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", ch.ProcessGuid, err))
				continue
			}
			c.log.Info("removed an LRP nsync does not know", "process_guid", ch.ProcessGuid)
			res.Removed++
		case bulk.AdvanceRestart:
			if _, err := c.advanceRestart(ctx, ch.AppGuid, ch.Version); err != nil {
				errs = append(errs, fmt.Errorf("restart of %s: %w", ch.AppGuid, err))
			}
		case bulk.DeleteTombstone:
			if err := c.store.DeleteApp(ctx, ch.AppGuid, ch.ModRevision); err != nil && !errors.Is(err, rpcerr.ErrAborted) {
				errs = append(errs, err)
			}
		default:
			errs = append(errs, fmt.Errorf("bulk change %T has no apply step", ch))
		}
	}
	return res, errs
}
