package core

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// DesiredLRPs is the desired LRP lifecycle: desire, update and remove, each writing the desired
// records together with the instance records the change creates or retires.
type DesiredLRPs struct{ *deps }

func (c *DesiredLRPs) newUnclaimed(sched *modelsv1.DesiredLRPSchedulingInfo, index int32) *modelsv1.ActualLRP {
	return &modelsv1.ActualLRP{
		Key:             &modelsv1.ActualLRPKey{ProcessGuid: sched.GetProcessGuid(), Index: index, Domain: sched.GetDomain()},
		State:           modelsv1.ActualLRP_STATE_UNCLAIMED,
		Presence:        modelsv1.ActualLRP_PRESENCE_ORDINARY,
		Since:           c.now(),
		ModificationTag: newTag(),
	}
}

// createMissing writes UNCLAIMED instances for every index below the desired count that has no
// ordinary record, and returns the indices created.
func (c *DesiredLRPs) createMissing(t *store.Txn, sched *modelsv1.DesiredLRPSchedulingInfo, existing []*modelsv1.ActualLRP) ([]int32, error) {
	have := map[int32]bool{}
	for _, a := range existing {
		if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
			have[a.GetKey().GetIndex()] = true
		}
	}
	var created []int32
	for i := int32(0); i < sched.GetInstances(); i++ {
		if have[i] {
			continue
		}
		if err := t.Put(store.ActualKey(sched.GetProcessGuid(), i, modelsv1.ActualLRP_PRESENCE_ORDINARY), c.newUnclaimed(sched, i)); err != nil {
			return nil, err
		}
		created = append(created, i)
	}
	return created, nil
}

// DesireLRP stores a new desired LRP and its UNCLAIMED instances in one transaction and asks
// for them to be placed.
func (c *DesiredLRPs) DesireLRP(ctx context.Context, d *modelsv1.DesiredLRP) (int64, error) {
	transformed, err := c.transformLRP(ctx, d)
	if err != nil {
		return 0, fmt.Errorf("desire lrp %s: %w", d.GetProcessGuid(), err)
	}
	if err := c.checkLinks(transformed); err != nil {
		return 0, fmt.Errorf("desire lrp %s: %w", d.GetProcessGuid(), err)
	}
	d = transformed.CloneVT()
	d.ModificationTag = newTag()
	rootfs, err := models.CanonicalRootfs(d.GetRootfs())
	if err != nil {
		return 0, rpcerr.Invalid("desired_lrp.rootfs", "%s", err.Error())
	}
	d.Rootfs = rootfs // stored canonical: the auctioneer and the reps see one spelling
	sched, run := models.SchedulingInfo(d), models.RunInfo(d)
	guid := d.GetProcessGuid()
	created, rev, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) ([]int32, error) {
		existing, err := t.SchedulingInfo(guid)
		if err != nil {
			return nil, err
		}
		if existing != nil {
			return nil, rpcerr.AlreadyExists("desired lrp %q already exists", guid)
		}
		if _, err := t.RunInfo(guid); err != nil {
			return nil, err
		}
		actuals, err := t.ActualLRPs(guid)
		if err != nil {
			return nil, err
		}
		if err := movePorts(t, guid, nil, routerPorts(sched.GetRoutes())); err != nil {
			return nil, err
		}
		if err := t.Put(store.DesiredSchedKey(guid), sched); err != nil {
			return nil, err
		}
		if err := t.Put(store.DesiredRunKey(guid), run); err != nil {
			return nil, err
		}
		return c.createMissing(t, sched, actuals)
	})
	if err != nil {
		return 0, fmt.Errorf("desire lrp %s: %w", guid, err)
	}
	c.auctionLRPs(ctx, []LRPStart{{SchedulingInfo: sched, Indices: created}})
	return rev, nil
}

// stopRequest is an instance that must be stopped by its cell once a transaction commits.
type stopRequest struct {
	key      *modelsv1.ActualLRPKey
	instance *modelsv1.ActualLRPInstanceKey
	presence modelsv1.ActualLRP_Presence
}

// desiredUpdate is what an attempt at UpdateDesiredLRP decided: the records written, the
// instances created and the instances to drain or stop once it commits.
type desiredUpdate struct {
	sched   *modelsv1.DesiredLRPSchedulingInfo
	run     *modelsv1.DesiredLRPRunInfo
	created []int32
	retired retirement
}

// UpdateDesiredLRP applies an update, creating or retiring instances when the count changes.
func (c *DesiredLRPs) UpdateDesiredLRP(ctx context.Context, guid string, u *modelsv1.DesiredLRPUpdate, expected *modelsv1.ModificationTag) (*modelsv1.DesiredLRP, int64, error) {
	var memo lrpTransformMemo // kept across attempts: a retry does not call the plugin again for the same input
	out, rev, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (desiredUpdate, error) {
		var none desiredUpdate
		sched, err := t.SchedulingInfo(guid)
		if err != nil {
			return none, err
		}
		if sched == nil {
			return none, rpcerr.NotFound("desired lrp %q not found", guid)
		}
		run, err := t.RunInfo(guid)
		if err != nil {
			return none, err
		}
		storedRun := run
		if expected != nil && (expected.GetEpoch() != sched.GetModificationTag().GetEpoch() || expected.GetIndex() != sched.GetModificationTag().GetIndex()) {
			return none, rpcerr.Aborted("desired lrp %q was modified: stored modification tag %s/%d, expected %s/%d",
				guid, sched.GetModificationTag().GetEpoch(), sched.GetModificationTag().GetIndex(), expected.GetEpoch(), expected.GetIndex())
		}
		if err := models.CheckImmutable("update", models.JoinDesiredLRP(sched, run), u); err != nil {
			return none, err
		}
		if d := u.GetLogDrains(); d != nil && !slices.Equal(d.GetLogDrains(), run.GetLogDrains()) {
			// The drains live in the run info: its key changes, and the DesiredLRPChanged event
			// (which cells follow for drains) carries them.
			run = run.CloneVT()
			run.LogDrains = slices.Clone(d.GetLogDrains())
			if err := t.Put(store.DesiredRunKey(guid), run); err != nil {
				return none, err
			}
		}
		next := sched.CloneVT()
		if u.Instances != nil {
			next.Instances = u.GetInstances()
		}
		if u.GetRoutes() != nil {
			next.Routes = maps.Clone(u.GetRoutes().GetRoutes())
		}
		if u.Annotation != nil {
			next.Annotation = u.GetAnnotation()
		}
		if u.GetLabels() != nil {
			next.Labels = maps.Clone(u.GetLabels().GetLabels())
		}
		if u.GetSpreadWith() != nil {
			next.SpreadWith = nil // an update without a peer clears it
			if sw := u.GetSpreadWith().GetSpreadWith(); sw != nil {
				next.SpreadWith = proto.CloneOf(sw)
			}
		}
		if c.cfg.Transformer != nil {
			transformed, err := memo.transform(ctx, c.deps, models.JoinDesiredLRP(next, run))
			if err != nil {
				return none, err
			}
			next = models.SchedulingInfo(transformed)
			if nextRun := models.RunInfo(transformed); !proto.Equal(nextRun, run) {
				run = nextRun
				if err := t.Put(store.DesiredRunKey(guid), run); err != nil {
					return none, err
				}
			}
		}
		// What is stored passes the checks a desire does, whatever changed it (the update or a
		// plugin): its required links resolve, and it owns exactly the router ports of its final
		// routes.
		if err := c.checkUpdatedLinks(storedRun, models.JoinDesiredLRP(next, run), u); err != nil {
			return none, err
		}
		if err := movePorts(t, guid, routerPorts(sched.GetRoutes()), routerPorts(next.GetRoutes())); err != nil {
			return none, err
		}
		next.ModificationTag = bump(sched.GetModificationTag())
		if err := t.Put(store.DesiredSchedKey(guid), next); err != nil {
			return none, err
		}
		actuals, err := t.ActualLRPs(guid)
		if err != nil {
			return none, err
		}
		out := desiredUpdate{sched: next, run: run}
		if next.GetInstances() > sched.GetInstances() {
			// An instance still draining from an earlier scale-down is desired again: route it
			// again rather than stop it and start another.
			for _, a := range actuals {
				if a.GetPresence() == ordinary && draining(a) && a.GetKey().GetIndex() < next.GetInstances() {
					if err := putActual(t, undrained(a)); err != nil {
						return none, err
					}
				}
			}
			out.created, err = c.createMissing(t, next, actuals)
			return out, err
		}
		for _, a := range actuals {
			if a.GetKey().GetIndex() >= next.GetInstances() {
				if err := c.withdraw(t, a, &out.retired); err != nil {
					return none, err
				}
			}
		}
		return out, nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("update desired lrp %s: %w", guid, err)
	}
	c.auctionLRPs(ctx, []LRPStart{{SchedulingInfo: out.sched, Indices: out.created}})
	c.retireAll(rev, out.retired)
	return models.JoinDesiredLRP(out.sched, out.run), rev, nil
}

// RemoveDesiredLRP deletes a desired LRP with every instance that holds no container, and asks
// the cells of the others to stop them (their reps then remove the records), draining the
// routed ones first (drain.go). A provider other LRPs consume is removed only when forced.
func (c *DesiredLRPs) RemoveDesiredLRP(ctx context.Context, guid string, force bool) (int64, error) {
	if err := c.checkNotConsumed(guid, force); err != nil {
		return 0, fmt.Errorf("remove desired lrp %s: %w", guid, err)
	}
	retired, rev, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (retirement, error) {
		var none retirement
		sched, err := t.SchedulingInfo(guid)
		if err != nil {
			return none, err
		}
		if sched == nil {
			return none, rpcerr.NotFound("desired lrp %q not found", guid)
		}
		if _, err := t.RunInfo(guid); err != nil {
			return none, err
		}
		actuals, err := t.ActualLRPs(guid)
		if err != nil {
			return none, err
		}
		if err := movePorts(t, guid, routerPorts(sched.GetRoutes()), nil); err != nil {
			return none, err
		}
		t.Delete(store.DesiredSchedKey(guid))
		t.Delete(store.DesiredRunKey(guid))
		var out retirement
		for _, a := range actuals {
			if err := c.withdraw(t, a, &out); err != nil {
				return none, err
			}
		}
		return out, nil
	})
	if err != nil {
		return 0, fmt.Errorf("remove desired lrp %s: %w", guid, err)
	}
	c.retireAll(rev, retired)
	return rev, nil
}

// stopInstances asks the cells of running instances to stop them. Instances whose cell is gone
// are removed at once; without a cell client they are left for convergence.
func (c *deps) stopInstances(stops []stopRequest) {
	for _, s := range stops {
		s := s
		cell := c.st.Cell(s.instance.GetCellId())
		if cell == nil {
			c.detach("remove instance of vanished cell", func(ctx context.Context) error {
				return c.removeRecord(ctx, s.key.GetProcessGuid(), s.key.GetIndex(), s.presence, s.instance)
			})
			continue
		}
		if c.cfg.Cells == nil {
			c.log.Warn("no rep client configured: instance keeps running until its cell stops it",
				"process_guid", s.key.GetProcessGuid(), "index", s.key.GetIndex(), "cell_id", s.instance.GetCellId())
			continue
		}
		c.detach("stop instance", func(ctx context.Context) error {
			return c.cfg.Cells.StopLRPInstance(ctx, cell, s.key, s.instance)
		})
	}
}

// DesiredLRP returns one desired LRP or NotFound, with the revision read.
func (c *DesiredLRPs) DesiredLRP(guid string) (*modelsv1.DesiredLRP, int64, error) {
	d, rev := c.st.DesiredLRP(guid)
	if d == nil {
		return nil, rev, rpcerr.NotFound("desired lrp %q not found", guid)
	}
	return d, rev, nil
}
