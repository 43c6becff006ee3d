package store

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

var (
	rpcerrTooManyOps = rpctypes.ErrTooManyOps
	rpcerrTooLarge   = rpctypes.ErrRequestTooLarge
)

// Txn is one attempt at a change: it reads records (from the cache on the first attempt, from
// etcd on retries), remembers the revision of everything it read, and collects writes. The
// store commits the writes only if nothing read has changed since.
type Txn struct {
	s     *Store
	ctx   context.Context
	fresh bool
	reads map[string]int64
	ops   []clientv3.Op
}

// Fresh reports whether this attempt reads from etcd rather than the cache.
func (t *Txn) Fresh() bool { return t.fresh }

func (t *Txn) get(key string) (proto.Message, error) {
	k, err := parseKey(key)
	if err != nil {
		return nil, err
	}
	if !t.fresh {
		it, ok := t.s.cache.get(k)
		t.reads[key] = it.modRev
		if !ok {
			return nil, nil
		}
		return it.msg, nil
	}
	resp, err := t.s.client.Get(t.ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		t.reads[key] = 0
		return nil, nil
	}
	kv := resp.Kvs[0]
	t.reads[key] = kv.ModRevision
	m, _, err := t.s.decode(key, k, kv.Value)
	return m, err
}

// Revision is the mod revision at which this attempt read key (0 when absent or not read).
func (t *Txn) Revision(key string) int64 { return t.reads[key] }

// SchedulingInfo reads a desired LRP's scheduling info (nil when absent).
func (t *Txn) SchedulingInfo(guid string) (*modelsv1.DesiredLRPSchedulingInfo, error) {
	m, err := t.get(DesiredSchedKey(guid))
	if m == nil || err != nil {
		return nil, err
	}
	return m.(*modelsv1.DesiredLRPSchedulingInfo), nil
}

// RunInfo reads a desired LRP's run info (nil when absent).
func (t *Txn) RunInfo(guid string) (*modelsv1.DesiredLRPRunInfo, error) {
	m, err := t.get(DesiredRunKey(guid))
	if m == nil || err != nil {
		return nil, err
	}
	return m.(*modelsv1.DesiredLRPRunInfo), nil
}

// ActualLRP reads one instance record (nil when absent).
func (t *Txn) ActualLRP(guid string, index int32, p modelsv1.ActualLRP_Presence) (*modelsv1.ActualLRP, error) {
	m, err := t.get(ActualKey(guid, index, p))
	if m == nil || err != nil {
		return nil, err
	}
	return m.(*modelsv1.ActualLRP), nil
}

// ActualLRPs reads every instance record of a process guid, ordered by index and presence.
func (t *Txn) ActualLRPs(guid string) ([]*modelsv1.ActualLRP, error) {
	var out []*modelsv1.ActualLRP
	if !t.fresh {
		t.s.cache.read(func(st *state, _ int64) {
			m := st.actual[guid]
			for _, sl := range sortedSlots(m) {
				it := m[sl]
				t.reads[ActualKey(guid, sl.index, sl.presence)] = it.modRev
				out = append(out, it.msg.(*modelsv1.ActualLRP))
			}
		})
		return out, nil
	}
	resp, err := t.s.client.Get(t.ctx, ActualGuidPrefix(guid), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read instances of %s: %w", guid, err)
	}
	for _, kv := range resp.Kvs {
		k, err := parseKey(string(kv.Key))
		if err != nil || k.kind != kindActual {
			continue
		}
		m, _, err := t.s.decode(string(kv.Key), k, kv.Value)
		if err != nil {
			return nil, err
		}
		t.reads[string(kv.Key)] = kv.ModRevision
		out = append(out, m.(*modelsv1.ActualLRP))
	}
	return out, nil
}

// Task reads a task (nil when absent).
func (t *Txn) Task(guid string) (*modelsv1.Task, error) {
	m, err := t.get(TaskKey(guid))
	if m == nil || err != nil {
		return nil, err
	}
	return m.(*modelsv1.Task), nil
}

// Cell reads a cell's presence (nil when the cell is not registered). A transaction that read
// an absent cell commits only if the cell is still absent.
func (t *Txn) Cell(id string) (*modelsv1.CellPresence, error) {
	m, err := t.get(CellKey(id))
	if m == nil || err != nil {
		return nil, err
	}
	return m.(*modelsv1.CellPresence), nil
}

// Domain reads a fresh domain (nil when absent or expired).
func (t *Txn) Domain(name string) (*modelsv1.Domain, error) {
	m, err := t.get(DomainKey(name))
	if m == nil || err != nil {
		return nil, err
	}
	return m.(*modelsv1.Domain), nil
}

// PortOwner reads the process guid of the desired LRP owning a router port ("" when free);
// protocol is "tcp" or "udp".
func (t *Txn) PortOwner(protocol string, port uint32) (string, error) {
	m, err := t.get(PortOwnerKey(protocol, port))
	if m == nil || err != nil {
		return "", err
	}
	return m.(*wrapperspb.StringValue).GetValue(), nil
}

// PutPortOwner makes guid the owner of a router port.
func (t *Txn) PutPortOwner(protocol string, port uint32, guid string) error {
	return t.Put(PortOwnerKey(protocol, port), wrapperspb.String(guid))
}

// Put writes msg under key when the transaction commits, sealed under the active key when
// its kind carries user data (run infos and tasks) and encryption is on.
func (t *Txn) Put(key string, msg proto.Message, opts ...clientv3.OpOption) error {
	b, err := t.s.encode(key, msg)
	if err != nil {
		return err
	}
	// OpPut copies the value into the op, so b is handed over without a string copy of its own.
	t.ops = append(t.ops, clientv3.OpPut(key, unsafe.String(unsafe.SliceData(b), len(b)), opts...))
	return nil
}

// Delete removes key when the transaction commits.
func (t *Txn) Delete(key string) {
	t.ops = append(t.ops, clientv3.OpDelete(key))
}

// Update runs fn and commits its writes atomically if nothing fn read has changed meanwhile,
// retrying fn on fresh data when a compare fails. An error fn returns while reading from the
// cache is re-checked once against etcd before it is returned, so a lagging cache never causes
// a wrong answer. It returns the revision of the write (the cache's revision when fn wrote
// nothing) once the cache reflects it.
//
// A change that cannot reach etcd within Options.UnreachableTimeout is answered Unavailable
// with a retry-after, and is never made: it was not sent, and a queued transaction is
// withdrawn or cancelled with its callers. One sent to etcd whose answer is lost (etcd went
// away, or Options.WriteTimeout ran out) is answered ErrIndeterminate: it may have been made.
// A caller that gives up after its change was sent still gets the change's outcome (within
// Options.WriteTimeout), so that what follows a commit in its code (auctions, stops) is never
// skipped for a change etcd made.
func (s *Store) Update(ctx context.Context, fn func(t *Txn) error) (int64, error) {
	// A change sent to etcd is followed to its outcome for the write timeout even when the
	// caller goes first (its flight): what etcd made, the caller's code completes.
	// A caller whose own deadline comes first (a rep's call, bounded as the write is) keeps
	// its context: deriving one per change was 3% of the BBS's CPU at 1,000 cells.
	flightEnd := time.Now().Add(s.opts.WriteTimeout)
	if d, ok := ctx.Deadline(); !ok || d.After(flightEnd) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, flightEnd) // the caller's wait ends no later
		defer cancel()
	}
	fresh := false
	for attempt := 0; attempt < s.opts.WriteAttempts; attempt++ {
		if fresh && !s.committer.awaitReachable(ctx) {
			return 0, rpcerr.UnavailableRetry(etcdx.UnreachableRetryAfter, "etcd unreachable for %s: the change was not made", s.opts.UnreachableTimeout)
		}
		t := &Txn{s: s, ctx: ctx, fresh: fresh, reads: map[string]int64{}}
		if fresh { // it reads from etcd, which must have a leader; a cached attempt does not
			t.ctx = clientv3.WithRequireLeader(ctx)
		}
		if err := fn(t); err != nil {
			if !fresh && !errors.Is(err, rpcerr.ErrInvalid) {
				fresh = true
				continue
			}
			return 0, err
		}
		if len(t.ops) == 0 {
			return s.cache.Revision(), nil
		}
		req := &commitReq{ops: t.ops, cmps: make([]clientv3.Cmp, 0, len(t.reads)), reads: make([]string, 0, len(t.reads))}
		for key, rev := range t.reads {
			req.cmps = append(req.cmps, clientv3.Compare(clientv3.ModRevision(key), "=", rev))
			req.reads = append(req.reads, key)
		}
		for _, op := range t.ops {
			req.writes = append(req.writes, string(op.KeyBytes()))
			req.bytes += len(op.KeyBytes()) + len(op.ValueBytes())
		}
		queued := time.Now()
		resp, err := s.committer.commit(ctx, flightEnd, req)
		if err == nil {
			err = resp.err
		}
		if err != nil {
			if txnTooLarge(err) {
				return 0, rpcerr.Invalid("request", "too large to store in one etcd transaction (%d writes): %v", len(t.ops), err)
			}
			if !resp.unsent {
				return 0, rpcerr.Indeterminate("etcd did not confirm the change (%v): it may or may not have been made; read it back before sending it again", err)
			}
			return 0, rpcerr.UnavailableRetry(etcdx.UnreachableRetryAfter, "%v; the change was not made", err)
		}
		if resp.ok {
			rev := resp.rev
			committed := time.Now()
			if err := s.cache.WaitFor(ctx, rev, s.opts.ReadYourWritesTimeout); err != nil && ctx.Err() == nil {
				s.log.Warn("cache is lagging behind a committed write", "revision", rev)
			}
			if s.opts.ObserveWrite != nil {
				s.opts.ObserveWrite(committed.Sub(queued), time.Since(committed))
			}
			return rev, nil
		}
		fresh = true
	}
	return 0, rpcerr.Aborted("lost %d compare-and-swap races in a row; retry", s.opts.WriteAttempts)
}

// UpdateValue is Update for a change that yields a value: it runs fn as Update does, once per
// attempt, and returns the value fn returned in the attempt that succeeded (the one whose
// writes committed, or that wrote nothing), with the revision. Values of attempts that failed
// or lost a race are dropped, so fn never resets anything by hand. On error the value is T's
// zero value.
func UpdateValue[T any](ctx context.Context, s *Store, fn func(t *Txn) (T, error)) (T, int64, error) {
	var v T
	rev, err := s.Update(ctx, func(t *Txn) error {
		var err error
		v, err = fn(t)
		return err
	})
	if err != nil {
		var zero T
		return zero, 0, err
	}
	return v, rev, nil
}
