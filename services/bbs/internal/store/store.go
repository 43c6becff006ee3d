// Package store keeps the BBS records in etcd: compare-and-swap transactions for every change,
// a watch-fed cache that serves every read, and the event stream derived from the same watch.
package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/sealing"
)

// Options tune a Store; zero values take the defaults.
type Options struct {
	// Logger receives the store's logs.
	Logger hclog.Logger
	// EventRing is how many events the store keeps for resuming subscribers (default 100,000;
	// the ring holds between this and twice this many, in whole revisions); older resumes are
	// served by a dedicated etcd watch.
	EventRing int
	// WriteAttempts bounds the compare-and-swap retries of one change (default 8).
	WriteAttempts int
	// ListPageSize is the page size of the initial list from etcd (default 5,000 keys).
	ListPageSize int64
	// UnreachableTimeout bounds how long a change waits for etcd to be reachable (a ready
	// connection to a member) before it is answered Unavailable, unsent (default 2s).
	UnreachableTimeout time.Duration
	// WriteTimeout bounds one change as a whole, its etcd transactions included (default 10s);
	// a change sent to etcd whose answer does not come in time has an unknown outcome
	// (rpcerr.ErrIndeterminate).
	WriteTimeout time.Duration
	// ReadYourWritesTimeout bounds how long a write waits for the cache to reflect it (default 5s).
	ReadYourWritesTimeout time.Duration
	// ObserveTransaction, when set, is told how long each etcd transaction of the group
	// committer took (the BBS's etcd write latency histogram). It must not block.
	ObserveTransaction func(time.Duration)
	// ObserveWrite, when set, is told, for each write Update committed, how long it waited for
	// the group committer's answer (the queue and the transaction) and then for the cache to
	// reflect it (read your writes). It must not block.
	ObserveWrite func(commit, cache time.Duration)
	// CellsLeft, when set, is called with the cells still registered after every full listing
	// (which may have missed a departure), from Run before it follows the watch, and after the
	// watch sees cells' presences disappear, from a goroutine of its own, once for the
	// departures that came while it ran; the BBS closes its connections to the reps of
	// departed cells. Calls may overlap only with one after a listing.
	CellsLeft func(present []*modelsv1.CellPresence)
	// Keyring seals the records that carry user data (run infos and tasks) and opens every
	// sealed record; nil is encryption off (new records clear, sealed ones unreadable). A
	// record the keyring cannot open stops the store (see Run).
	Keyring *sealing.Keyring
	// ResealBatch is how many records one re-encryption transaction rewrites (default 64).
	ResealBatch int
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.EventRing <= 0 {
		o.EventRing = 100_000
	}
	if o.WriteAttempts <= 0 {
		o.WriteAttempts = 8
	}
	if o.ListPageSize <= 0 {
		o.ListPageSize = 5000
	}
	if o.UnreachableTimeout <= 0 {
		o.UnreachableTimeout = DefaultUnreachableTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.ReadYourWritesTimeout <= 0 {
		o.ReadYourWritesTimeout = 5 * time.Second
	}
	if o.ResealBatch <= 0 {
		o.ResealBatch = 64
	}
}

// Defaults of Options.UnreachableTimeout and Options.WriteTimeout.
const (
	DefaultUnreachableTimeout = etcdx.DefaultUnreachableTimeout
	DefaultWriteTimeout       = 10 * time.Second
)

// resyncPolicy is the wait between failed listings of the store.
var resyncPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// Store is the BBS's view of etcd.
type Store struct {
	client *clientv3.Client
	opts   Options
	log    hclog.Logger
	cache  *Cache
	hub    *hub
	synced chan struct{}
	once   sync.Once
	// cellGone holds one pending signal that some cell's presence disappeared.
	cellGone chan struct{}
	// departed holds one pending signal for tellCellsLeft: a cell's presence disappeared.
	departed chan struct{}
	// cellsLost counts the cell presences the watch saw disappear.
	cellsLost atomic.Int64
	// compacted is the revision CompactHistory last compacted up to.
	compacted atomic.Int64

	committer *committer
	// links tracks link resolutions for LinksChanged events; guarded by cache.mu.
	links *linkTracker
}

// New returns a store over client; call Run to fill the cache and follow changes.
func New(client *clientv3.Client, opts Options) *Store {
	opts.defaults()
	return &Store{
		client:    client,
		opts:      opts,
		log:       opts.Logger,
		cache:     newCache(),
		hub:       newHub(opts.EventRing),
		synced:    make(chan struct{}),
		cellGone:  make(chan struct{}, 1),
		departed:  make(chan struct{}, 1),
		committer: newCommitter(client, opts.UnreachableTimeout, opts.ObserveTransaction),
		links:     newLinkTracker(),
	}
}

// CommitStats counts the store's group commits so far.
func (s *Store) CommitStats() CommitStats { return s.committer.snapshot() }

// Client is the etcd client the store writes through.
func (s *Store) Client() *clientv3.Client { return s.client }

// Cache is the store's record cache.
func (s *Store) Cache() *Cache { return s.cache }

// CellGone receives a signal (coalesced: at most one pending) whenever the watch sees a cell's
// presence disappear. Convergence listens to it to react to cell loss at once.
func (s *Store) CellGone() <-chan struct{} { return s.cellGone }

// CellsLost counts the cell presences the store's watch saw disappear since it started
// (expired or revoked leases: lost or stopped cells).
func (s *Store) CellsLost() int64 { return s.cellsLost.Load() }

// Synced is closed once the cache holds a full copy of the store.
func (s *Store) Synced() <-chan struct{} { return s.synced }

// Run lists every record, then follows the watch until ctx ends, re-listing whenever the
// watch breaks. ready is called after the first full list.
//
// A record the keyring cannot open (sealed under a label it lacks, or not authenticating under
// its label's key) ends Run with an error naming the record and the label, at the first full
// listing (the BBS then refuses to start) or whenever the watch brings one: a BBS never serves
// a cache with records missing.
func (s *Store) Run(ctx context.Context, ready func()) error {
	cctx, stopCommits := context.WithCancel(ctx)
	var background sync.WaitGroup
	background.Go(func() { s.committer.run(cctx) })
	background.Go(func() { s.tellCellsLeft(cctx) })
	// Stop forming batches and join the transactions in flight before returning.
	defer func() {
		stopCommits()
		background.Wait()
	}()
	for {
		var rev int64
		err := retry.Do(ctx, resyncPolicy, 0, func() (err error) {
			rev, err = s.resync(ctx)
			if sealingFailure(err) {
				return retry.Permanent(err)
			}
			return err
		}, func(err error, next time.Duration) {
			s.log.Warn("listing the store failed; retrying", "error", err, "backoff", next)
		})
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list the store: %w", err)
		}
		s.cellsLeft()
		s.once.Do(func() {
			close(s.synced)
			ready()
		})
		err = s.follow(ctx, rev)
		if ctx.Err() != nil {
			return nil
		}
		if sealingFailure(err) {
			return fmt.Errorf("follow the store: %w", err)
		}
		s.log.Warn("store watch ended; listing again", "error", err, "revision", rev)
	}
}

// resync replaces the cache with a consistent list of every record and resets the event ring.
func (s *Store) resync(ctx context.Context) (int64, error) {
	st := newState()
	var rev int64
	key, end := Root, clientv3.GetPrefixRangeEnd(Root)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(s.opts.ListPageSize), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.client.Get(ctx, key, opts...)
		if err != nil {
			return 0, fmt.Errorf("list %s: %w", Root, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if err := s.load(st, kv); err != nil {
				return 0, err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	st.cellsRev = rev
	s.cache.mu.Lock()
	s.cache.st = st
	s.links.reset(st)
	s.cache.rev = 0
	s.cache.advanceLocked(rev)
	s.cache.routesChangedLocked()
	s.cache.mu.Unlock()
	s.hub.reset(rev)
	return rev, nil
}

// load adds a listed record to st. An undecodable record is logged and skipped; one the
// keyring cannot open is an error.
func (s *Store) load(st *state, kv *mvccpb.KeyValue) error {
	k, err := parseKey(string(kv.Key))
	if err != nil || k.kind == kindUnknown {
		return nil
	}
	msg, raw, label, err := s.decodeKept(string(kv.Key), k, kv.Value)
	if sealingFailure(err) {
		return err
	}
	if err != nil {
		s.log.Error("skipping undecodable record", "key", string(kv.Key), "error", err)
		return nil
	}
	st.set(k, item{msg: msg, modRev: kv.ModRevision, lease: kv.Lease, label: label, raw: raw})
	return nil
}

// follow applies watch events from rev+1 on until the watch fails or ctx ends.
func (s *Store) follow(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.client.Watch(wctx, Root, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return err
		}
		if resp.IsProgressNotify() {
			s.advance(resp.Header.Revision)
			continue
		}
		for _, group := range byRevision(resp.Events) {
			if err := s.apply(group); err != nil {
				return err
			}
		}
	}
	return errors.New("watch channel closed")
}

// byRevision splits watch events into runs of one revision each.
func byRevision(evs []*clientv3.Event) [][]*clientv3.Event {
	var out [][]*clientv3.Event
	for i := 0; i < len(evs); {
		j := i + 1
		for j < len(evs) && evs[j].Kv.ModRevision == evs[i].Kv.ModRevision {
			j++
		}
		out = append(out, evs[i:j])
		i = j
	}
	return out
}

// apply updates the cache with the events of one revision and publishes their BBS events. A
// record the keyring cannot open is an error, and nothing of the revision is applied.
func (s *Store) apply(evs []*clientv3.Event) error {
	rev := evs[0].Kv.ModRevision
	decoded := make([]decodedEvent, 0, len(evs))
	for _, ev := range evs {
		d, ok, err := s.decodeEvent(ev)
		if err != nil {
			return err
		}
		if ok {
			decoded = append(decoded, d)
		}
	}
	s.cache.mu.Lock()
	st := s.cache.st
	changes := make([]change, 0, len(decoded))
	cellGone, routesChanged := false, false
	for _, d := range decoded {
		k, after := d.key, d.after
		c := change{key: k, after: after}
		old, had := st.get(k)
		if had {
			c.before = old.msg
		}
		if k.kind == kindCell {
			st.cellsRev = rev
		}
		if after != nil {
			st.set(k, item{msg: after, modRev: d.modRev, lease: d.lease, label: d.label, raw: d.raw})
		} else {
			st.del(k)
			if k.kind == kindCell {
				cellGone = true
				s.cellsLost.Add(1)
			}
		}
		if k.kind == kindRoutes {
			routesChanged = true
		}
		if had && resealedOnly(old.label, d.label, old.msg, after) {
			continue // the same record under another key: nothing happened to subscribers
		}
		changes = append(changes, c)
	}
	look := func(k parsedKey) proto.Message {
		it, _ := st.get(k)
		return it.msg
	}
	events := buildEvents(rev, changes, look)
	events = append(events, s.linkEvents(rev, st, changes)...)
	labels := eventLabels(events, changes, look)
	s.cache.advanceLocked(rev)
	if routesChanged {
		s.cache.routesChangedLocked()
	}
	s.cache.mu.Unlock()
	s.hub.publish(rev, events, labels)
	if cellGone {
		for _, ch := range []chan struct{}{s.cellGone, s.departed} {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	return nil
}

// resealedOnly reports whether a change rewrote a record unchanged under another key (or from
// clear to sealed): re-encryption, which publishes no event.
func resealedOnly(beforeLabel, afterLabel string, before, after proto.Message) bool {
	return after != nil && before != nil && beforeLabel != afterLabel && proto.Equal(before, after)
}

// tellCellsLeft tells Options.CellsLeft the registered cells after departures until ctx ends,
// once per wave of them: off the watch's goroutine, which a call per departure held for
// milliseconds each (sorting the cells, then the BBS's rep pool walking them). When 500 of
// 5,000 cells expired, that was seconds of the watch's time in the middle of the wave, and
// every write waited that much longer for the cache to reflect it.
func (s *Store) tellCellsLeft(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.departed:
			s.cellsLeft()
		}
	}
}

// cellsLeft tells Options.CellsLeft the registered cells.
func (s *Store) cellsLeft() {
	if s.opts.CellsLeft != nil {
		cells, _ := s.Cells()
		s.opts.CellsLeft(cells)
	}
}

// advance moves the cache and ring to rev after a progress notification.
func (s *Store) advance(rev int64) {
	s.cache.mu.Lock()
	if rev > s.cache.rev {
		s.cache.advanceLocked(rev)
	}
	s.cache.mu.Unlock()
	s.hub.publish(rev, nil, nil)
}

// CurrentRevision asks etcd for its current revision.
func (s *Store) CurrentRevision(ctx context.Context) (int64, error) {
	resp, err := s.client.Get(ctx, Root, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("read etcd revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// Compact compacts etcd's history up to rev (tests and operators).
func (s *Store) Compact(ctx context.Context, rev int64) error {
	_, err := s.client.Compact(ctx, rev, clientv3.WithCompactPhysical())
	return err
}

// txnTooLarge reports whether err is etcd refusing a transaction for its size.
func txnTooLarge(err error) bool {
	return errors.Is(err, rpcerrTooManyOps) || errors.Is(err, rpcerrTooLarge)
}

// decodedEvent is a watch event's record: its key and, for a put, its new value and the label
// it is sealed under (after is nil for a delete).
type decodedEvent struct {
	key    parsedKey
	after  proto.Message
	label  string
	modRev int64
	lease  int64
	raw    []byte // what the cache keeps of the encoding (decodeKept)
}

// decodeEvent parses a watch event's key and, for a put, its new value. ok is false for keys
// outside the BBS's layout and for undecodable values, which are logged; a value the keyring
// cannot open is an error.
func (s *Store) decodeEvent(ev *clientv3.Event) (d decodedEvent, ok bool, err error) {
	k, err := parseKey(string(ev.Kv.Key))
	if err != nil || k.kind == kindUnknown {
		return d, false, nil
	}
	d = decodedEvent{key: k, modRev: ev.Kv.ModRevision, lease: ev.Kv.Lease}
	if ev.Type != clientv3.EventTypePut {
		return d, true, nil
	}
	d.after, d.raw, d.label, err = s.decodeKept(string(ev.Kv.Key), k, ev.Kv.Value)
	if sealingFailure(err) {
		return d, false, err
	}
	if err != nil {
		s.log.Error("skipping undecodable record", "key", string(ev.Kv.Key), "error", err)
		return d, false, nil
	}
	return d, true, nil
}
