package core

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

const (
	ordinary   = modelsv1.ActualLRP_PRESENCE_ORDINARY
	evacuating = modelsv1.ActualLRP_PRESENCE_EVACUATING
	suspect    = modelsv1.ActualLRP_PRESENCE_SUSPECT
	unclaimed  = modelsv1.ActualLRP_STATE_UNCLAIMED
	claimed    = modelsv1.ActualLRP_STATE_CLAIMED
	running    = modelsv1.ActualLRP_STATE_RUNNING
	crashed    = modelsv1.ActualLRP_STATE_CRASHED
)

func describe(guid string, index int32) string { return fmt.Sprintf("actual lrp %s/%d", guid, index) }

func describeInstance(k *modelsv1.ActualLRPInstanceKey) string {
	return fmt.Sprintf("instance %s on cell %s", k.GetInstanceGuid(), k.GetCellId())
}

// ActualLRPs is the actual LRP (instance) lifecycle driven by the reps: claim, start, crash,
// fail, remove, retire, and the evacuation of draining cells (evacuate.go).
type ActualLRPs struct{ *deps }

// changed returns a copy of a with its modification tag bumped and since set when the state
// changes.
func (c *ActualLRPs) changed(a *modelsv1.ActualLRP, state modelsv1.ActualLRP_State) *modelsv1.ActualLRP {
	next := a.CloneVT()
	if next.GetState() != state {
		next.Since = c.now()
	}
	next.State = state
	next.ModificationTag = bump(a.GetModificationTag())
	// Only the change that made it RUNNING keeps its trace (StartActualLRP); TraceContext is the
	// form an older release wrote it in, cleared the same way.
	next.Trace = nil
	next.TraceContext = nil
	return next
}

// putActual stages a write of a under its key.
func putActual(t *store.Txn, a *modelsv1.ActualLRP) error {
	return t.Put(store.ActualKey(a.GetKey().GetProcessGuid(), a.GetKey().GetIndex(), a.GetPresence()), a)
}

func deleteActual(t *store.Txn, a *modelsv1.ActualLRP) {
	t.Delete(store.ActualKey(a.GetKey().GetProcessGuid(), a.GetKey().GetIndex(), a.GetPresence()))
}

// ordinaryLRP reads the ordinary record of an instance slot or fails with NotFound.
func ordinaryLRP(t *store.Txn, guid string, index int32) (*modelsv1.ActualLRP, error) {
	a, err := t.ActualLRP(guid, index, ordinary)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, rpcerr.NotFound("%s not found", describe(guid, index))
	}
	return a, nil
}

func (c *ActualLRPs) zoneOf(cellID string) string { return c.st.Cell(cellID).GetZone() }

// ClaimActualLRP moves an UNCLAIMED instance to CLAIMED by the given container. Claiming again
// with the same instance key is a no-op; any other claim fails with FailedPrecondition.
func (c *ActualLRPs) ClaimActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey) (*modelsv1.ActualLRP, error) {
	out, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.ActualLRP, error) {
		a, err := ordinaryLRP(t, guid, index)
		if err != nil {
			return nil, err
		}
		switch a.GetState() {
		case unclaimed:
		case claimed:
			if sameInstance(a.GetInstanceKey(), ik) {
				return a, nil
			}
			return nil, rpcerr.FailedPrecondition("%s is already claimed by %s", describe(guid, index), describeInstance(a.GetInstanceKey()))
		case running:
			return nil, rpcerr.FailedPrecondition("%s is already running as %s", describe(guid, index), describeInstance(a.GetInstanceKey()))
		default:
			return nil, rpcerr.FailedPrecondition("%s cannot be claimed in state %s", describe(guid, index), a.GetState())
		}
		next := c.changed(a, claimed)
		next.InstanceKey = ik.CloneVT()
		next.PlacementError = nil
		next.Zone = c.zoneOf(ik.GetCellId())
		return next, putActual(t, next)
	})
	if err != nil {
		return nil, fmt.Errorf("claim %s: %w", describe(guid, index), err)
	}
	return out, nil
}

// StartActualLRP marks an instance RUNNING in the given container with its network info. It is
// legal from UNCLAIMED, from CLAIMED by the same container, and again while RUNNING in the same
// container (to update network info or routability). With a domain, a slot the store has no
// record of is recorded RUNNING in that domain (a cell reporting a container the store does not
// know, after a restore): an extra instance until it is desired, which convergence retires only
// while its domain is fresh.
func (c *ActualLRPs) StartActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey, net *modelsv1.ActualLRPNetInfo, routable bool, domain string) (*modelsv1.ActualLRP, error) {
	out, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.ActualLRP, error) {
		a, err := t.ActualLRP(guid, index, ordinary)
		if err != nil {
			return nil, err
		}
		if a == nil {
			if domain == "" {
				return nil, rpcerr.NotFound("%s not found", describe(guid, index))
			}
			c.log.Info("recording an instance the store did not know", "process_guid", guid, "index", index,
				"domain", domain, "instance_guid", ik.GetInstanceGuid(), "cell_id", ik.GetCellId())
			a = &modelsv1.ActualLRP{
				Key:             &modelsv1.ActualLRPKey{ProcessGuid: guid, Index: index, Domain: domain},
				State:           unclaimed,
				Presence:        ordinary,
				Since:           c.now(),
				ModificationTag: newTag(),
			}
		}
		switch a.GetState() {
		case unclaimed:
		case claimed:
			if !sameInstance(a.GetInstanceKey(), ik) {
				return nil, rpcerr.FailedPrecondition("%s is claimed by %s, not %s", describe(guid, index), describeInstance(a.GetInstanceKey()), describeInstance(ik))
			}
		case running:
			if !sameInstance(a.GetInstanceKey(), ik) {
				return nil, rpcerr.FailedPrecondition("%s is running as %s, not %s", describe(guid, index), describeInstance(a.GetInstanceKey()), describeInstance(ik))
			}
			if draining(a) {
				routable = false // withdrawn from routing until it is stopped, whatever its readiness
			}
			if proto.Equal(a.GetNetInfo(), net) && a.GetRoutable() == routable {
				return a, nil
			}
		default:
			return nil, rpcerr.FailedPrecondition("%s cannot be started in state %s", describe(guid, index), a.GetState())
		}
		next := c.changed(a, running)
		next.InstanceKey = ik.CloneVT()
		next.NetInfo = net.CloneVT()
		next.Routable = routable
		next.PlacementError = nil
		next.Zone = c.zoneOf(ik.GetCellId())
		next.Trace = tracing.CarrySampled(ctx) // what follows (route publication) joins the trace
		// A running replacement ends the suspect copy of the slot (in the same transaction).
		sus, err := t.ActualLRP(guid, index, suspect)
		if err != nil {
			return nil, err
		}
		if sus != nil {
			deleteActual(t, sus)
		}
		return next, putActual(t, next)
	})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", describe(guid, index), err)
	}
	return out, nil
}

// crashed returns the record after a crash of a's container: UNCLAIMED when the policy
// restarts it at once, else CRASHED; either way without instance or network.
func (c *ActualLRPs) crashed(a *modelsv1.ActualLRP, reason string) *modelsv1.ActualLRP {
	count := models.CrashCountAfterCrash(a, c.cfg.Now())
	state := crashed
	if models.ShouldRestartImmediately(count) {
		state = unclaimed
	}
	next := c.changed(a, state)
	next.Since = c.now()
	next.CrashCount = count
	next.CrashReason = reason
	next.InstanceKey = nil
	next.NetInfo = nil
	next.Routable = false
	next.DrainingSince = nil
	return next
}

// CrashActualLRP records a crash of a CLAIMED or RUNNING instance in the given container. The
// record of an instance no longer desired is removed instead.
func (c *ActualLRPs) CrashActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey, reason string) (*modelsv1.ActualLRP, error) {
	out, _, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (*modelsv1.ActualLRP, error) {
		a, err := ordinaryLRP(t, guid, index)
		if err != nil {
			return nil, err
		}
		if s := a.GetState(); s != claimed && s != running {
			return nil, rpcerr.FailedPrecondition("%s cannot crash in state %s", describe(guid, index), s)
		}
		if !sameInstance(a.GetInstanceKey(), ik) {
			return nil, rpcerr.FailedPrecondition("%s belongs to %s, not %s", describe(guid, index), describeInstance(a.GetInstanceKey()), describeInstance(ik))
		}
		next := c.crashed(a, reason)
		// A crash of an instance no longer desired (its LRP removed or scaled below it while it
		// was starting or draining) ends it: the record goes, nothing restarts it, and no extra
		// instance is left for convergence to wait on a fresh domain for.
		sched, err := t.SchedulingInfo(guid)
		if err != nil {
			return nil, err
		}
		if sched == nil || index >= sched.GetInstances() {
			deleteActual(t, a)
			next.State = crashed
			return next, nil
		}
		return next, putActual(t, next)
	})
	if err != nil {
		return nil, fmt.Errorf("crash %s: %w", describe(guid, index), err)
	}
	c.restartIfUnclaimed(ctx, out)
	return out, nil
}

// restartIfUnclaimed asks for an UNCLAIMED instance to be placed, in ctx's trace.
func (c *ActualLRPs) restartIfUnclaimed(ctx context.Context, a *modelsv1.ActualLRP) {
	c.restartUnclaimed(ctx, []*modelsv1.ActualLRP{a})
}

// restartUnclaimed asks, in one request, for the UNCLAIMED instances of as to be placed
// (restartIfUnclaimed for many); the others, and instances whose LRP is gone, are skipped.
func (c *ActualLRPs) restartUnclaimed(ctx context.Context, as []*modelsv1.ActualLRP) {
	var starts []LRPStart
	at := map[string]int{} // process guid → its entry in starts
	for _, a := range as {
		if a.GetState() != unclaimed {
			continue
		}
		guid := a.GetKey().GetProcessGuid()
		i, ok := at[guid]
		if !ok {
			sched := c.st.SchedulingInfo(guid)
			if sched == nil {
				continue
			}
			i = len(starts)
			at[guid] = i
			starts = append(starts, LRPStart{SchedulingInfo: sched})
		}
		starts[i].Indices = append(starts[i].Indices, a.GetKey().GetIndex())
	}
	if len(starts) > 0 {
		c.auctionLRPs(ctx, starts)
	}
}

// FailActualLRP records why an UNCLAIMED instance could not be placed.
func (c *ActualLRPs) FailActualLRP(ctx context.Context, guid string, index int32, pe *modelsv1.PlacementError) error {
	_, err := c.st.Update(ctx, func(t *store.Txn) error {
		a, err := ordinaryLRP(t, guid, index)
		if err != nil {
			return err
		}
		if a.GetState() != unclaimed {
			return rpcerr.FailedPrecondition("%s cannot fail placement in state %s", describe(guid, index), a.GetState())
		}
		next := c.changed(a, unclaimed)
		next.PlacementError = pe.CloneVT()
		return putActual(t, next)
	})
	if err != nil {
		return fmt.Errorf("fail %s: %w", describe(guid, index), err)
	}
	return nil
}

// RemoveActualLRP deletes the ordinary record of an instance slot; when ik is set it must match
// the stored instance key.
func (c *ActualLRPs) RemoveActualLRP(ctx context.Context, guid string, index int32, ik *modelsv1.ActualLRPInstanceKey) error {
	return c.removeRecord(ctx, guid, index, ordinary, ik)
}

func (c *deps) removeRecord(ctx context.Context, guid string, index int32, p modelsv1.ActualLRP_Presence, ik *modelsv1.ActualLRPInstanceKey) error {
	_, err := c.st.Update(ctx, func(t *store.Txn) error {
		a, err := t.ActualLRP(guid, index, p)
		if err != nil {
			return err
		}
		if a == nil {
			return rpcerr.NotFound("%s (%s) not found", describe(guid, index), p)
		}
		if ik != nil && !sameInstance(a.GetInstanceKey(), ik) {
			return rpcerr.FailedPrecondition("%s belongs to %s, not %s", describe(guid, index), describeInstance(a.GetInstanceKey()), describeInstance(ik))
		}
		deleteActual(t, a)
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove %s: %w", describe(guid, index), err)
	}
	return nil
}

// retire stages the retirement of an ordinary record: deleted when it holds no container, else
// its container is drained (when routed) and stopped by the cell's rep once t commits, or its
// record removed when its cell is gone (withdraw).
func (c *ActualLRPs) retire(t *store.Txn, a *modelsv1.ActualLRP, out *retirement) error {
	guid, index := a.GetKey().GetProcessGuid(), a.GetKey().GetIndex()
	if (a.GetState() == claimed || a.GetState() == running) && c.st.Cell(a.GetInstanceKey().GetCellId()) != nil && c.cfg.Cells == nil {
		return rpcerr.FailedPrecondition("%s runs on live cell %s and this BBS has no rep client to stop it", describe(guid, index), a.GetInstanceKey().GetCellId())
	}
	return c.withdraw(t, a, out)
}

// RetireActualLRP stops an instance: a record without a container is deleted; a container on
// a live cell is withdrawn from routing, drained and then stopped by its rep, which removes the
// record; one on a vanished cell has its record removed.
func (c *ActualLRPs) RetireActualLRP(ctx context.Context, guid string, index int32) error {
	retired, rev, err := store.UpdateValue(ctx, c.st, func(t *store.Txn) (retirement, error) {
		a, err := ordinaryLRP(t, guid, index)
		if err != nil {
			return retirement{}, err
		}
		var out retirement
		if err := c.retire(t, a, &out); err != nil {
			return retirement{}, err
		}
		return out, nil
	})
	if err != nil {
		return fmt.Errorf("retire %s: %w", describe(guid, index), err)
	}
	c.retireAll(rev, retired)
	return nil
}
