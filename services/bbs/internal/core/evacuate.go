package core

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// slotRecords reads the ordinary and evacuating records of one instance slot.
func slotRecords(t *store.Txn, guid string, index int32) (ord, evac *modelsv1.ActualLRP, err error) {
	if ord, err = t.ActualLRP(guid, index, ordinary); err != nil {
		return nil, nil, err
	}
	evac, err = t.ActualLRP(guid, index, evacuating)
	return ord, evac, err
}

// unclaim returns a copy of a that waits for placement again.
func (c *ActualLRPs) unclaim(a *modelsv1.ActualLRP) *modelsv1.ActualLRP {
	next := c.changed(a, unclaimed)
	next.InstanceKey = nil
	next.NetInfo = nil
	next.Routable = false
	next.DrainingSince = nil
	return next
}

// EvacuateClaimedActualLRP gives up a CLAIMED instance on a draining cell: the slot is
// unclaimed for re-placement and the container is not kept.
func (c *ActualLRPs) EvacuateClaimedActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey) (bool, error) {
	return c.evacuateStep(ctx, "evacuate claimed", guid, index, func(t *store.Txn) (bool, *modelsv1.ActualLRP, error) {
		ord, evac, err := slotRecords(t, guid, index)
		if err != nil {
			return false, nil, err
		}
		if evac != nil && sameInstance(evac.GetInstanceKey(), ik) {
			deleteActual(t, evac)
		}
		if ord != nil && ord.GetState() == claimed && sameInstance(ord.GetInstanceKey(), ik) {
			restarted := c.unclaim(ord)
			return false, restarted, putActual(t, restarted)
		}
		return false, nil, nil
	})
}

// EvacuateRunningActualLRP keeps a RUNNING instance of a draining cell routable as an
// EVACUATING copy while its slot is placed again; once the replacement runs (or the slot is
// gone) the copy is withdrawn from routing and drained (drain.go), and then removed and the
// cell told to drop the container. The rep asks again at every poll until then.
func (c *ActualLRPs) EvacuateRunningActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey, net *modelsv1.ActualLRPNetInfo) (bool, error) {
	return c.evacuateStep(ctx, "evacuate running", guid, index, func(t *store.Txn) (bool, *modelsv1.ActualLRP, error) {
		ord, evac, err := slotRecords(t, guid, index)
		if err != nil {
			return false, nil, err
		}
		if evac != nil {
			if !sameInstance(evac.GetInstanceKey(), ik) {
				return false, nil, rpcerr.FailedPrecondition("%s is already evacuating as %s", describe(guid, index), describeInstance(evac.GetInstanceKey()))
			}
			if ord == nil || (ord.GetState() == running && !sameInstance(ord.GetInstanceKey(), ik)) {
				// Replaced, or no longer desired: unrouted, drained, then given up.
				done, err := c.evacuationDrained(t, evac)
				if err != nil || !done {
					return true, nil, err
				}
				deleteActual(t, evac)
				return false, nil, nil
			}
			if !proto.Equal(evac.GetNetInfo(), net) {
				next := c.changed(evac, running)
				next.NetInfo = net.CloneVT()
				return true, nil, putActual(t, next)
			}
			return true, nil, nil
		}
		if ord == nil {
			return false, nil, nil
		}
		mine := sameInstance(ord.GetInstanceKey(), ik) && (ord.GetState() == running || ord.GetState() == claimed)
		if !mine && ord.GetState() != unclaimed {
			return false, nil, nil // the slot belongs to another container now
		}
		copyOf := c.changed(ord, running)
		copyOf.Presence = evacuating
		copyOf.InstanceKey = ik.CloneVT()
		copyOf.NetInfo = net.CloneVT()
		copyOf.PlacementError = nil
		if !mine {
			copyOf.Zone = c.zoneOf(ik.GetCellId())
		}
		if err := putActual(t, copyOf); err != nil {
			return false, nil, err
		}
		if mine {
			restarted := c.unclaim(ord)
			return true, restarted, putActual(t, restarted)
		}
		return true, nil, nil
	})
}

// evacuationDrained reports whether the EVACUATING copy evac, whose replacement runs or whose
// slot is gone, has been drained and may be removed; a routed copy not yet draining is written
// draining (unrouted) in t.
func (c *ActualLRPs) evacuationDrained(t *store.Txn, evac *modelsv1.ActualLRP) (bool, error) {
	key := store.ActualKey(evac.GetKey().GetProcessGuid(), evac.GetKey().GetIndex(), evacuating)
	switch {
	case draining(evac):
		return c.drainDone(t.Revision(key), evac.GetDrainingSince().AsTime()), nil
	case evac.GetRoutable() && c.drainFirst():
		return false, putActual(t, c.drained(evac))
	}
	return true, nil
}

// EvacuateStoppedActualLRP removes the records of a container that stopped on a draining cell.
func (c *ActualLRPs) EvacuateStoppedActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey) (bool, error) {
	_, err := c.st.Update(ctx, func(t *store.Txn) error {
		ord, evac, err := slotRecords(t, guid, index)
		if err != nil {
			return err
		}
		found := false
		if evac != nil && sameInstance(evac.GetInstanceKey(), ik) {
			deleteActual(t, evac)
			found = true
		}
		if ord != nil && sameInstance(ord.GetInstanceKey(), ik) {
			deleteActual(t, ord)
			found = true
		}
		if !found {
			return rpcerr.NotFound("%s has no record of %s", describe(guid, index), describeInstance(ik))
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("evacuate stopped %s: %w", describe(guid, index), err)
	}
	return false, nil
}

// EvacuateCrashedActualLRP records a crash of a container on a draining cell: its evacuating
// copy is removed and, when it still holds the slot, the slot is crashed as by CrashActualLRP.
func (c *ActualLRPs) EvacuateCrashedActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey, reason string) (bool, error) {
	return c.evacuateStep(ctx, "evacuate crashed", guid, index, func(t *store.Txn) (bool, *modelsv1.ActualLRP, error) {
		ord, evac, err := slotRecords(t, guid, index)
		if err != nil {
			return false, nil, err
		}
		found := false
		if evac != nil && sameInstance(evac.GetInstanceKey(), ik) {
			deleteActual(t, evac)
			found = true
		}
		var after *modelsv1.ActualLRP
		if ord != nil && sameInstance(ord.GetInstanceKey(), ik) && (ord.GetState() == claimed || ord.GetState() == running) {
			after = c.crashed(ord, reason)
			found = true
			if err := putActual(t, after); err != nil {
				return false, nil, err
			}
		}
		if !found {
			return false, nil, rpcerr.NotFound("%s has no record of %s", describe(guid, index), describeInstance(ik))
		}
		return false, after, nil
	})
}

// RemoveEvacuatingActualLRP deletes the EVACUATING copy of an instance held by ik.
func (c *ActualLRPs) RemoveEvacuatingActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey) error {
	if err := c.removeRecord(ctx, guid, index, evacuating, ik); err != nil {
		return fmt.Errorf("remove evacuating: %w", err)
	}
	return nil
}

// evacuateStep runs step, one evacuation change of the slot guid/index, in one transaction
// (again on a lost race). step reports whether the cell keeps its container and the record, if
// any, that waits for placement again; that record is offered to the auctioneer once committed.
// An error names op and the slot.
func (c *ActualLRPs) evacuateStep(ctx context.Context, op, guid string, index int32, step func(t *store.Txn) (keep bool, restart *modelsv1.ActualLRP, err error)) (bool, error) {
	type outcome struct {
		keep    bool
		restart *modelsv1.ActualLRP
	}
	out, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (outcome, error) {
		keep, restart, err := step(t)
		return outcome{keep, restart}, err
	})
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", op, describe(guid, index), err)
	}
	if out.restart != nil {
		c.restartIfUnclaimed(ctx, out.restart)
	}
	return out.keep, nil
}
