package core

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// Drain first (docs/decisions/0022-drain-first-stops.md). A RUNNING, routable instance the BBS
// decides to stop is first withdrawn from routing: the transaction that decides the stop writes
// it with routable false and draining_since set, so its ActualLRPChanged event takes it out of
// every route-emitter's table. Its cell is asked to stop it (SIGTERM, grace, SIGKILL) only once
// every route-emitter has reported publishing a revision at or after that write
// (ReportRoutesPublished), or drain_timeout after draining_since, whichever comes first. With
// no route-emitter reporting there is nothing to wait for, and instances are stopped at once.
// The Drainer waits for the stops this BBS decided; convergence (the leader) finishes any drain
// whose timeout has passed, so a drain recorded by a BBS that died is never left behind.
// Instances that are not RUNNING and routable are stopped or removed at once, as before.

// DefaultDrainTimeout is how long a draining instance waits at most for the route-emitters
// before its cell is asked to stop it.
const DefaultDrainTimeout = 2 * time.Second

// retirement is what a transaction decided to do with the instances it retires once it
// commits: stop at once, or drain first then stop.
type retirement struct {
	stops  []stopRequest
	drains []drainRequest
}

// drainRequest is an instance withdrawn from routing that must be stopped once drained.
type drainRequest struct {
	stop stopRequest
	// rev is the revision the route-emitters must have published; 0 means the revision of the
	// transaction that recorded the drain.
	rev int64
	// since is when the drain began (draining_since).
	since time.Time
}

// draining reports whether a is being drained.
func draining(a *modelsv1.ActualLRP) bool { return a.GetDrainingSince() != nil }

// withdraw stages the retirement of record a in t: a RUNNING, routable instance on a live cell
// is written draining (unrouted) and stopped once drained; one already draining is drained
// again from where it is; any other container is stopped at once; a record without a
// container, or whose cell is gone, is deleted.
func (c *deps) withdraw(t *store.Txn, a *modelsv1.ActualLRP, out *retirement) error {
	key := store.ActualKey(a.GetKey().GetProcessGuid(), a.GetKey().GetIndex(), a.GetPresence())
	stop := stopRequest{key: a.GetKey(), instance: a.GetInstanceKey(), presence: a.GetPresence()}
	switch a.GetState() {
	case claimed, running:
	default:
		t.Delete(key)
		return nil
	}
	cell, err := t.Cell(a.GetInstanceKey().GetCellId()) // read in t: compared on commit
	if err != nil {
		return err
	}
	switch {
	case cell == nil:
		t.Delete(key) // its container went with its cell
	case c.cfg.Cells == nil:
		out.stops = append(out.stops, stop)
	case draining(a):
		out.drains = append(out.drains, drainRequest{stop: stop, rev: t.Revision(key), since: a.GetDrainingSince().AsTime()})
	case a.GetState() == running && a.GetRoutable() && c.drainFirst():
		next := c.drained(a)
		if err := t.Put(key, next); err != nil {
			return err
		}
		out.drains = append(out.drains, drainRequest{stop: stop, since: next.GetDrainingSince().AsTime()})
	default:
		out.stops = append(out.stops, stop)
	}
	return nil
}

// drainFirst reports whether routed instances are drained before they are stopped: drains are
// on (a positive drain timeout) and some route-emitter reports what it publishes (with none,
// there is nothing to wait for).
func (c *deps) drainFirst() bool {
	_, emitters, _ := c.st.RoutesPublished()
	return c.cfg.DrainTimeout > 0 && emitters > 0
}

// drained returns a copy of a withdrawn from routing and draining from now.
func (c *deps) drained(a *modelsv1.ActualLRP) *modelsv1.ActualLRP {
	next := a.CloneVT()
	next.Routable = false
	next.DrainingSince = c.now()
	next.ModificationTag = bump(a.GetModificationTag())
	return next
}

// undrained returns a copy of a draining a routed again (its slot is desired again before it
// was stopped); the Drainer finds it no longer draining and leaves it running.
func undrained(a *modelsv1.ActualLRP) *modelsv1.ActualLRP {
	next := a.CloneVT()
	next.Routable = true
	next.DrainingSince = nil
	next.ModificationTag = bump(a.GetModificationTag())
	return next
}

// drainDone reports whether an instance draining since since, whose record is at revision rev,
// may be stopped: every reporting route-emitter has published rev, none reports, or the drain
// timeout has passed.
func (c *deps) drainDone(rev int64, since time.Time) bool {
	published, emitters, _ := c.st.RoutesPublished()
	return emitters == 0 || published >= rev || !c.cfg.Now().Before(since.Add(c.cfg.DrainTimeout))
}

// retireAll carries out a committed retirement: the stops at once, the drains through the
// Drainer (rev is the revision the transaction committed at).
func (c *deps) retireAll(rev int64, r retirement) {
	c.stopInstances(r.stops)
	if len(r.drains) == 0 {
		return
	}
	for i := range r.drains {
		if r.drains[i].rev == 0 {
			r.drains[i].rev = rev
		}
	}
	if c.cfg.Drainer == nil || !c.cfg.Drainer.add(c, r.drains) {
		// No drainer here (or it stopped): the instances stay draining and convergence stops
		// them once their drain timeout has passed.
		c.log.Debug("no drainer running; convergence finishes the drains", "instances", len(r.drains))
	}
}

// stillDraining reports whether the record r names is still in the drain r waited for: the
// same container, draining since the same time (not routed again, nor drained anew since).
func (c *deps) stillDraining(r drainRequest) bool {
	list, _ := c.st.ActualLRPs(store.ListFilter{Guids: map[string]struct{}{r.stop.key.GetProcessGuid(): {}}})
	for _, a := range list {
		if a.GetKey().GetIndex() == r.stop.key.GetIndex() && a.GetPresence() == r.stop.presence {
			return draining(a) && sameInstance(a.GetInstanceKey(), r.stop.instance) && a.GetDrainingSince().AsTime().Equal(r.since)
		}
	}
	return false
}

// sameRecord reports whether two drains are of one record.
func sameRecord(a, b stopRequest) bool {
	return a.presence == b.presence && a.key.GetIndex() == b.key.GetIndex() && a.key.GetProcessGuid() == b.key.GetProcessGuid()
}

// Drainer waits for the instances this BBS withdrew from routing to be drained — every
// reporting route-emitter has published their removal, or the drain timeout has passed — and
// then asks their cells to stop them. It is a member of the BBS's run group; the drains it holds
// when it stops are left recorded in the store, where convergence finishes them.
type Drainer struct {
	log  hclog.Logger
	wake chan struct{}

	mu      sync.Mutex
	running bool
	pending []pendingDrain
}

// pendingDrain is one drain the Drainer waits for, with the core that stops it.
type pendingDrain struct {
	d   *deps
	req drainRequest
}

// NewDrainer returns a Drainer; nothing is drained until Run.
func NewDrainer(logger hclog.Logger) *Drainer {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Drainer{log: logger, wake: make(chan struct{}, 1)}
}

// add queues drains; it reports false when the Drainer is not running.
func (dr *Drainer) add(d *deps, reqs []drainRequest) bool {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	if !dr.running {
		return false
	}
	for _, r := range reqs {
		// A record drained again replaces its earlier drain.
		dr.pending = slices.DeleteFunc(dr.pending, func(p pendingDrain) bool { return sameRecord(p.req.stop, r.stop) })
		dr.pending = append(dr.pending, pendingDrain{d: d, req: r})
	}
	select {
	case dr.wake <- struct{}{}:
	default:
	}
	return true
}

// Pending is how many drains the Drainer waits for.
func (dr *Drainer) Pending() int {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	return len(dr.pending)
}

// Run drains until ctx ends.
func (dr *Drainer) Run(ctx context.Context, ready func()) error {
	dr.mu.Lock()
	dr.running = true
	dr.mu.Unlock()
	defer func() {
		dr.mu.Lock()
		dr.running = false
		if n := len(dr.pending); n > 0 {
			dr.log.Info("stopping: drains left to convergence", "instances", n)
		}
		dr.pending = nil
		dr.mu.Unlock()
	}()
	ready()
	for {
		next, changed := dr.step()
		timer := time.NewTimer(time.Hour)
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-dr.wake:
		case <-changed:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// step stops every pending drain that is done and returns when the next one times out (zero
// when none waits) and a channel closed when a route-emitter's report changes.
func (dr *Drainer) step() (next time.Time, changed <-chan struct{}) {
	dr.mu.Lock()
	pending := dr.pending
	dr.pending = nil
	dr.mu.Unlock()
	var keep []pendingDrain
	for _, p := range pending {
		var ch <-chan struct{}
		_, _, ch = p.d.st.RoutesPublished()
		changed = ch
		if !p.d.drainDone(p.req.rev, p.req.since) {
			keep = append(keep, p)
			// The deadline on the core's clock, as a wall-clock wait from now.
			at := time.Now().Add(p.req.since.Add(p.d.cfg.DrainTimeout).Sub(p.d.cfg.Now()))
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		if p.d.stillDraining(p.req) {
			p.d.stopInstances([]stopRequest{p.req.stop})
		}
	}
	dr.mu.Lock()
	dr.pending = append(keep, dr.pending...)
	dr.mu.Unlock()
	if changed == nil {
		changed = make(chan struct{}) // nothing pending: only wake or ctx
	}
	return next, changed
}
