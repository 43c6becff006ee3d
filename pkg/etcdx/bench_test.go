package etcdx_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx"
)

// benchWriters is the number of goroutines writing concurrently.
const benchWriters = 64

// benchValue stands in for a small protobuf record.
var benchValue = strings.Repeat("x", 128)

// BenchmarkEtcdTxn measures compare-and-swap transactions (put if the key's
// mod_revision is unchanged, as every Gavel state transition does) against an
// embedded etcd with fsync on, from 64 concurrent goroutines sharing one
// client. Each goroutine owns its keys, so every transaction succeeds.
func BenchmarkEtcdTxn(b *testing.B) {
	ctx := context.Background()
	e, err := etcdx.StartEmbedded(ctx, etcdx.EmbeddedConfig{Dir: b.TempDir(), Quiet: true})
	if err != nil {
		b.Fatalf("start embedded etcd: %v", err)
	}
	b.Cleanup(func() { _ = e.Close() })
	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: e.Endpoints()}, nil)
	if err != nil {
		b.Fatalf("connect: %v", err)
	}
	b.Cleanup(func() { _ = cli.Close() })

	for _, keys := range []int{1, 64} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			benchmarkTxn(b, cli, keys)
		})
	}
}

// writerID numbers benchmark goroutines across runs so keys never repeat.
var writerID atomic.Int64

// benchmarkTxn runs b.N transactions of keys keys each.
func benchmarkTxn(b *testing.B, cli *clientv3.Client, keys int) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((benchWriters + procs - 1) / procs)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := writerID.Add(1)
		names := make([]string, keys)
		revs := make([]int64, keys) // 0: the key does not exist yet
		for i := range names {
			names[i] = fmt.Sprintf("/bench/%d/%d", id, i)
		}
		cmps := make([]clientv3.Cmp, keys)
		puts := make([]clientv3.Op, keys)
		for pb.Next() {
			for i, k := range names {
				cmps[i] = clientv3.Compare(clientv3.ModRevision(k), "=", revs[i])
				puts[i] = clientv3.OpPut(k, benchValue)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			resp, err := cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
			cancel()
			if err != nil {
				b.Errorf("txn on %s: %v", names[0], err)
				return
			}
			if !resp.Succeeded {
				b.Errorf("txn on %s: compare failed", names[0])
				return
			}
			for i := range revs {
				revs[i] = resp.Header.Revision
			}
		}
	})
	secs := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/secs, "txn/s")
	if keys > 1 {
		b.ReportMetric(float64(b.N*keys)/secs, "keys/s")
	}
}
