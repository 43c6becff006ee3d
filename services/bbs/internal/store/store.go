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
)

// Options tune a Store; zero values take the defaults.
type Options struct {
	// Logger receives the store's logs.
	Logger hclog.Logger
	// EventRing is how many revisions of events the store keeps for resuming subscribers
	// (default 100,000); older resumes are served by a dedicated etcd watch.
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
	// CellsLeft, when set, is called with the cells still registered whenever the watch sees a
	// cell's presence disappear and after every full listing (which may have missed a
	// departure); the BBS closes its connections to the reps of departed cells. It is called
	// from the store's goroutine and must not block.
	CellsLeft func(present []*modelsv1.CellPresence)
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
	// cellsLost counts the cell presences the watch saw disappear.
	cellsLost atomic.Int64

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
func (s *Store) Run(ctx context.Context, ready func()) error {
	cctx, stopCommits := context.WithCancel(ctx)
	commitsDone := make(chan struct{})
	go func() {
		defer close(commitsDone)
		s.committer.run(cctx)
	}()
	// Stop forming batches and join the transactions in flight before returning.
	defer func() {
		stopCommits()
		<-commitsDone
	}()
	for {
		var rev int64
		err := retry.Do(ctx, resyncPolicy, 0, func() (err error) {
			rev, err = s.resync(ctx)
			return err
		}, func(err error, next time.Duration) {
			s.log.Warn("listing the store failed; retrying", "error", err, "backoff", next)
		})
		if err != nil {
			return nil // only the end of ctx stops the retries
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
			s.load(st, kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	s.cache.mu.Lock()
	s.cache.st = st
	s.links.reset(st)
	s.cache.rev = 0
	s.cache.advanceLocked(rev)
	s.cache.mu.Unlock()
	s.hub.reset(rev)
	return rev, nil
}

func (s *Store) load(st *state, kv *mvccpb.KeyValue) {
	k, err := parseKey(string(kv.Key))
	if err != nil || k.kind == kindUnknown {
		return
	}
	msg, err := decode(k, kv.Value)
	if err != nil {
		s.log.Error("skipping undecodable record", "key", string(kv.Key), "error", err)
		return
	}
	st.set(k, item{msg: msg, modRev: kv.ModRevision, lease: kv.Lease})
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
			s.apply(group)
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

// apply updates the cache with the events of one revision and publishes their BBS events.
func (s *Store) apply(evs []*clientv3.Event) {
	rev := evs[0].Kv.ModRevision
	s.cache.mu.Lock()
	st := s.cache.st
	changes := make([]change, 0, len(evs))
	cellGone := false
	for _, ev := range evs {
		k, after, ok := s.decodeEvent(ev)
		if !ok {
			continue
		}
		c := change{key: k, after: after}
		if old, ok := st.get(k); ok {
			c.before = old.msg
		}
		if after != nil {
			st.set(k, item{msg: after, modRev: ev.Kv.ModRevision, lease: ev.Kv.Lease})
		} else {
			st.del(k)
			if k.kind == kindCell {
				cellGone = true
				s.cellsLost.Add(1)
			}
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
	s.cache.mu.Unlock()
	s.hub.publish(rev, events, labels)
	if cellGone {
		select {
		case s.cellGone <- struct{}{}:
		default:
		}
		s.cellsLeft()
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

// decodeEvent parses a watch event's key and, for a put, its new value (nil for a delete). ok is
// false for keys outside the BBS's layout and for undecodable values, which are logged.
func (s *Store) decodeEvent(ev *clientv3.Event) (k parsedKey, after proto.Message, ok bool) {
	k, err := parseKey(string(ev.Kv.Key))
	if err != nil || k.kind == kindUnknown {
		return k, nil, false
	}
	if ev.Type != clientv3.EventTypePut {
		return k, nil, true
	}
	after, err = decode(k, ev.Kv.Value)
	if err != nil {
		s.log.Error("skipping undecodable record", "key", string(ev.Kv.Key), "error", err)
		return k, nil, false
	}
	return k, after, true
}
