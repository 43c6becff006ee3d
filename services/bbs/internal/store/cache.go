package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/wire"
)

// item is one cached record: the decoded value (never mutated once cached), its etcd
// revisions, and the label of the key it is sealed under in etcd ("" when stored clear). An
// instance record also keeps raw, its protobuf encoding as read from etcd, which lists send as
// it is.
type item struct {
	msg    proto.Message
	modRev int64
	lease  int64
	label  string
	raw    []byte
}

type slot struct {
	index    int32
	presence modelsv1.ActualLRP_Presence
}

// state is a full copy of the BBS records, keyed for the readers.
type state struct {
	sched  map[string]item
	run    map[string]item
	actual map[string]map[slot]item
	// onCell indexes the instance records by the cell in their instance key (those without
	// a cell, UNCLAIMED ones, are not in it), so that the records of lost cells are found
	// without walking every record under the read lock (OnLostCells).
	onCell map[string]map[actualRef]struct{}
	tasks  map[string]item
	// tasksOn indexes the tasks by the cell they run on (those on no cell are not in it),
	// for a cell's list of its tasks and for the tasks of lost cells.
	tasksOn map[string]map[string]struct{}
	domains map[string]item
	cells   map[string]item
	ports   map[string]item // "<protocol>/<port>" → owner
	routes  map[string]item // emitter id → revision published

	// cellsRev is the revision at which a cell last registered, changed or disappeared (the
	// revision listed at, for a state listed whole); cellsSorted is the cells ordered by id,
	// built by the first reader after a change (nil until then).
	cellsRev    int64
	cellsSorted atomic.Pointer[[]*modelsv1.CellPresence]
}

func newState() *state {
	return &state{
		sched:   map[string]item{},
		run:     map[string]item{},
		actual:  map[string]map[slot]item{},
		onCell:  map[string]map[actualRef]struct{}{},
		tasks:   map[string]item{},
		tasksOn: map[string]map[string]struct{}{},
		domains: map[string]item{},
		cells:   map[string]item{},
		ports:   map[string]item{},
		routes:  map[string]item{},
	}
}

func (s *state) table(k parsedKey) map[string]item {
	switch k.kind {
	case kindSched:
		return s.sched
	case kindRun:
		return s.run
	case kindTask:
		return s.tasks
	case kindDomain:
		return s.domains
	case kindCell:
		return s.cells
	case kindPort:
		return s.ports
	case kindRoutes:
		return s.routes
	}
	return nil
}

func (s *state) get(k parsedKey) (item, bool) {
	if k.kind == kindActual {
		it, ok := s.actual[k.id][slot{k.index, k.presence}]
		return it, ok
	}
	t := s.table(k)
	if t == nil {
		return item{}, false
	}
	it, ok := t[k.id]
	return it, ok
}

func (s *state) set(k parsedKey, it item) {
	if k.kind == kindActual {
		m := s.actual[k.id]
		if m == nil {
			m = map[slot]item{}
			s.actual[k.id] = m
		}
		sl := slot{k.index, k.presence}
		moveOnCell(s.onCell, actualRef{k.id, sl}, cellOf(m[sl]), cellOf(it))
		m[sl] = it
		return
	}
	if k.kind == kindTask {
		moveOnCell(s.tasksOn, k.id, taskCellOf(s.tasks[k.id]), taskCellOf(it))
	}
	if t := s.table(k); t != nil {
		t[k.id] = it
	}
	if k.kind == kindCell {
		s.cellsSorted.Store(nil)
	}
}

func (s *state) del(k parsedKey) {
	if k.kind == kindActual {
		m := s.actual[k.id]
		sl := slot{k.index, k.presence}
		moveOnCell(s.onCell, actualRef{k.id, sl}, cellOf(m[sl]), "")
		delete(m, sl)
		if len(m) == 0 {
			delete(s.actual, k.id)
		}
		return
	}
	if k.kind == kindTask {
		moveOnCell(s.tasksOn, k.id, taskCellOf(s.tasks[k.id]), "")
	}
	if t := s.table(k); t != nil {
		delete(t, k.id)
	}
	if k.kind == kindCell {
		s.cellsSorted.Store(nil)
	}
}

// actualRef names an instance record: its process guid and slot.
type actualRef struct {
	guid string
	slot slot
}

// cellOf is the cell in an instance record's instance key ("" for none, or no record).
func cellOf(it item) string {
	a, _ := it.msg.(*modelsv1.ActualLRP)
	return a.GetInstanceKey().GetCellId()
}

// taskCellOf is the cell a task record runs on ("" for none, or no record).
func taskCellOf(it item) string {
	t, _ := it.msg.(*modelsv1.Task)
	return t.GetCellId()
}

// moveOnCell moves k from cell from to cell to in idx, an index by cell ("" for none: k is
// only taken out, or only put in); a cell left with nothing has no entry.
func moveOnCell[K comparable](idx map[string]map[K]struct{}, k K, from, to string) {
	if from == to {
		return
	}
	if refs := idx[from]; from != "" {
		delete(refs, k)
		if len(refs) == 0 {
			delete(idx, from)
		}
	}
	if to != "" {
		refs := idx[to]
		if refs == nil {
			refs = map[K]struct{}{}
			idx[to] = refs
		}
		refs[k] = struct{}{}
	}
}

// newMessage returns an empty message of the type stored under k.
func newMessage(k parsedKey) proto.Message {
	switch k.kind {
	case kindSched:
		return &modelsv1.DesiredLRPSchedulingInfo{}
	case kindRun:
		return &modelsv1.DesiredLRPRunInfo{}
	case kindActual:
		return &modelsv1.ActualLRP{}
	case kindTask:
		return &modelsv1.Task{}
	case kindDomain:
		return &modelsv1.Domain{}
	case kindCell:
		return &modelsv1.CellPresence{}
	case kindPort:
		return &wrapperspb.StringValue{}
	case kindRoutes:
		return &wrapperspb.Int64Value{}
	}
	return nil
}

// sealed reports whether records of kind carry user data and are sealed when encryption is
// on: a desired LRP's run info (env, actions, properties) and a task (its definition). The
// others stay clear; docs/decisions/0020-encryption-at-rest.md says why.
func sealed(kd kind) bool { return kd == kindRun || kd == kindTask }

// decode opens and unmarshals the value stored under key (k parsed from it) and returns the
// record with the label of the key it was sealed under ("" when clear). A sealing failure (a
// label the keyring lacks, a value that does not authenticate) is an error for which
// sealingFailure is true; the store cannot serve without that record.
func (s *Store) decode(key string, k parsedKey, value []byte) (proto.Message, string, error) {
	m, _, label, err := s.open(key, k, value)
	return m, label, err
}

// decodeKept is decode for a record the cache keeps: it also returns what the item keeps of
// the record's encoding, a copy of an instance record's opened value (the etcd client's
// buffer is not the cache's to keep), nil for other kinds.
func (s *Store) decodeKept(key string, k parsedKey, value []byte) (m proto.Message, raw []byte, label string, err error) {
	m, plain, label, err := s.open(key, k, value)
	if err == nil && k.kind == kindActual {
		raw = bytes.Clone(plain)
	}
	return m, raw, label, err
}

// open is decode returning the opened value too (the etcd client's buffer, or the keyring's).
func (s *Store) open(key string, k parsedKey, value []byte) (m proto.Message, plain []byte, label string, err error) {
	m = newMessage(k)
	if m == nil {
		return nil, nil, "", nil
	}
	plain, label, err = s.opts.Keyring.Open(key, value)
	if err != nil {
		return nil, nil, label, fmt.Errorf("open %s: %w", key, err)
	}
	if err := wire.Unmarshal(plain, m); err != nil {
		return nil, nil, label, fmt.Errorf("decode %v record %q: %w", k.kind, k.id, err)
	}
	return m, plain, label, nil
}

// encode marshals msg for key, sealed under the active key when its kind carries user data.
func (s *Store) encode(key string, msg proto.Message) ([]byte, error) {
	b, err := wire.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", key, err)
	}
	k, err := parseKey(key)
	if err != nil {
		return nil, err
	}
	if !sealed(k.kind) {
		return b, nil
	}
	if b, err = s.opts.Keyring.Seal(key, b); err != nil {
		return nil, fmt.Errorf("encode %s: %w", key, err)
	}
	return b, nil
}

// sealingFailure reports whether err is a stored record the keyring cannot open: sealed under
// a label it lacks, or not authenticating under the key of its label.
func sealingFailure(err error) bool {
	var unknown *sealing.UnknownKeyError
	return errors.As(err, &unknown) || errors.Is(err, sealing.ErrCorrupt)
}

// Cache is the watch-fed copy of every BBS record. Readers get immutable values; the store's
// watch loop is its only writer.
type Cache struct {
	mu     sync.RWMutex
	st     *state
	rev    int64
	notify chan struct{} // closed and replaced whenever rev advances
	routes chan struct{} // closed and replaced whenever a route-emitter's report changes
}

func newCache() *Cache {
	return &Cache{st: newState(), notify: make(chan struct{}), routes: make(chan struct{})}
}

// routesChangedLocked wakes those waiting for a route-emitter report; the caller holds c.mu.
func (c *Cache) routesChangedLocked() {
	close(c.routes)
	c.routes = make(chan struct{})
}

// Revision is the store revision the cache reflects.
func (c *Cache) Revision() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.rev
}

// WaitFor blocks until the cache reflects rev, ctx ends, or within passes (0: no bound), when
// it returns context.DeadlineExceeded. A cache already there returns at once, without a timer:
// every committed change waits here (Store.Update), and deriving a timed context for each was
// a share of the BBS's CPU.
func (c *Cache) WaitFor(ctx context.Context, rev int64, within time.Duration) error {
	var bound <-chan time.Time
	for {
		c.mu.RLock()
		cur, ch := c.rev, c.notify
		c.mu.RUnlock()
		if cur >= rev {
			return nil
		}
		if bound == nil && within > 0 {
			t := time.NewTimer(within)
			defer t.Stop()
			bound = t.C
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-bound:
			return context.DeadlineExceeded
		}
	}
}

// advance sets the revision and wakes waiters; the caller holds c.mu.
func (c *Cache) advanceLocked(rev int64) {
	if rev > c.rev {
		c.rev = rev
	}
	close(c.notify)
	c.notify = make(chan struct{})
}

// read runs fn under the read lock.
func (c *Cache) read(fn func(st *state, rev int64)) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	fn(c.st, c.rev)
}

func (c *Cache) get(k parsedKey) (item, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.st.get(k)
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// sortedSlots returns the slots of m ordered by index then presence.
func sortedSlots(m map[slot]item) []slot {
	slots := make([]slot, 0, len(m))
	for s := range m {
		slots = append(slots, s)
	}
	slices.SortFunc(slots, compareSlots)
	return slots
}

// compareSlots orders slots by index, then presence.
func compareSlots(a, b slot) int {
	return cmp.Or(cmp.Compare(a.index, b.index), cmp.Compare(a.presence, b.presence))
}
