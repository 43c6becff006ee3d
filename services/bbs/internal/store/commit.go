package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Group commit. Independent changes that arrive while earlier transactions are in flight are
// committed together in one etcd transaction: etcd takes ~14k single-key transactions/s but
// ~130k keys/s in 64-key transactions. A batch only holds requests whose keys do not meet (no
// request writes a key another one reads or writes), so committing them together is the same
// as committing them one after the other. When a compare of a batch fails, the compared keys
// are read at the revision the compares were judged at: the requests whose own compares
// failed are answered so, and the others go again together (commitGroup).
//
// A grouped transaction starts with up to maxBatchOps operations (and as many compares). Gavel's
// etcd runs with --max-txn-ops above the BBS's max_instances + 2 anyway (a DesireLRP writes its
// instances in one transaction), so 512 fits a deployment as documented, and it carries about
// twice as many changes per round as etcd's default of 128 did (a lost cell's instances are
// unclaimed twice as fast). Should a server refuse a grouped transaction as having too many
// operations, the limit drops to etcd's default for good, and the refused batch's requests are
// each sent alone.
const (
	maxInFlightTxns = 4
	maxBatchOps     = 512
	minBatchOps     = 128 // etcd's default --max-txn-ops
	maxBatchBytes   = 1 << 20
)

// MaxOpsInFlight is the most operations the group committer has in flight at once: its
// transactions in flight, each of up to maxBatchOps operations. A writer with many independent
// changes (a convergence pass) needs this many operations queued to keep it full.
const MaxOpsInFlight = maxInFlightTxns * maxBatchOps

type commitReq struct {
	cmps   []clientv3.Cmp
	ops    []clientv3.Op
	reads  []string
	writes []string
	bytes  int
	done   chan commitRes
	// ctx is the caller's: a request whose caller ends before it was sent is withdrawn.
	ctx context.Context
	// flightEnd bounds the request once it was sent (the store's write timeout, not the
	// caller's life): a caller that gives up then still learns the outcome, so that a change
	// etcd made is never taken for one it may not have made, and its effects after the commit
	// (auctions, stops) still happen. The transaction that carries the request is cancelled
	// once every request of its batch is past its flight's end (flightContext). The zero time
	// is no end: the transaction then ends with etcd's answer.
	flightEnd time.Time
	// state says how far the request got: queued, picked into a batch, sent to etcd, or
	// withdrawn by its caller before it was sent (then it never is).
	state atomic.Int32
}

// States of a commitReq. Only the committer moves a request to reqSent, and only from
// reqPicked; only the caller moves it to reqWithdrawn, and only before it was sent. So a
// caller that withdrew knows its change was never sent and never will be.
const (
	reqQueued int32 = iota
	reqPicked
	reqSent
	reqWithdrawn
)

// withdraw takes the request back if it has not been sent; it reports whether it did.
func (r *commitReq) withdraw() bool {
	return r.state.CompareAndSwap(reqQueued, reqWithdrawn) || r.state.CompareAndSwap(reqPicked, reqWithdrawn)
}

type commitRes struct {
	ok  bool
	rev int64
	err error
	// unsent is set on an error that proves the change was not made: etcd never received it,
	// or refused it before proposing it (no leader, too many operations).
	unsent bool
}

type committer struct {
	client *clientv3.Client
	// unreachable bounds how long a request waits for etcd to become reachable before its
	// caller is answered that etcd is unavailable (the request is then withdrawn, unsent).
	unreachable time.Duration
	// observe is told how long each transaction took.
	observe func(time.Duration)
	reqs    chan *commitReq
	slots   chan struct{}
	// stopped is closed once run has returned and every transaction it started has answered;
	// commits after that fail at once instead of waiting for their context.
	stopped chan struct{}
	// txns counts the goroutines committing batches, joined by run before it returns.
	txns sync.WaitGroup
	// batchOps is the most operations, and the most compares, one grouped transaction holds.
	batchOps atomic.Int64
	// stats count what was committed and how (CommitStats).
	stats struct{ txns, batched, requests, alone, conflicts, resent atomic.Int64 }
}

// CommitStats counts the store's group commits since it started: how many etcd transactions it
// sent and how many change requests they carried, which shows how well concurrent writes (claims
// and starts from many reps, convergence changes) are grouped.
type CommitStats struct {
	// Transactions is the number of etcd transactions sent, including requests sent again.
	Transactions int64
	// Batched is the number of those transactions that carried more than one request.
	Batched int64
	// Requests is the number of change requests committed (each answered once).
	Requests int64
	// RetriedAlone counts requests of batches that etcd refused as too big (or whose failed
	// compare its reads could not place), each then sent again in a transaction of its own.
	RetriedAlone int64
	// Conflicts counts requests of grouped transactions whose own compare failed: each lost a
	// race and was answered so, as alone.
	Conflicts int64
	// Resent counts requests of grouped transactions that failed on another request's compare,
	// sent again together with the others whose compares held.
	Resent int64
}

// RequestsPerTransaction is Requests / Transactions, zero before any transaction.
func (s CommitStats) RequestsPerTransaction() float64 {
	if s.Transactions == 0 {
		return 0
	}
	return float64(s.Requests) / float64(s.Transactions)
}

// Sub is s minus earlier, the counts of an interval.
func (s CommitStats) Sub(earlier CommitStats) CommitStats {
	return CommitStats{Transactions: s.Transactions - earlier.Transactions, Batched: s.Batched - earlier.Batched,
		Requests: s.Requests - earlier.Requests, RetriedAlone: s.RetriedAlone - earlier.RetriedAlone,
		Conflicts: s.Conflicts - earlier.Conflicts, Resent: s.Resent - earlier.Resent}
}

func (c *committer) snapshot() CommitStats {
	return CommitStats{Transactions: c.stats.txns.Load(), Batched: c.stats.batched.Load(),
		Requests: c.stats.requests.Load(), RetriedAlone: c.stats.alone.Load(),
		Conflicts: c.stats.conflicts.Load(), Resent: c.stats.resent.Load()}
}

// errStopped answers a commit made after the store stopped.
var errStopped = rpcerr.Unavailable("store stopped")

func newCommitter(client *clientv3.Client, unreachable time.Duration, observe func(time.Duration)) *committer {
	if observe == nil {
		observe = func(time.Duration) {}
	}
	c := &committer{client: client, unreachable: unreachable, observe: observe, reqs: make(chan *commitReq, 4096), slots: make(chan struct{}, maxInFlightTxns),
		stopped: make(chan struct{})}
	c.batchOps.Store(maxBatchOps)
	return c
}

// unreachableError answers a request withdrawn unsent because etcd could not be reached in time.
type unreachableError struct{ after time.Duration }

func (e unreachableError) Error() string {
	return fmt.Sprintf("etcd unreachable for %s: the change was not sent", e.after)
}

// commit queues a transaction and waits for its outcome: the result, or an error. A request
// that could not be sent within the committer's unreachable bound while etcd is out of reach, or
// before ctx ended, is withdrawn and answered with res.unsent set: it is never sent afterwards.
// Once it was sent, commit waits for etcd's answer even after ctx ends, until flightEnd at the
// latest (the zero time: no end): the transaction's outcome, not the caller's impatience,
// decides what commit returns.
func (c *committer) commit(ctx context.Context, flightEnd time.Time, r *commitReq) (commitRes, error) {
	r.done = make(chan commitRes, 1)
	r.ctx, r.flightEnd = ctx, flightEnd
	unsent := commitRes{unsent: true}
	select {
	case c.reqs <- r:
	case <-ctx.Done():
		return unsent, ctx.Err()
	case <-c.stopped:
		return unsent, errStopped
	}
	bound := time.NewTimer(c.unreachable)
	defer bound.Stop()
	gone := ctx.Done()
	for {
		select {
		case res := <-r.done:
			return res, nil
		case <-bound.C:
			// Only an etcd out of reach withdraws a request at the bound; one merely queued
			// behind others (a busy committer) waits on, until its caller's end.
			if !c.connected() && r.withdraw() {
				return unsent, unreachableError{c.unreachable}
			}
			bound.Reset(c.unreachable)
		case <-gone:
			if r.withdraw() {
				return unsent, ctx.Err()
			}
			// Sent: its transaction answers by its flight's end at the latest.
			gone = nil
		case <-c.stopped:
			// A request queued but never picked gets no answer; one in flight answered before
			// stopped was closed.
			select {
			case res := <-r.done:
				return res, nil
			default:
				return unsent, errStopped
			}
		}
	}
}

// run forms batches until ctx ends, then waits for the transactions in flight and closes
// stopped.
func (c *committer) run(ctx context.Context) {
	defer close(c.stopped)
	defer c.txns.Wait()
	var pending []*commitReq
	for {
		if len(pending) == 0 {
			select {
			case r := <-c.reqs:
				pending = append(pending, r)
			case <-ctx.Done():
				return
			}
		}
		// Waiting for a free slot is what lets a batch grow under load.
		select {
		case c.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
	drain:
		for {
			select {
			case r := <-c.reqs:
				pending = append(pending, r)
			default:
				break drain
			}
		}
		var batch []*commitReq
		batch, pending = pick(pending, int(c.batchOps.Load()))
		c.txns.Add(1)
		go func() {
			defer c.txns.Done()
			defer func() { <-c.slots }()
			c.commitBatch(batch)
		}()
	}
}

// pick takes, in arrival order, the requests that fit one batch of at most maxOps operations
// and as many compares; the rest wait.
func pick(pending []*commitReq, maxOps int) (batch, rest []*commitReq) {
	reads, writes := map[string]bool{}, map[string]bool{}
	ops, bytes := 0, 0
	for _, r := range pending {
		if r.state.Load() == reqWithdrawn {
			continue
		}
		fits := len(batch) == 0 || (ops+len(r.ops) <= maxOps && ops+len(r.cmps) <= maxOps && bytes+r.bytes <= maxBatchBytes)
		for _, k := range r.writes {
			fits = fits && !reads[k] && !writes[k]
		}
		for _, k := range r.reads {
			fits = fits && !writes[k]
		}
		if !fits {
			rest = append(rest, r)
			continue
		}
		batch = append(batch, r)
		ops, bytes = ops+max(len(r.ops), len(r.cmps)), bytes+r.bytes
		for _, k := range r.reads {
			reads[k] = true
		}
		for _, k := range r.writes {
			writes[k] = true
		}
	}
	return batch, rest
}

// callersContext is the context of waiting for etcd on behalf of reqs: it ends once every
// request's caller has gone, so that nobody waits for an answer no one takes.
func callersContext(reqs []*commitReq) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	left := atomic.Int64{}
	left.Store(int64(len(reqs)))
	stops := make([]func() bool, 0, len(reqs))
	for _, r := range reqs {
		stops = append(stops, context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// flightContext is the context of the transaction that carries reqs, all sent: it lasts until
// the latest of their flights' ends, when the last of them is past its flight, found without a
// callback per request. It carries etcd's require-leader flag, so that a member cut off from
// its cluster refuses the transaction at once instead of proposing it.
func flightContext(reqs []*commitReq) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, r := range reqs {
		if r.flightEnd.IsZero() {
			last = time.Time{}
			break
		}
		if r.flightEnd.After(last) {
			last = r.flightEnd
		}
	}
	ctx := clientv3.WithRequireLeader(context.Background())
	if last.IsZero() { // a flight without a deadline: the transaction ends with its answer
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, last)
}

// awaitReachable waits until the etcd client has a connection ready, for at most the
// committer's unreachable bound or until ctx ends; it reports whether one is.
func (c *committer) awaitReachable(ctx context.Context) bool {
	return etcdx.AwaitReachable(ctx, c.client, c.unreachable)
}

// connected reports whether the etcd client has a ready connection now.
func (c *committer) connected() bool { return etcdx.Connected(c.client) }

// send marks the still-wanted requests of reqs sent and returns them; a request withdrawn by
// its caller is left out and never sent.
func send(reqs []*commitReq) []*commitReq {
	var out []*commitReq
	for _, r := range reqs {
		if r.state.CompareAndSwap(reqPicked, reqSent) {
			out = append(out, r)
		}
	}
	return out
}

// txn sends one transaction and classifies its failure: an error etcd gives before proposing
// it (no leader, too many operations, too large) proves it was not made; any other failure
// (the connection broke, the context ended, etcd's own request timeout) leaves the outcome
// unknown. A failed compare's result carries the revision etcd judged the compares at.
func (c *committer) txn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) commitRes {
	c.stats.txns.Add(1)
	// A transaction in flight when etcd goes away ends once the connection has been gone for
	// the unreachable bound, not at its callers' deadline (its outcome is then unknown).
	ctx, done := etcdx.WhileReachable(ctx, c.client, c.unreachable)
	defer done()
	start := time.Now()
	resp, err := c.client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	c.observe(time.Since(start))
	if err != nil {
		return commitRes{err: err, unsent: etcdx.RefusedBeforeProposal(err)}
	}
	return commitRes{ok: resp.Succeeded, rev: resp.Header.Revision}
}

// commitBatch waits for etcd to be reachable, sends the batch's requests that are still
// wanted as one transaction, and answers each (commitGroup).
func (c *committer) commitBatch(batch []*commitReq) {
	for _, r := range batch {
		r.state.CompareAndSwap(reqQueued, reqPicked)
	}
	// Only an etcd out of reach makes the batch wait, for as long as one of its callers does.
	reachable := c.connected()
	if !reachable {
		gctx, gcancel := callersContext(batch)
		reachable = c.awaitReachable(gctx)
		gcancel()
	}
	if !reachable {
		// Callers withdraw on their own bound; those still waiting are answered at once.
		for _, r := range batch {
			if r.withdraw() {
				r.done <- commitRes{err: unreachableError{c.unreachable}, unsent: true}
			}
		}
		return
	}
	batch = send(batch)
	if len(batch) == 0 {
		return
	}
	c.stats.requests.Add(int64(len(batch)))
	c.commitGroup(batch)
}

// commitGroup commits sent requests as one transaction and answers each. When a compare fails,
// nothing of the transaction is applied, and the revision of every key compared is read at the
// revision the compares were judged at (compareRevisions): each request whose own compare
// failed is answered then, as a transaction of its own would have been (it lost a race), and
// the others, whose compares held, go again together. So one stale request costs its batch a
// read and one more transaction, not one transaction per request. Should the read not tell (a
// compare other than a key's revision, or that revision compacted meanwhile), or etcd refuse
// the transaction as too big, each request goes on its own.
func (c *committer) commitGroup(batch []*commitReq) {
	for len(batch) > 1 {
		nCmps, nOps := 0, 0
		for _, r := range batch {
			nCmps, nOps = nCmps+len(r.cmps), nOps+len(r.ops)
		}
		cmps, ops := make([]clientv3.Cmp, 0, nCmps), make([]clientv3.Op, 0, nOps)
		for _, r := range batch {
			cmps = append(cmps, r.cmps...)
			ops = append(ops, r.ops...)
		}
		c.stats.batched.Add(1)
		ctx, cancel := flightContext(batch)
		res := c.txn(ctx, cmps, ops)
		var revs map[string]int64
		read := false
		if res.err == nil && !res.ok { // a compare failed: which?
			revs, read = c.compareRevisions(ctx, cmps, res.rev)
		}
		cancel()
		tooBig := txnTooLarge(res.err)
		if (res.err == nil && res.ok) || (res.err != nil && !tooBig) {
			// Applied, or failed alike for every request of the batch: the outcome unknown, or
			// refused unsent (no leader).
			for _, r := range batch {
				r.done <- res
			}
			return
		}
		if tooBig {
			if errors.Is(res.err, rpcerrTooManyOps) {
				c.batchOps.Store(minBatchOps)
			}
			c.commitAlone(batch)
			return
		}
		if !read {
			c.commitAlone(batch)
			return
		}
		var held []*commitReq
		for _, r := range batch {
			switch holds, known := comparesHold(r.cmps, revs); {
			case !known:
				held = append(held, r) // no answer from the reads: it goes again
			case !holds:
				c.stats.conflicts.Add(1)
				r.done <- res // its compare failed: not applied, as alone
			case r.ctx.Err() != nil:
				// Its caller has gone meanwhile: answered that its change was not made, and
				// it stays unmade.
				r.done <- commitRes{err: r.ctx.Err(), unsent: true}
			default:
				held = append(held, r)
			}
		}
		if len(held) == len(batch) { // no request found at fault: each goes on its own
			c.commitAlone(batch)
			return
		}
		c.stats.resent.Add(int64(len(held)))
		batch = held
	}
	if len(batch) == 1 {
		ctx, cancel := flightContext(batch)
		defer cancel()
		res := c.txn(ctx, batch[0].cmps, batch[0].ops)
		batch[0].done <- res
	}
}

// commitAlone sends each request of a batch that was not applied again on its own, so that each
// gets its own answer, unless its caller has gone meanwhile: that one is answered that its change
// was not made, and it stays unmade. Joined here so the batch's slot is held until every request
// has its answer.
func (c *committer) commitAlone(batch []*commitReq) {
	c.stats.alone.Add(int64(len(batch)))
	var wg sync.WaitGroup
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.done <- commitRes{err: err, unsent: true}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := flightContext([]*commitReq{r})
			defer cancel()
			res := c.txn(ctx, r.cmps, r.ops)
			r.done <- res
		}()
	}
	wg.Wait()
}

// compareRevisions reads, at revision rev (where a transaction judged cmps and failed), the
// revision of every key cmps compare, in one read-only transaction of keys-only reads. It
// reports false when etcd does not answer every read (unreachable, or rev compacted).
// A failure branch in the transaction itself would read the same in the same round trip, but
// it was built, sent and decoded with every transaction, most of which do not fail: 5% of the
// BBS's allocations went to it at 5,000 cells.
func (c *committer) compareRevisions(ctx context.Context, cmps []clientv3.Cmp, rev int64) (map[string]int64, bool) {
	keys, reads := comparedKeys(cmps, rev)
	ctx, done := etcdx.WhileReachable(ctx, c.client, c.unreachable)
	defer done()
	resp, err := c.client.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return nil, false
	}
	return keyRevisions(keys, resp.Responses)
}

// comparedKeys returns the distinct keys cmps compare, in order, and a keys-only read of each
// at revision rev.
func comparedKeys(cmps []clientv3.Cmp, rev int64) ([]string, []clientv3.Op) {
	seen := make(map[string]bool, len(cmps))
	keys, reads := make([]string, 0, len(cmps)), make([]clientv3.Op, 0, len(cmps))
	for i := range cmps {
		k := string(cmps[i].KeyBytes())
		if seen[k] {
			continue
		}
		seen[k] = true
		keys = append(keys, k)
		reads = append(reads, clientv3.OpGet(k, clientv3.WithKeysOnly(), clientv3.WithRev(rev)))
	}
	return keys, reads
}

// keyRevisions maps each key to the revision its read in responses found (0: absent); it
// reports false when responses do not answer every read.
func keyRevisions(keys []string, responses []*etcdserverpb.ResponseOp) (map[string]int64, bool) {
	if len(responses) != len(keys) {
		return nil, false
	}
	revs := make(map[string]int64, len(keys))
	for i, k := range keys {
		rr := responses[i].GetResponseRange()
		if rr == nil {
			return nil, false
		}
		revs[k] = 0
		for _, kv := range rr.Kvs {
			if string(kv.Key) == k {
				revs[k] = kv.ModRevision
			}
		}
	}
	return revs, true
}

// comparesHold reports whether every compare of cmps holds for the keys' revisions revs; known
// is false for a compare revs cannot judge (only a key's revision equal to a value can be).
func comparesHold(cmps []clientv3.Cmp, revs map[string]int64) (holds, known bool) {
	holds = true
	for i := range cmps {
		cmp := cmps[i].GetCompare()
		rev, read := revs[string(cmp.GetKey())]
		if cmp.GetTarget() != etcdserverpb.Compare_MOD || cmp.GetResult() != etcdserverpb.Compare_EQUAL || len(cmp.GetRangeEnd()) > 0 || !read {
			return false, false
		}
		holds = holds && rev == cmp.GetModRevision()
	}
	return holds, true
}
