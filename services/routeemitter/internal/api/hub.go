package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/services/routeemitter/internal/table"
)

// Defaults of HubOptions.
const (
	// DefaultHistory is how many versions of deltas are kept for resuming watchers.
	DefaultHistory = 1024
	// DefaultHistoryRoutes bounds the routes held by the history (upserts plus removals), so a
	// few huge deltas (a first sync, a re-list) cannot pin much memory.
	DefaultHistoryRoutes = 200_000
	// DefaultQueue is how many deltas may wait for one watcher before it is resynced.
	DefaultQueue = 256
)

// HubOptions tune a Hub; zero values take the defaults.
type HubOptions struct {
	// TableID names the table; empty draws a random id.
	TableID string
	// History is how many versions of deltas are kept for resuming watchers.
	History int
	// HistoryRoutes bounds the routes held by the history.
	HistoryRoutes int
	// Queue is how many deltas may wait for one watcher; a watcher that falls further behind
	// gets a fresh snapshot instead of the deltas it missed.
	Queue int
}

// Hub is the published routing table: the current routes with their version, a bounded history
// of deltas for resuming watchers, and the watchers themselves. Publish never blocks on a
// watcher.
type Hub struct {
	opts      HubOptions
	syncedCh  chan struct{}
	once      sync.Once
	closed    chan struct{}
	closeOnce sync.Once

	mu            sync.RWMutex
	version       uint64
	routes        map[table.Key]*routeemitterv1.Route
	sorted        []*routeemitterv1.Route // routes ordered by key; nil when stale
	history       []*routeemitterv1.WatchRoutesResponse
	historyRoutes int
	watchers      map[*Watcher]struct{}
	byProtocol    map[routeemitterv1.Route_Protocol]int // routes per protocol
	endpoints     int                                   // endpoints over all routes

	snapshots, resyncs atomic.Uint64
}

// HubStats is a point-in-time view of the hub, for metrics.
type HubStats struct {
	// Routes counts the table's routes by protocol.
	Routes map[routeemitterv1.Route_Protocol]int
	// Endpoints counts the endpoints of every route.
	Endpoints int
	// Version is the table's version.
	Version uint64
	// Watchers is the number of registered watchers.
	Watchers int
	// Snapshots is how many snapshots started a watch (a new or out-of-date watcher).
	Snapshots uint64
	// Resyncs is how many snapshots were sent to watchers that fell behind.
	Resyncs uint64
}

// Stats returns the hub's counts.
func (h *Hub) Stats() HubStats {
	h.mu.RLock()
	defer h.mu.RUnlock()
	byProtocol := make(map[routeemitterv1.Route_Protocol]int, len(h.byProtocol))
	for p, n := range h.byProtocol {
		byProtocol[p] = n
	}
	return HubStats{
		Routes:    byProtocol,
		Endpoints: h.endpoints,
		Version:   h.version,
		Watchers:  len(h.watchers),
		Snapshots: h.snapshots.Load(),
		Resyncs:   h.resyncs.Load(),
	}
}

// countLocked adds (sign 1) or subtracts (sign -1) r from the per-protocol and endpoint counts;
// h.mu must be held.
func (h *Hub) countLocked(r *routeemitterv1.Route, sign int) {
	h.byProtocol[r.GetProtocol()] += sign
	h.endpoints += sign * len(r.GetEndpoints())
}

// NewHub returns an empty, not yet synced hub.
func NewHub(opts HubOptions) *Hub {
	if opts.TableID == "" {
		opts.TableID = NewTableID()
	}
	if opts.History <= 0 {
		opts.History = DefaultHistory
	}
	if opts.HistoryRoutes <= 0 {
		opts.HistoryRoutes = DefaultHistoryRoutes
	}
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	return &Hub{
		opts:       opts,
		syncedCh:   make(chan struct{}),
		closed:     make(chan struct{}),
		routes:     map[table.Key]*routeemitterv1.Route{},
		watchers:   map[*Watcher]struct{}{},
		byProtocol: map[routeemitterv1.Route_Protocol]int{},
	}
}

// NewTableID draws a random table id (128 bits, hex).
func NewTableID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// TableID is the hub's table id.
func (h *Hub) TableID() string { return h.opts.TableID }

// MarkSynced records that the table reflects a full listing of the BBS; until then the table
// is not served.
func (h *Hub) MarkSynced() { h.once.Do(func() { close(h.syncedCh) }) }

// Synced is closed once the table has been synced.
func (h *Hub) Synced() <-chan struct{} { return h.syncedCh }

// ErrClosed is returned by Watcher.Next once the hub is closed.
var ErrClosed = errors.New("route-emitter is shutting down")

// Close ends every watcher's Next with ErrClosed, so streams end before the server stops.
func (h *Hub) Close() { h.closeOnce.Do(func() { close(h.closed) }) }

// Version is the current version.
func (h *Hub) Version() uint64 {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.version
}

// Publish applies d as the next version and queues it for every watcher. An empty delta
// changes nothing.
func (h *Hub) Publish(d table.Delta) {
	if d.Empty() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.version++
	for _, r := range d.Removals {
		k := table.KeyOf(r)
		if old, ok := h.routes[k]; ok {
			h.countLocked(old, -1)
			delete(h.routes, k)
		}
	}
	for _, r := range d.Upserts {
		k := table.KeyOf(r)
		if old, ok := h.routes[k]; ok {
			h.countLocked(old, -1)
		}
		h.routes[k] = r
		h.countLocked(r, 1)
	}
	h.sorted = nil
	msg := &routeemitterv1.WatchRoutesResponse{TableId: h.opts.TableID, Version: h.version, Upserts: d.Upserts, Removals: d.Removals}
	h.history = append(h.history, msg)
	h.historyRoutes += size(msg)
	drop := 0
	for len(h.history)-drop > h.opts.History || (h.historyRoutes > h.opts.HistoryRoutes && len(h.history)-drop > 1) {
		h.historyRoutes -= size(h.history[drop])
		drop++
	}
	if drop > 0 {
		h.history = slices.Delete(h.history, 0, drop)
	}
	for w := range h.watchers {
		w.push(msg, h.opts.Queue)
	}
}

// size is how many routes a message holds.
func size(m *routeemitterv1.WatchRoutesResponse) int { return len(m.Upserts) + len(m.Removals) }

// snapshotLocked is the whole table; h.mu must be held.
func (h *Hub) snapshotLocked() []*routeemitterv1.Route {
	if h.sorted != nil || len(h.routes) == 0 {
		return h.sorted
	}
	out := make([]*routeemitterv1.Route, 0, len(h.routes))
	for _, r := range h.routes {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *routeemitterv1.Route) int { return table.KeyOf(a).Compare(table.KeyOf(b)) })
	h.sorted = out
	return out
}

// Table returns the whole table ordered by key, with its version. The slice is shared: do not
// modify it.
func (h *Hub) Table() (routes []*routeemitterv1.Route, version uint64) {
	h.mu.Lock() // snapshotLocked may cache the sorted slice
	defer h.mu.Unlock()
	return h.snapshotLocked(), h.version
}

// snapshotMessage is the table as a WatchRoutes snapshot; h.mu must be held.
func (h *Hub) snapshotMessage() *routeemitterv1.WatchRoutesResponse {
	return &routeemitterv1.WatchRoutesResponse{TableId: h.opts.TableID, Version: h.version, Snapshot: true, Upserts: h.snapshotLocked()}
}

// Watch registers a watcher and returns what it must send first: the deltas after
// sinceVersion when tableID is this table's and the history still holds all of them (nothing
// when the caller is current), else a snapshot. Every later version is queued on the watcher.
// Call Close when done.
func (h *Hub) Watch(tableID string, sinceVersion uint64) (*Watcher, []*routeemitterv1.WatchRoutesResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := &Watcher{hub: h, notify: make(chan struct{}, 1)}
	h.watchers[w] = struct{}{}
	if tableID == h.opts.TableID && sinceVersion <= h.version {
		if sinceVersion == h.version {
			return w, nil
		}
		if len(h.history) > 0 && h.history[0].Version <= sinceVersion+1 {
			i, _ := slices.BinarySearchFunc(h.history, sinceVersion+1, func(m *routeemitterv1.WatchRoutesResponse, v uint64) int {
				switch {
				case m.Version < v:
					return -1
				case m.Version > v:
					return 1
				}
				return 0
			})
			return w, slices.Clone(h.history[i:])
		}
	}
	h.snapshots.Add(1)
	return w, []*routeemitterv1.WatchRoutesResponse{h.snapshotMessage()}
}

// Watchers is the number of registered watchers.
func (h *Hub) Watchers() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.watchers)
}

// Watcher is one WatchRoutes stream's bounded queue of deltas.
type Watcher struct {
	hub    *Hub
	notify chan struct{}

	mu       sync.Mutex
	queue    []*routeemitterv1.WatchRoutesResponse
	overflow bool
	resyncs  int
}

// push queues m, or marks the watcher overflowed when limit messages already wait.
func (w *Watcher) push(m *routeemitterv1.WatchRoutesResponse, limit int) {
	w.mu.Lock()
	switch {
	case w.overflow:
	case len(w.queue) >= limit:
		w.overflow, w.queue = true, nil
	default:
		w.queue = append(w.queue, m)
	}
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// Next waits for the watcher's next messages: the queued deltas in order, or — when the queue
// overflowed — one fresh snapshot, after which deltas follow again. It returns ctx's error when
// ctx ends first, and ErrClosed when the hub is closed.
func (w *Watcher) Next(ctx context.Context) ([]*routeemitterv1.WatchRoutesResponse, error) {
	for {
		w.mu.Lock()
		msgs, overflow := w.queue, w.overflow
		w.queue = nil
		w.mu.Unlock()
		if overflow {
			return []*routeemitterv1.WatchRoutesResponse{w.resync()}, nil
		}
		if len(msgs) > 0 {
			return msgs, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.hub.closed:
			return nil, ErrClosed
		case <-w.notify:
		}
	}
}

// resync takes a snapshot and clears the overflow atomically with respect to Publish, so the
// deltas queued afterwards follow the snapshot exactly.
func (w *Watcher) resync() *routeemitterv1.WatchRoutesResponse {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queue, w.overflow = nil, false
	w.resyncs++
	w.hub.resyncs.Add(1)
	return w.hub.snapshotMessage()
}

// Resyncs is how many snapshots the watcher was sent because it fell behind.
func (w *Watcher) Resyncs() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resyncs
}

// Close unregisters the watcher.
func (w *Watcher) Close() {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	delete(w.hub.watchers, w)
}
