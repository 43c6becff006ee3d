package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Group commit. Independent changes that arrive while earlier transactions are in flight are
// committed together in one etcd transaction: etcd takes ~14k single-key transactions/s but
// ~130k keys/s in 64-key transactions. A batch only holds requests whose keys do not meet (no
// request writes a key another one reads or writes), so committing them together is the same
// as committing them one after the other; when any compare of a batch fails, each request is
// retried on its own transaction so each gets its own answer.
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

type commitReq struct {
	cmps   []clientv3.Cmp
	ops    []clientv3.Op
	reads  []string
	writes []string
	bytes  int
	done   chan commitRes
}

type commitRes struct {
	ok  bool
	rev int64
	err error
}

type committer struct {
	client *clientv3.Client
	reqs   chan *commitReq
	slots  chan struct{}
	// stopped is closed once run has returned and every transaction it started has answered;
	// commits after that fail at once instead of waiting for their context.
	stopped chan struct{}
	// txns counts the goroutines committing batches, joined by run before it returns.
	txns sync.WaitGroup
	// batchOps is the most operations, and the most compares, one grouped transaction holds.
	batchOps atomic.Int64
	// stats count what was committed and how (CommitStats).
	stats struct{ txns, batched, requests, alone atomic.Int64 }
}

// CommitStats counts the store's group commits since it started: how many etcd transactions it
// sent and how many change requests they carried, which shows how well concurrent writes (claims
// and starts from many reps, convergence changes) are grouped.
type CommitStats struct {
	// Transactions is the number of etcd transactions sent, including requests retried alone.
	Transactions int64
	// Batched is the number of those transactions that carried more than one request.
	Batched int64
	// Requests is the number of change requests committed (each answered once).
	Requests int64
	// RetriedAlone counts requests of batches whose compare failed, each then sent again in a
	// transaction of its own so that it gets its own answer.
	RetriedAlone int64
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
		Requests: s.Requests - earlier.Requests, RetriedAlone: s.RetriedAlone - earlier.RetriedAlone}
}

func (c *committer) snapshot() CommitStats {
	return CommitStats{Transactions: c.stats.txns.Load(), Batched: c.stats.batched.Load(),
		Requests: c.stats.requests.Load(), RetriedAlone: c.stats.alone.Load()}
}

// errStopped answers a commit made after the store stopped.
var errStopped = rpcerr.Unavailable("store stopped")

func newCommitter(client *clientv3.Client) *committer {
	c := &committer{client: client, reqs: make(chan *commitReq, 4096), slots: make(chan struct{}, maxInFlightTxns),
		stopped: make(chan struct{})}
	c.batchOps.Store(maxBatchOps)
	return c
}

// commit queues a transaction and waits for its outcome.
func (c *committer) commit(ctx context.Context, r *commitReq) (commitRes, error) {
	r.done = make(chan commitRes, 1)
	select {
	case c.reqs <- r:
	case <-ctx.Done():
		return commitRes{}, ctx.Err()
	case <-c.stopped:
		return commitRes{}, errStopped
	}
	select {
	case res := <-r.done:
		return res, nil
	case <-ctx.Done():
		return commitRes{}, ctx.Err()
	case <-c.stopped:
		// A request queued but never picked gets no answer; one in flight answered before
		// stopped was closed.
		select {
		case res := <-r.done:
			return res, nil
		default:
			return commitRes{}, errStopped
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

func (c *committer) txn(cmps []clientv3.Cmp, ops []clientv3.Op) commitRes {
	c.stats.txns.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return commitRes{err: err}
	}
	return commitRes{ok: resp.Succeeded, rev: resp.Header.Revision}
}

func (c *committer) commitBatch(batch []*commitReq) {
	c.stats.requests.Add(int64(len(batch)))
	if len(batch) == 1 {
		batch[0].done <- c.txn(batch[0].cmps, batch[0].ops)
		return
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, r := range batch {
		cmps = append(cmps, r.cmps...)
		ops = append(ops, r.ops...)
	}
	c.stats.batched.Add(1)
	res := c.txn(cmps, ops)
	if res.err == nil && res.ok {
		for _, r := range batch {
			r.done <- res
		}
		return
	}
	if errors.Is(res.err, rpcerrTooManyOps) {
		c.batchOps.Store(minBatchOps)
	}
	// Some compare failed (or the batch was refused): each request on its own, joined here so
	// the batch's slot is held until every request has its answer.
	c.stats.alone.Add(int64(len(batch)))
	var wg sync.WaitGroup
	for _, r := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.done <- c.txn(r.cmps, r.ops)
		}()
	}
	wg.Wait()
}
