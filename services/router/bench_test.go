package router

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

// Bounded load of BenchmarkRouterHTTP: this many keep-alive requests from this many clients.
const (
	benchRequests = 20_000
	benchClients  = 32
)

// BenchmarkRouterHTTP sends the same bounded load to a local backend directly and through the
// router, and reports both throughputs, their ratio and the latency the router adds at p50
// and p99. Run it with -benchtime 1x: each iteration is the whole load.
func BenchmarkRouterHTTP(b *testing.B) {
	body := []byte("ok")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(body)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	backendAddr := ln.Addr().String()

	fake := startFake(b, "127.0.0.1:0", "bench", httpRoute("bench.example.com", false, backendAddr))
	cfg := testConfig(fake.addr)
	cfg.BackendMaxIdleConnsPerHost = 2 * benchClients
	r := startRouter(b, cfg)
	waitSynced(b, r)

	direct := "http://" + backendAddr + "/"
	routed := httpBase(r) + "/"
	runLoad(b, direct, 1000) // warm up connections on both paths
	runLoad(b, routed, 1000)

	var d, p loadResult
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d = runLoad(b, direct, benchRequests)
		p = runLoad(b, routed, benchRequests)
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(d.rps, "direct-req/s")
	b.ReportMetric(p.rps, "router-req/s")
	b.ReportMetric(p.rps/d.rps, "throughput-ratio")
	b.ReportMetric(float64(d.p50.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(p.p50.Microseconds()), "router-p50-µs")
	b.ReportMetric(float64((p.p50 - d.p50).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((p.p99 - d.p99).Microseconds()), "added-p99-µs")
}

// loadResult is the outcome of one bounded load.
type loadResult struct {
	rps      float64
	p50, p99 time.Duration
}

// runLoad sends n GETs for bench.example.com to url from benchClients keep-alive clients and
// measures throughput and latency percentiles.
func runLoad(b *testing.B, url string, n int) loadResult {
	b.Helper()
	transport := &http.Transport{MaxIdleConnsPerHost: benchClients, MaxConnsPerHost: benchClients, DisableCompression: true}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	var next, failures atomic.Int64
	var firstErr atomic.Value
	lats := make([][]time.Duration, benchClients)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < benchClients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			own := make([]time.Duration, 0, n/benchClients+1)
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				req, err := http.NewRequest(http.MethodGet, url, nil)
				if err != nil {
					panic(err)
				}
				req.Host = "bench.example.com"
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				own = append(own, time.Since(t0))
			}
			lats[w] = own
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	if f := failures.Load(); f > 0 {
		b.Fatalf("%s: %d of %d requests failed, first: %v", url, f, n, firstErr.Load())
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	return loadResult{
		rps: float64(n) / elapsed.Seconds(),
		p50: all[len(all)*50/100],
		p99: all[len(all)*99/100],
	}
}

// benchTable is a table of size HTTP routes of 2 endpoints each.
func benchTable(size int) (*table, []string) {
	hosts := make([]string, size)
	routes := make([]*routeemitterv1.Route, size)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("app-%d.apps.example.com", i)
		routes[i] = httpRoute(hosts[i], false, "10.0.0.1:61000", "10.0.0.2:61001")
	}
	b := newBuilder(nil)
	if err := b.apply(&routeemitterv1.WatchRoutesResponse{TableId: "t", Version: 1, Snapshot: true, Upserts: routes}); err != nil {
		panic(err)
	}
	return b.result(), hosts
}

// BenchmarkTableLookup compares the hot-path read of the router (atomic.Pointer to an
// immutable table) with an RWMutex-guarded map, idle and with a writer changing one route
// every millisecond.
func BenchmarkTableLookup(b *testing.B) {
	for _, writer := range []bool{false, true} {
		name := "idle"
		if writer {
			name = "writer-1kHz"
		}
		b.Run("atomic/"+name, func(b *testing.B) {
			t, hosts := benchTable(10_000)
			var p atomic.Pointer[table]
			p.Store(t)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if writer {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tick := time.NewTicker(time.Millisecond)
					defer tick.Stop()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						case <-tick.C:
						}
						nb := newBuilder(p.Load())
						_ = nb.apply(&routeemitterv1.WatchRoutesResponse{TableId: "t", Version: uint64(i + 2),
							Upserts: []*routeemitterv1.Route{httpRoute(hosts[i%len(hosts)], false, "10.0.0.3:61000")}})
						p.Store(nb.result())
					}
				}()
			}
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if p.Load().http.get(hosts[i%len(hosts)]) == nil {
						panic("missing route")
					}
					i++
				}
			})
			close(stop)
			wg.Wait()
		})
		b.Run("rwmutex/"+name, func(b *testing.B) {
			t, hosts := benchTable(10_000)
			m := make(map[string]*route, t.http.len())
			t.http.each(func(r *route) { m[r.hostname] = r })
			var mu sync.RWMutex
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if writer {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tick := time.NewTicker(time.Millisecond)
					defer tick.Stop()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						case <-tick.C:
						}
						r, _ := convertRoute(httpRoute(hosts[i%len(hosts)], false, "10.0.0.3:61000"))
						mu.Lock()
						m[r.hostname] = r
						mu.Unlock()
					}
				}()
			}
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					mu.RLock()
					r := m[hosts[i%len(hosts)]]
					mu.RUnlock()
					if r == nil {
						panic("missing route")
					}
					i++
				}
			})
			close(stop)
			wg.Wait()
		})
	}
}

// BenchmarkTableDelta measures one single-route delta (copy-on-write of one HTTP shard and
// the shard array) at several table sizes: the price of lock-free reads.
func BenchmarkTableDelta(b *testing.B) {
	for _, size := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("routes=%d", size), func(b *testing.B) {
			t, hosts := benchTable(size)
			delta := &routeemitterv1.WatchRoutesResponse{TableId: "t", Version: 2,
				Upserts: []*routeemitterv1.Route{httpRoute(hosts[0], false, "10.0.0.3:61000")}}
			for b.Loop() {
				nb := newBuilder(t)
				if err := nb.apply(delta); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
