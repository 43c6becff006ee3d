package scale

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

// placed is where and since when an instance slot runs.
type placed struct {
	instanceGUID, cellID string
	at                   time.Time
}

// observer follows the BBS event stream and the route-emitter's table, as a client would, and
// keeps what the report needs: which instance slots run where, when each first ran, when each
// container was first seen RUNNING in the events and routed in the table, and which cells
// disappeared.
type observer struct {
	mu           sync.Mutex
	running      map[string]placed    // "guid/index" → the RUNNING ordinary instance
	firstRunning map[string]time.Time // "guid/index" → when it first ran
	eventSeen    map[string]time.Time // instance guid → RUNNING event received
	routeSeen    map[string]time.Time // instance guid → endpoint received from the route-emitter
	disappeared  map[string]time.Time // cell id → CellDisappeared received
	unclaimedAt  map[string]time.Time // "guid/index" → last seen turning UNCLAIMED
	claimedAt    map[string]time.Time // "guid/index" → last seen turning CLAIMED
	ranOn        map[string][]string  // "guid/index" → every cell it was seen RUNNING on, in order
	errs         []error
}

func newObserver() *observer {
	return &observer{
		running: map[string]placed{}, firstRunning: map[string]time.Time{},
		eventSeen: map[string]time.Time{}, routeSeen: map[string]time.Time{}, disappeared: map[string]time.Time{},
		unclaimedAt: map[string]time.Time{}, claimedAt: map[string]time.Time{}, ranOn: map[string][]string{},
	}
}

func slot(k *modelsv1.ActualLRPKey) string {
	return fmt.Sprintf("%s/%d", k.GetProcessGuid(), k.GetIndex())
}

// followEvents consumes the BBS event stream until ctx ends.
func (o *observer) followEvents(ctx context.Context, bbs bbsv1.BBSServiceClient, ready chan<- struct{}) {
	open := func() (recver[*bbsv1.SubscribeToEventsResponse], error) {
		return bbs.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{})
	}
	follow(ctx, o, "subscribe to events", "event stream", open, ready, func(m *bbsv1.SubscribeToEventsResponse, now time.Time) {
		for _, ev := range m.GetEvents() {
			switch k := ev.GetKind().(type) {
			case *bbsv1.Event_ActualLrpChanged:
				o.actual(k.ActualLrpChanged.GetAfter(), now)
			case *bbsv1.Event_ActualLrpCreated:
				o.actual(k.ActualLrpCreated.GetActualLrp(), now)
			case *bbsv1.Event_ActualLrpRemoved:
				a := k.ActualLrpRemoved.GetActualLrp()
				if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
					delete(o.running, slot(a.GetKey()))
				}
			case *bbsv1.Event_CellDisappeared:
				o.disappeared[k.CellDisappeared.GetCell().GetCellId()] = now
			}
		}
	})
}

// recver is a server stream as follow reads it.
type recver[M any] interface {
	Recv() (M, error)
}

// follow opens a stream (failing the run with opening when it cannot), closes ready, and hands
// each message with its arrival time to handle, o.mu held, until ctx ends; a stream that breaks
// first fails the run with broken.
func follow[M any](ctx context.Context, o *observer, opening, broken string, open func() (recver[M], error), ready chan<- struct{}, handle func(m M, now time.Time)) {
	stream, err := open()
	if err != nil {
		o.fail(fmt.Errorf("%s: %w", opening, err))
		close(ready)
		return
	}
	close(ready)
	for {
		m, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil {
				o.fail(fmt.Errorf("%s: %w", broken, err))
			}
			return
		}
		now := time.Now()
		o.mu.Lock()
		handle(m, now)
		o.mu.Unlock()
	}
}

// actual records one instance record's new state; o.mu is held.
func (o *observer) actual(a *modelsv1.ActualLRP, now time.Time) {
	if a.GetPresence() != modelsv1.ActualLRP_PRESENCE_ORDINARY {
		return
	}
	s := slot(a.GetKey())
	if a.GetState() != modelsv1.ActualLRP_STATE_RUNNING {
		delete(o.running, s)
		switch a.GetState() {
		case modelsv1.ActualLRP_STATE_UNCLAIMED:
			o.unclaimedAt[s] = now
		case modelsv1.ActualLRP_STATE_CLAIMED:
			o.claimedAt[s] = now
		}
		return
	}
	ig := a.GetInstanceKey().GetInstanceGuid()
	if cur, ok := o.running[s]; ok && cur.instanceGUID == ig {
		return
	}
	o.running[s] = placed{instanceGUID: ig, cellID: a.GetInstanceKey().GetCellId(), at: now}
	o.ranOn[s] = append(o.ranOn[s], a.GetInstanceKey().GetCellId())
	if _, ok := o.firstRunning[s]; !ok {
		o.firstRunning[s] = now
	}
	if _, ok := o.eventSeen[ig]; !ok {
		o.eventSeen[ig] = now
	}
}

// followRoutes consumes the route-emitter's WatchRoutes stream until ctx ends.
func (o *observer) followRoutes(ctx context.Context, re routeemitterv1.RouteEmitterServiceClient, ready chan<- struct{}) {
	open := func() (recver[*routeemitterv1.WatchRoutesResponse], error) {
		return re.WatchRoutes(ctx, &routeemitterv1.WatchRoutesRequest{})
	}
	follow(ctx, o, "watch routes", "route stream", open, ready, func(m *routeemitterv1.WatchRoutesResponse, now time.Time) {
		for _, r := range m.GetUpserts() {
			for _, ep := range r.GetEndpoints() {
				if _, ok := o.routeSeen[ep.GetInstanceGuid()]; !ok {
					o.routeSeen[ep.GetInstanceGuid()] = now
				}
			}
		}
	})
}

func (o *observer) fail(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, err)
}

func (o *observer) err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.errs) == 0 {
		return nil
	}
	return o.errs[0]
}

// runningWith counts the running slots whose guid starts with prefix.
func (o *observer) runningWith(prefix string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for s := range o.running {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// placements returns, for the slots of guids starting with prefix, the latency from their
// LRP's desire to their first RUNNING, and the time of the last first-RUNNING.
func (o *observer) placements(prefix string, desired map[string]time.Time) ([]time.Duration, time.Time, float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var lat []time.Duration
	var last time.Time
	var ran []time.Time
	for s, at := range o.firstRunning {
		if !strings.HasPrefix(s, prefix) {
			continue
		}
		guid := s[:strings.LastIndexByte(s, '/')]
		lat = append(lat, at.Sub(desired[guid]))
		ran = append(ran, at)
		if at.After(last) {
			last = at
		}
	}
	return lat, last, steadyRate(ran)
}

// steadyRate is the rate at which the middle 80% of the instances first ran (from the 10th to
// the 90th percentile of their RUNNING times): the throughput once the phase is under way,
// without its ramp-up and its tail. Zero with fewer than 10 instances.
func steadyRate(ran []time.Time) float64 {
	if len(ran) < 10 {
		return 0
	}
	slices.SortFunc(ran, func(a, b time.Time) int { return a.Compare(b) })
	lo, hi := len(ran)/10, len(ran)*9/10
	span := ran[hi].Sub(ran[lo])
	if span <= 0 {
		return 0
	}
	return float64(hi-lo) / span.Seconds()
}

// routed is one container's route: when its RUNNING event arrived, and how long its endpoint
// took to reach the route-emitter's table after it.
type routed struct {
	event   time.Time
	latency time.Duration
}

// routeTimes returns the routes of the containers first seen RUNNING in [from, to); missing
// counts those of them still running that were never routed (a container that stopped before
// the route-emitter published it needs no route).
func (o *observer) routeTimes(from, to time.Time) (rs []routed, missing int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	runs := make(map[string]bool, len(o.running))
	for _, p := range o.running {
		runs[p.instanceGUID] = true
	}
	for ig, ev := range o.eventSeen {
		if ev.Before(from) || !ev.Before(to) {
			continue
		}
		rt, ok := o.routeSeen[ig]
		if !ok {
			if runs[ig] {
				missing++
			}
			continue
		}
		rs = append(rs, routed{ev, max(0, rt.Sub(ev))})
	}
	return rs, missing
}

// latencies is each route's event → route latency.
func latencies(rs []routed) []time.Duration {
	lat := make([]time.Duration, len(rs))
	for i, r := range rs {
		lat[i] = r.latency
	}
	return lat
}

// writeRouteTimeline writes one line per route, in event order: when its RUNNING event
// arrived (Unix milliseconds) and its latency in milliseconds. With -profile-dir, it shows
// where in the phase the routing tail lies, to read beside the route-emitter's log of its
// listings.
func writeRouteTimeline(path string, rs []routed) error {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b routed) int { return a.event.Compare(b.event) })
	var b strings.Builder
	b.WriteString("event_unix_ms\troute_latency_ms\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "%d\t%.1f\n", r.event.UnixMilli(), float64(r.latency)/1e6)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// slotsOn returns the running slots held by the given cells, with their cell.
func (o *observer) slotsOn(cells map[string]bool) map[string]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]string{}
	for s, p := range o.running {
		if cells[p.cellID] {
			out[s] = p.cellID
		}
	}
	return out
}

// movedAway reports whether every slot runs again, on a cell outside lost.
func (o *observer) movedAway(slots map[string]string, lost map[string]bool) (int, bool) {
	left := o.notMoved(slots, lost)
	return len(left), len(left) == 0
}

// notMoved is the slots of slots the observer has not seen running on a cell outside lost.
func (o *observer) notMoved(slots map[string]string, lost map[string]bool) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var left []string
	for s := range slots {
		p, ok := o.running[s]
		if !ok || lost[p.cellID] {
			left = append(left, s)
		}
	}
	sort.Strings(left)
	return left
}

// disappearedCells returns the cells that disappeared and when.
func (o *observer) disappearedCells() map[string]time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]time.Time, len(o.disappeared))
	for id, at := range o.disappeared {
		out[id] = at
	}
	return out
}

// percentile is the p-th percentile (0..100) of ds, which it sorts.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(float64(len(ds)-1) * p / 100)
	return ds[i]
}

// recoveries returns, for each slot that ran on a lost cell, the time from its cell's
// disappearance to its instance RUNNING elsewhere.
func (o *observer) recoveries(slots map[string]string, cellOf map[string]string) []time.Duration {
	rec, _ := o.recoverySteps(slots, cellOf)
	return rec
}

// movedTwice counts the slots of a lost cell that were re-placed onto another lost cell (whose
// lease had not expired yet when the auction chose it) before running on a live one.
func (o *observer) movedTwice(slots map[string]string, lost map[string]bool) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for s := range slots {
		cells := o.ranOn[s]
		for i := len(cells) - 2; i >= 0 && cells[i] != slots[s]; i-- {
			if lost[cells[i]] {
				n++
				break
			}
		}
	}
	return n
}

// recoverySteps is recoveries plus its split into steps, for each instance moved: its cell's
// disappearance → the slot UNCLAIMED (the BBS's convergence), → CLAIMED (the auction and the
// chosen rep's claim), → RUNNING (the container's start and its report).
func (o *observer) recoverySteps(slots map[string]string, cellOf map[string]string) (rec []time.Duration, steps [3][]time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for s := range slots {
		gone, ok := o.disappeared[cellOf[s]]
		p, running := o.running[s]
		if !ok || !running {
			continue
		}
		rec = append(rec, p.at.Sub(gone))
		u, uok := o.unclaimedAt[s]
		c, cok := o.claimedAt[s]
		if uok && cok && !u.Before(gone) && !c.Before(u) && !p.at.Before(c) {
			steps[0] = append(steps[0], u.Sub(gone))
			steps[1] = append(steps[1], c.Sub(u))
			steps[2] = append(steps[2], p.at.Sub(c))
		}
	}
	return rec, steps
}
