package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
)

// twoKeyRequests returns n independent commit requests, each writing two keys of its own under
// prefix and comparing one of them (absent).
func twoKeyRequests(prefix string, n int) []*commitReq {
	reqs := make([]*commitReq, n)
	for i := range reqs {
		a, b := fmt.Sprintf("%s/%04d/a", prefix, i), fmt.Sprintf("%s/%04d/b", prefix, i)
		reqs[i] = &commitReq{
			cmps:   []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(a), "=", 0)},
			ops:    []clientv3.Op{clientv3.OpPut(a, "x"), clientv3.OpPut(b, "y")},
			reads:  []string{a},
			writes: []string{a, b},
			bytes:  len(a) + len(b) + 2,
			done:   make(chan commitRes, 1),
			ctx:    context.Background(),
		}
	}
	return reqs
}

// TestPickHonoursTheOpLimit checks that a batch holds no more operations than the limit it is
// given, in arrival order, and that the rest wait.
func TestPickHonoursTheOpLimit(t *testing.T) {
	reqs := twoKeyRequests("pick", 300)
	for _, limit := range []int{minBatchOps, maxBatchOps} {
		batch, rest := pick(reqs, limit)
		if len(batch) != limit/2 || len(rest) != len(reqs)-limit/2 {
			t.Errorf("limit %d: batch of %d requests, %d left; want %d and %d", limit, len(batch), len(rest), limit/2, len(reqs)-limit/2)
		}
		if batch[0] != reqs[0] || rest[0] != reqs[limit/2] {
			t.Errorf("limit %d: requests taken out of arrival order", limit)
		}
	}
}

// TestBatchRefusedAsTooManyOpsLowersTheLimit runs the committer against an etcd that takes at
// most etcd's default 128 operations per transaction: a grouped transaction over that is
// refused, each of its requests still lands on its own, and the committer's limit drops so
// that later batches fit.
func TestBatchRefusedAsTooManyOpsLowersTheLimit(t *testing.T) {
	_, cli := etcdtest.Start(t, func(c *etcdembed.Config) { c.MaxTxnOps = minBatchOps })
	c := newCommitter(cli, time.Second, nil)
	batch := twoKeyRequests("refused", 150) // 300 operations
	c.commitBatch(batch)
	for i, r := range batch {
		if res := <-r.done; res.err != nil || !res.ok {
			t.Fatalf("request %d of the refused batch: ok %v, error %v", i, res.ok, res.err)
		}
	}
	if got := c.batchOps.Load(); got != minBatchOps {
		t.Fatalf("batch limit after the refusal: %d, want %d", got, minBatchOps)
	}
	if alone := c.stats.alone.Load(); alone != int64(len(batch)) {
		t.Errorf("%d requests sent alone after the refusal, want %d", alone, len(batch))
	}
	resp, err := cli.Get(t.Context(), "refused/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 2*int64(len(batch)) {
		t.Fatalf("%d keys stored, want %d", resp.Count, 2*len(batch))
	}

	// At the lowered limit a batch fits and commits as one transaction.
	next, _ := pick(twoKeyRequests("fits", 100), int(c.batchOps.Load()))
	txns := c.stats.txns.Load()
	c.commitBatch(next)
	for i, r := range next {
		if res := <-r.done; res.err != nil || !res.ok {
			t.Fatalf("request %d of the batch at the lowered limit: ok %v, error %v", i, res.ok, res.err)
		}
	}
	if n := c.stats.txns.Load() - txns; n != 1 {
		t.Errorf("the batch at the lowered limit took %d transactions, want 1", n)
	}
}

// TestFailedCompareAnswersItsRequestAndResendsTheOthers commits a batch in which one request's
// compare is stale (its key was written since it was read): that request alone is answered
// that its compare failed, the others commit together in one more transaction instead of one
// each, and a request whose caller went meanwhile is answered that its change was not made.
// Requests that read a key in common (a read no one writes) stay in the batch.
func TestFailedCompareAnswersItsRequestAndResendsTheOthers(t *testing.T) {
	_, cli := etcdtest.Start(t)
	shared, err := cli.Put(t.Context(), "resend/shared", "v")
	if err != nil {
		t.Fatal(err)
	}
	batch := twoKeyRequests("resend", 10)
	for _, r := range batch {
		r.cmps = append(r.cmps, clientv3.Compare(clientv3.ModRevision("resend/shared"), "=", shared.Header.Revision))
		r.reads = append(r.reads, "resend/shared")
	}
	const stale, gone = 3, 7
	if _, err := cli.Put(t.Context(), "resend/0003/a", "written since"); err != nil {
		t.Fatal(err)
	}
	caller, cancel := context.WithCancel(t.Context())
	cancel()
	batch[gone].ctx = caller

	c := newCommitter(cli, time.Second, nil)
	c.commitBatch(batch)
	for i, r := range batch {
		res := <-r.done
		switch i {
		case stale:
			if res.err != nil || res.ok {
				t.Errorf("the stale request: ok %v, error %v; want its compare failed", res.ok, res.err)
			}
		case gone:
			if res.err == nil || !res.unsent {
				t.Errorf("the request whose caller went: error %v, unsent %v; want not made", res.err, res.unsent)
			}
		default:
			if res.err != nil || !res.ok {
				t.Errorf("request %d: ok %v, error %v; want committed", i, res.ok, res.err)
			}
		}
	}
	st := c.snapshot()
	if st.Transactions != 2 || st.Conflicts != 1 || st.Resent != 8 || st.RetriedAlone != 0 {
		t.Errorf("%d transactions, %d conflicts, %d re-sent together, %d alone; want 2, 1, 8, 0",
			st.Transactions, st.Conflicts, st.Resent, st.RetriedAlone)
	}
	resp, err := cli.Get(t.Context(), "resend/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	for i := range batch {
		a, b := fmt.Sprintf("resend/%04d/a", i), fmt.Sprintf("resend/%04d/b", i)
		switch i {
		case stale:
			if got[a] != "written since" || got[b] != "" {
				t.Errorf("the stale request's keys: %q, %q; want them untouched", got[a], got[b])
			}
		case gone:
			if got[a] != "" || got[b] != "" {
				t.Errorf("the gone request's keys: %q, %q; want none", got[a], got[b])
			}
		default:
			if got[a] != "x" || got[b] != "y" {
				t.Errorf("request %d's keys: %q, %q; want x, y", i, got[a], got[b])
			}
		}
	}
}

// TestComparesHold judges compares by the revisions a failed transaction read: a key's
// revision equal to a value is judged (absent is revision 0); any other compare, or a key not
// read, is not.
func TestComparesHold(t *testing.T) {
	revs := map[string]int64{"a": 5, "gone": 0}
	for _, tc := range []struct {
		name         string
		cmps         []clientv3.Cmp
		holds, known bool
	}{
		{"equal", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("a"), "=", 5)}, true, true},
		{"changed", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("a"), "=", 4)}, false, true},
		{"absent", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("gone"), "=", 0)}, true, true},
		{"one of two", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("gone"), "=", 0), clientv3.Compare(clientv3.ModRevision("a"), "=", 3)}, false, true},
		{"not read", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("b"), "=", 0)}, false, false},
		{"greater", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("a"), ">", 0)}, false, false},
		{"value", []clientv3.Cmp{clientv3.Compare(clientv3.Value("a"), "=", "x")}, false, false},
	} {
		if holds, known := comparesHold(tc.cmps, revs); holds != tc.holds || known != tc.known {
			t.Errorf("%s: holds %v, known %v; want %v, %v", tc.name, holds, known, tc.holds, tc.known)
		}
	}
}

// heldKV holds every transaction that writes key at its commit: it tells sent, then waits for
// release (or the transaction's context) before the transaction reaches etcd.
type heldKV struct {
	clientv3.KV
	key           string
	sent, release chan struct{}
}

func (k *heldKV) Txn(ctx context.Context) clientv3.Txn {
	return &heldTxn{Txn: k.KV.Txn(ctx), k: k, ctx: ctx}
}

type heldTxn struct {
	clientv3.Txn
	k    *heldKV
	ctx  context.Context
	hold bool
}

func (t *heldTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *heldTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *heldTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		t.hold = t.hold || string(op.KeyBytes()) == t.k.key
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *heldTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.hold {
		t.k.sent <- struct{}{}
		select {
		case <-t.k.release:
		case <-t.ctx.Done():
			return nil, t.ctx.Err()
		}
	}
	return t.Txn.Commit()
}

// TestCallerGoneAfterSendGetsTheOutcome cancels a change's caller while its transaction is on
// its way to etcd: the transaction still lands, and Update answers with its revision instead
// of an unknown outcome, so that the code after the commit (a BBS handler's auction) runs for
// a change etcd made. (Before, the transaction was cancelled with its caller, or landed while
// the caller was answered that the outcome was unknown and skipped what follows the commit: a
// scaled-up LRP's new instance then waited for the next convergence pass to be auctioned.)
func TestCallerGoneAfterSendGetsTheOutcome(t *testing.T) {
	_, cli := etcdtest.Start(t)
	key := PortOwnerKey("tcp", 63000)
	held := &heldKV{KV: cli.KV, key: key, sent: make(chan struct{}), release: make(chan struct{})}
	cli.KV = held
	st := New(cli, Options{Logger: logtest.New(t)})
	testkit.Start(t, "store", st)

	ctx, cancel := context.WithCancel(t.Context())
	type result struct {
		rev int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		rev, err := st.Update(ctx, func(tx *Txn) error { return tx.PutPortOwner("tcp", 63000, "web") })
		done <- result{rev, err}
	}()
	select {
	case <-held.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the change never reached its transaction")
	}
	cancel()
	// Time for a transaction cancelled with its caller to end before it is released.
	time.Sleep(100 * time.Millisecond)
	close(held.release)
	var res result
	select {
	case res = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Update did not return after its transaction was released")
	}
	if res.err != nil || res.rev == 0 {
		t.Fatalf("Update whose caller went after sending: revision %d, error %v; want the commit's revision", res.rev, res.err)
	}
	got, err := cli.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || got.Kvs[0].ModRevision != res.rev {
		t.Fatalf("stored %v, want the key at revision %d", got.Kvs, res.rev)
	}
}

// TestFlightContextLastsForTheLatestFlight checks the context a batch's transaction runs
// under: it ends at the latest of its requests' flight ends, not at an earlier one nor when
// a caller goes, never when one of them has no end, and it asks etcd for a leader.
func TestFlightContextLastsForTheLatestFlight(t *testing.T) {
	now := time.Now()
	reqs := twoKeyRequests("flight", 3)
	for i, r := range reqs {
		caller, cancel := context.WithCancel(t.Context())
		cancel() // every caller has gone: a sent request's flight goes on without it
		r.ctx = caller
		r.flightEnd = now.Add(time.Duration(3-i) * time.Hour) // the latest first
	}
	ctx, cancel := flightContext(reqs)
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || !d.Equal(now.Add(3*time.Hour)) {
		t.Fatalf("deadline %v (set %v), want the latest flight's, %v", d, ok, now.Add(3*time.Hour))
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("ended with its callers: %v", err)
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(rpctypes.MetadataRequireLeaderKey)) == 0 {
		t.Errorf("the transaction's context does not require a leader")
	}
	cancel()
	if ctx.Err() == nil {
		t.Errorf("still open after its cancel")
	}

	reqs[1].flightEnd = time.Time{} // no end
	open, cancelOpen := flightContext(reqs)
	defer cancelOpen()
	if d, ok := open.Deadline(); ok {
		t.Errorf("deadline %v with a flight that has none", d)
	}
}

// BenchmarkCommitBatch commits batches of 32 independent two-key requests as the store hands
// them to the committer (each with its caller's context and a flight of the write timeout) to
// an embedded etcd, and reports the committer's allocations per request beside the time.
func BenchmarkCommitBatch(b *testing.B) {
	const perBatch = 32
	_, cli := etcdtest.Start(b)
	c := newCommitter(cli, time.Second, nil)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		batch := twoKeyRequests(fmt.Sprintf("bench/%d", i), perBatch)
		var cancels []context.CancelFunc
		for _, r := range batch {
			var cancel context.CancelFunc
			r.ctx, cancel = context.WithTimeout(b.Context(), 10*time.Second)
			r.flightEnd = time.Now().Add(10 * time.Second)
			cancels = append(cancels, cancel)
		}
		b.StartTimer()
		c.commitBatch(batch)
		for _, r := range batch {
			if res := <-r.done; res.err != nil || !res.ok {
				b.Fatalf("ok %v, error %v", res.ok, res.err)
			}
		}
		b.StopTimer()
		for _, cancel := range cancels {
			cancel()
		}
		b.StartTimer()
	}
}
