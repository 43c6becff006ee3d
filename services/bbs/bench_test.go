package bbs_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// The benchmarks run a real BBS on loopback gRPC over an embedded etcd with fsync on, the way
// it runs in production, and each iteration is a fixed workload: `make bench` runs them with
// -benchtime 1x, so one iteration must already be a meaningful measurement. Rates are computed
// from the timed part of each iteration only.
const (
	// benchWorkers is the number of concurrent clients of the throughput benchmarks.
	benchWorkers = 64
	// benchConns is the number of gRPC connections those clients share.
	benchConns = 4
	// benchTimeout bounds one benchmark.
	benchTimeout = 5 * time.Minute
)

// benchCtx is a context that ends with the benchmark (or after benchTimeout).
func benchCtx(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	b.Cleanup(cancel)
	return ctx
}

// startFsyncEtcd runs a single-node embedded etcd with fsync on in a fresh directory, on a
// loopback port, and returns a client of it. Both close when the benchmark ends.
func startFsyncEtcd(b *testing.B) *clientv3.Client {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := etcdembed.Start(ctx, etcdembed.Config{
		Dir:           b.TempDir(),
		ClientAddr:    "127.0.0.1:0",
		UnsafeNoFsync: false,
		Quiet:         true,
	})
	if err != nil {
		b.Fatalf("start embedded etcd: %v", err)
	}
	b.Cleanup(func() {
		if err := e.Close(); err != nil {
			b.Errorf("close embedded etcd: %v", err)
		}
	})
	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: e.Endpoints()}, nil)
	if err != nil {
		b.Fatalf("connect to embedded etcd: %v", err)
	}
	// Registered after the server's cleanup, so it runs first.
	b.Cleanup(func() { _ = cli.Close() })
	return cli
}

// startBenchBBS runs a BBS over a fresh fsync'ing etcd.
func startBenchBBS(b *testing.B) *bbstest.Env {
	b.Helper()
	return bbstest.StartOn(b, startFsyncEtcd(b))
}

// dialBBS opens n extra gRPC connections to the BBS, closed when the benchmark ends.
func dialBBS(b *testing.B, addr string, n int) []bbsv1.BBSServiceClient {
	b.Helper()
	out := make([]bbsv1.BBSServiceClient, n)
	for i := range out {
		conn := testkit.Dial(b, addr)
		b.Cleanup(func() { _ = conn.Close() })
		out[i] = bbsv1.NewBBSServiceClient(conn)
	}
	return out
}

// parallel calls fn(worker, i) for every i in [0, n) from workers goroutines and returns the
// first error; after an error the remaining items are skipped.
func parallel(n, workers int, fn func(worker, i int) error) error {
	var (
		next    atomic.Int64
		failed  atomic.Bool
		errOnce sync.Once
		first   error
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(w, i); err != nil {
					errOnce.Do(func() { first = err })
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// desireAll desires one LRP of the given instance count per guid, concurrently.
func desireAll(ctx context.Context, clients []bbsv1.BBSServiceClient, guids []string, instances int32) error {
	reqs := make([]*bbsv1.DesireLRPRequest, len(guids))
	for i, g := range guids {
		reqs[i] = &bbsv1.DesireLRPRequest{DesiredLrp: lrp(g, instances)}
	}
	return parallel(len(reqs), benchWorkers, func(w, i int) error {
		if _, err := clients[w%len(clients)].DesireLRP(ctx, reqs[i]); err != nil {
			return fmt.Errorf("desire %s: %w", guids[i], err)
		}
		return nil
	})
}

// benchGuids names n process guids unique to one iteration of one benchmark.
func benchGuids(prefix string, iteration, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d-%05d", prefix, iteration, i)
	}
	return out
}

// benchInstanceKey is the container a benchmark claims and starts an instance in.
func benchInstanceKey(guid string, index int32) *modelsv1.ActualLRPInstanceKey {
	return &modelsv1.ActualLRPInstanceKey{
		InstanceGuid: fmt.Sprintf("ig-%s-%d", guid, index),
		CellId:       fmt.Sprintf("cell-%d", index%8),
	}
}

// benchNetInfo is the network information of a started benchmark instance.
var benchNetInfo = &modelsv1.ActualLRPNetInfo{
	Address:         "10.0.0.1",
	InstanceAddress: "10.255.0.1",
	Ports:           []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 61000}},
}

// BenchmarkRawEtcdTxn is the baseline the BBS rates are quoted against: single-key
// compare-and-swap transactions (put if the key's mod_revision is unchanged, as every BBS
// state transition does) straight to the same kind of etcd, from 64 concurrent goroutines
// sharing one client. Each goroutine owns its key, so every transaction succeeds.
func BenchmarkRawEtcdTxn(b *testing.B) {
	const txnsPerOp = 20_000
	ctx := benchCtx(b)
	cli := startFsyncEtcd(b)
	value := strings.Repeat("x", 256) // about the size of an encoded ActualLRP
	var elapsed time.Duration
	b.ResetTimer()
	for it := range b.N {
		keys := make([]string, benchWorkers)
		revs := make([]int64, benchWorkers) // owned by one worker each; 0: the key is absent
		for w := range keys {
			keys[w] = fmt.Sprintf("/bench/raw/%d/%d", it, w)
		}
		start := time.Now()
		err := parallel(txnsPerOp, benchWorkers, func(w, _ int) error {
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(keys[w]), "=", revs[w])).
				Then(clientv3.OpPut(keys[w], value)).
				Commit()
			if err != nil {
				return fmt.Errorf("txn on %s: %w", keys[w], err)
			}
			if !resp.Succeeded {
				return fmt.Errorf("txn on %s: compare failed", keys[w])
			}
			revs[w] = resp.Header.Revision
			return nil
		})
		elapsed += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(txnsPerOp*b.N)/elapsed.Seconds(), "txn/s")
}

// BenchmarkDesireLRPClear desires LRPs of 10 instances each from 64 concurrent clients; each
// desire is one etcd transaction writing the desired record's two halves and its 10 UNCLAIMED
// instances, all clear (encryption off).
func BenchmarkDesireLRPClear(b *testing.B) { benchDesireLRP(b) }

// BenchmarkDesireLRPSealed is BenchmarkDesireLRPClear with encryption at rest on: each run info
// is sealed with AES-256-GCM before it is written (the write cost of encryption; reads pay
// nothing, the cache holding plaintext).
func BenchmarkDesireLRPSealed(b *testing.B) {
	keys := keyDir(b, "k1")
	benchDesireLRP(b, encryption(keys, "k1", "k1"))
}

// benchDesireLRP is the DesireLRP benchmark over a BBS configured by configure.
func benchDesireLRP(b *testing.B, configure ...func(*bbs.Config)) {
	const lrpsPerOp, instances = 5_000, 10
	ctx := benchCtx(b)
	env := bbstest.StartOn(b, startFsyncEtcd(b), configure...)
	clients := dialBBS(b, env.Addr, benchConns)
	var elapsed time.Duration
	b.ResetTimer()
	for it := range b.N {
		b.StopTimer()
		guids := benchGuids("desire", it, lrpsPerOp)
		reqs := make([]*bbsv1.DesireLRPRequest, len(guids))
		for i, g := range guids {
			reqs[i] = &bbsv1.DesireLRPRequest{DesiredLrp: lrp(g, instances)}
		}
		b.StartTimer()
		start := time.Now()
		err := parallel(len(reqs), benchWorkers, func(w, i int) error {
			if _, err := clients[w%len(clients)].DesireLRP(ctx, reqs[i]); err != nil {
				return fmt.Errorf("desire %s: %w", guids[i], err)
			}
			return nil
		})
		elapsed += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	secs := elapsed.Seconds()
	b.ReportMetric(float64(lrpsPerOp*b.N)/secs, "lrps/s")
	b.ReportMetric(float64(lrpsPerOp*instances*b.N)/secs, "instances/s")
}

// BenchmarkReencrypt is the rotation rate: 5,000 run infos sealed under k1, then a BBS leading
// with k2 active re-encrypts them in the background (batches of the default
// reencrypt_batch, one transaction in flight). Timed from the moment it leads until nothing
// is left; setup (desiring, restarting) is not timed.
func BenchmarkReencrypt(b *testing.B) {
	const records = 5_000
	ctx := benchCtx(b)
	keys := keyDir(b, "k1", "k2")
	var elapsed time.Duration
	for it := range b.N {
		b.StopTimer()
		cli := startFsyncEtcd(b)
		old := bbstest.StartOn(b, cli, encryption(keys, "k1", "k1"))
		if err := desireAll(ctx, dialBBS(b, old.Addr, benchConns), benchGuids("reencrypt", it, records), 1); err != nil {
			b.Fatal(err)
		}
		if err := old.Stop(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		rotating := bbstest.StartOnWith(b, cli, nil, encryption(keys, "k2", "k1", "k2"))
		for !rotating.Service.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		start := time.Now()
		for rotating.Service.RecordsToReencrypt() > 0 {
			if ctx.Err() != nil {
				b.Fatal("re-encryption did not finish")
			}
			time.Sleep(time.Millisecond)
		}
		elapsed += time.Since(start)
		b.StopTimer()
		if err := rotating.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(records*b.N)/elapsed.Seconds(), "records/s")
}

// BenchmarkClaimStart claims and then starts every instance of pre-desired LRPs (two RPCs,
// two compare-and-swap transactions per instance) from 64 concurrent goroutines, as the cells
// do when a wave of instances is placed. Desiring is setup and not timed.
func BenchmarkClaimStart(b *testing.B) {
	const lrpsPerOp, instances = 2_000, 10 // 20,000 instances, 40,000 transitions per op
	ctx := benchCtx(b)
	env := startBenchBBS(b)
	clients := dialBBS(b, env.Addr, benchConns)
	var elapsed time.Duration
	b.ResetTimer()
	for it := range b.N {
		b.StopTimer()
		guids := benchGuids("claim", it, lrpsPerOp)
		if err := desireAll(ctx, clients, guids, instances); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		err := parallel(lrpsPerOp*instances, benchWorkers, func(w, i int) error {
			c := clients[w%len(clients)]
			guid, index := guids[i/instances], int32(i%instances)
			ik := benchInstanceKey(guid, index)
			if _, err := c.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: ik}); err != nil {
				return fmt.Errorf("claim %s/%d: %w", guid, index, err)
			}
			resp, err := c.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: ik, NetInfo: benchNetInfo, Routable: true})
			if err != nil {
				return fmt.Errorf("start %s/%d: %w", guid, index, err)
			}
			if resp.GetActualLrp().GetState() != modelsv1.ActualLRP_STATE_RUNNING {
				return fmt.Errorf("start %s/%d: state %v", guid, index, resp.GetActualLrp().GetState())
			}
			return nil
		})
		elapsed += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(2*lrpsPerOp*instances*b.N)/elapsed.Seconds(), "transitions/s")
}

// BenchmarkActualLRPsList100k lists all 100,000 instances of 10,000 LRPs over gRPC, from the
// BBS's cache. The store is filled once in the parent benchmark (so it is neither timed nor
// repeated however often the testing package calls the timed sub-benchmark); each op of the
// sub-benchmark is listsPerOp complete lists.
func BenchmarkActualLRPsList100k(b *testing.B) {
	const lrps, instances, want = 10_000, 10, 100_000
	const listsPerOp = 5
	ctx := benchCtx(b)
	env := startBenchBBS(b)
	clients := dialBBS(b, env.Addr, benchConns)
	setup := time.Now()
	if err := desireAll(ctx, clients, benchGuids("list", 0, lrps), instances); err != nil {
		b.Fatal(err)
	}
	b.Logf("desired %d LRPs x %d instances in %v", lrps, instances, time.Since(setup).Round(time.Millisecond))

	list := func() (time.Duration, *bbsv1.ActualLRPsResponse, error) {
		start := time.Now()
		resp, err := env.Client.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
		d := time.Since(start)
		if err != nil {
			return 0, nil, fmt.Errorf("ActualLRPs: %w", err)
		}
		if n := len(resp.GetActualLrps()); n != want {
			return 0, nil, fmt.Errorf("ActualLRPs returned %d instances, want %d", n, want)
		}
		return d, resp, nil
	}
	// One untimed list warms the connection's buffers and the allocator.
	d, resp, err := list()
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("first list: %v, %.1f MB on the wire", d.Round(time.Millisecond), float64(proto.Size(resp))/1e6)
	runtime.GC()

	b.Run(fmt.Sprintf("lists=%d", listsPerOp), func(b *testing.B) {
		var total, worst time.Duration
		b.ResetTimer()
		for range b.N {
			for range listsPerOp {
				d, _, err := list()
				if err != nil {
					b.Fatal(err)
				}
				total += d
				worst = max(worst, d)
			}
		}
		b.StopTimer()
		n := float64(listsPerOp * b.N)
		b.ReportMetric(float64(total)/float64(time.Millisecond)/n, "ms/list")
		b.ReportMetric(float64(worst)/float64(time.Millisecond), "max_ms/list")
	})
}

// BenchmarkEventFanout measures event delivery latency to 10 subscribers of SubscribeToEvents
// (each on its own connection) while one writer claims instances at a bounded rate: for every
// subscriber and every claim, the time from just before the ClaimActualLRP RPC is sent to the
// subscriber receiving the matching ActualLRPChanged event.
func BenchmarkEventFanout(b *testing.B) {
	const (
		subscribers    = 10
		lrps           = 200
		instances      = 10
		events         = lrps * instances // 2,000 claims per op
		writeInterval  = 2 * time.Millisecond
		deliverTimeout = time.Minute
	)
	ctx := benchCtx(b)
	env := startBenchBBS(b)
	subClients := dialBBS(b, env.Addr, subscribers)
	var samples []time.Duration
	var writing time.Duration
	b.ResetTimer()
	for it := range b.N {
		b.StopTimer()
		guids := benchGuids("fan", it, lrps)
		if err := desireAll(ctx, []bbsv1.BBSServiceClient{env.Client}, guids, instances); err != nil {
			b.Fatal(err)
		}
		// Event number of each instance; only read once built.
		seq := make(map[string]int, events)
		for i := range events {
			seq[fmt.Sprintf("%s/%d", guids[i/instances], i%instances)] = i
		}
		base := time.Now()
		sent := make([]atomic.Int64, events) // nanoseconds after base the claim was sent; 0: not yet

		sctx, cancel := context.WithTimeout(ctx, deliverTimeout)
		ready := make(chan struct{}, subscribers)
		failed := make(chan struct{}, subscribers)
		got := make([][]time.Duration, subscribers)
		errs := make([]error, subscribers)
		var wg sync.WaitGroup
		for s, c := range subClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[s], errs[s] = subscribe(sctx, c, ready, seq, sent, base)
				if errs[s] != nil {
					failed <- struct{}{}
				}
			}()
		}
		// A subscription is live once its first message (a bookmark, when idle) has arrived.
		for range subscribers {
			ok := false
			select {
			case <-ready:
				ok = true
			case <-failed:
			case <-sctx.Done():
			}
			if !ok {
				cancel()
				wg.Wait()
				b.Fatalf("subscribers not ready: %v", errors.Join(errs...))
			}
		}
		b.StartTimer()

		start := time.Now()
		var werr error
		for i := range events {
			if d := time.Until(start.Add(time.Duration(i) * writeInterval)); d > 0 {
				time.Sleep(d)
			}
			guid, index := guids[i/instances], int32(i%instances)
			sent[i].Store(int64(time.Since(base)))
			if _, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: benchInstanceKey(guid, index)}); err != nil {
				werr = fmt.Errorf("claim %s/%d: %w", guid, index, err)
				break
			}
		}
		writing += time.Since(start)
		if werr != nil {
			cancel()
		}
		wg.Wait()
		cancel()
		if werr != nil {
			b.Fatal(werr)
		}
		if err := errors.Join(errs...); err != nil {
			b.Fatal(err)
		}
		for _, g := range got {
			samples = append(samples, g...)
		}
	}
	b.StopTimer()
	slices.Sort(samples)
	pct := func(p float64) float64 {
		return float64(samples[int(p*float64(len(samples)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
	b.ReportMetric(pct(1), "max_ms")
	b.ReportMetric(float64(events*b.N)/writing.Seconds(), "writes/s")
}

// subscribe follows the event stream until it has seen the claim of every instance in seq,
// returning the latency of each: its arrival less the time sent records for it. It signals
// ready once the stream has delivered its first message.
func subscribe(ctx context.Context, c bbsv1.BBSServiceClient, ready chan<- struct{}, seq map[string]int, sent []atomic.Int64, base time.Time) ([]time.Duration, error) {
	stream, err := c.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{})
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	out := make([]time.Duration, 0, len(seq))
	seen := make([]bool, len(seq))
	first := true
	for len(out) < len(seq) {
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("receive after %d of %d claims: %w", len(out), len(seq), err)
		}
		at := time.Since(base)
		if first {
			first = false
			ready <- struct{}{}
		}
		for _, ev := range resp.GetEvents() {
			after := ev.GetActualLrpChanged().GetAfter()
			if after.GetState() != modelsv1.ActualLRP_STATE_CLAIMED {
				continue
			}
			i, ok := seq[fmt.Sprintf("%s/%d", after.GetKey().GetProcessGuid(), after.GetKey().GetIndex())]
			if !ok || seen[i] {
				continue
			}
			s := sent[i].Load()
			if s == 0 {
				return nil, fmt.Errorf("event for claim %d arrived before it was sent", i)
			}
			seen[i] = true
			out = append(out, at-time.Duration(s))
		}
	}
	return out, nil
}

// BenchmarkCellLossPass measures convergence's cell-loss pass alone: 100 cells hold 100 RUNNING
// instances each; half the cells lose their presence, and one ConvergeCells pass replaces
// their 5,000 instances (a SUSPECT copy and an unclaimed slot each). It compares a transaction
// per instance (txn=1, as before decision 0050) with up to 64 instances of a cell per
// transaction (txn=64, the default); there is no auctioneer, so only the BBS and etcd work.
func BenchmarkCellLossPass(b *testing.B) {
	const cells, perCell, lost = 100, 100, 50
	for _, perTxn := range []int{1, 64} {
		b.Run(fmt.Sprintf("txn=%d", perTxn), func(b *testing.B) {
			var elapsed time.Duration
			for range b.N {
				b.StopTimer()
				env := bbstest.StartOnWith(b, startFsyncEtcd(b), []bbs.Option{bbs.WithManualConvergence(), bbs.WithSuspectsPerTransaction(perTxn)})
				ctx := benchCtx(b)
				leases := make([]clientv3.LeaseID, cells)
				for i := range cells {
					leases[i] = domRegisterCell(b, env, &modelsv1.CellPresence{CellId: fmt.Sprintf("cell-%03d", i), RepAddress: "127.0.0.1:1", Zone: "z1",
						Capacity: &modelsv1.CellCapacity{MemoryMb: 1 << 20, DiskMb: 1 << 20, Containers: 1000}})
				}
				clients := dialBBS(b, env.Addr, benchConns)
				guids := benchGuids("loss", 0, cells*perCell/10)
				if err := desireAll(ctx, clients, guids, 10); err != nil {
					b.Fatal(err)
				}
				// Instance i runs on cell i % cells, so every LRP spreads over ten cells.
				err := parallel(cells*perCell, benchWorkers, func(w, i int) error {
					c := clients[w%len(clients)]
					guid, index := guids[i/10], int32(i%10)
					ik := &modelsv1.ActualLRPInstanceKey{InstanceGuid: fmt.Sprintf("%s-%d", guid, index), CellId: fmt.Sprintf("cell-%03d", i%cells)}
					if _, err := c.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: ik}); err != nil {
						return err
					}
					_, err := c.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: ik, NetInfo: benchNetInfo, Routable: true})
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				for i := range lost {
					if _, err := env.Etcd.Revoke(ctx, leases[i]); err != nil {
						b.Fatal(err)
					}
				}
				testkit.Eventually(b, time.Minute, func() bool {
					resp, err := env.Client.Cells(ctx, &bbsv1.CellsRequest{})
					return err == nil && len(resp.GetCells()) == cells-lost
				}, "the BBS sees the lost cells gone")

				b.StartTimer()
				start := time.Now()
				r, err := env.Service.Converger().ConvergeCells(ctx)
				elapsed += time.Since(start)
				b.StopTimer()
				if err != nil || r.Suspected != lost*perCell {
					b.Fatalf("pass: %+v, %v; want %d instances replaced", r, err, lost*perCell)
				}
			}
			b.ReportMetric(float64(b.N*lost*perCell)/elapsed.Seconds(), "instances/s")
			b.ReportMetric(elapsed.Seconds()*1000/float64(b.N), "ms/pass")
		})
	}
}
