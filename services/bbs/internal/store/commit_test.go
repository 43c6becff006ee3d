package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
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
