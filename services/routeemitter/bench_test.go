package routeemitter_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

const (
	// benchLRPs × benchInstances instances are started per round, one StartActualLRP each.
	benchLRPs      = 100
	benchInstances = 30
	benchEvents    = benchLRPs * benchInstances
	// benchRate is the offered load in starts per second.
	benchRate = 1000
	// benchSenders bounds the StartActualLRP calls in flight.
	benchSenders = 32
)

// BenchmarkEventToTable measures the latency from a StartActualLRP call to the BBS until the
// delta routing that instance reaches a WatchRoutes client of the route-emitter, at a bounded
// load of 1,000 starts per second (3,000 per round, across 100 LRPs of 30 instances each). It
// reports the p50 and p99 latencies in milliseconds. Run it with -benchtime=1x for one round.
func BenchmarkEventToTable(b *testing.B) {
	env := bbstest.Start(b)
	e := startEmitter(b, env.Addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	table(b, e)
	stream, err := e.client.WatchRoutes(ctx, &routeemitterv1.WatchRoutesRequest{})
	if err != nil {
		b.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || !m.GetSnapshot() {
		b.Fatalf("first watch message %v, %v", m, err)
	}

	var latencies []time.Duration
	for round := 0; b.Loop(); round++ {
		guids := make([]string, benchLRPs)
		for i := range guids {
			guids[i] = fmt.Sprintf("bench-%d-%d", round, i)
			desire(b, env.Client, lrp(guids[i], benchInstances, []uint32{8080},
				cfRouter(fmt.Sprintf(`[{"port": 8080, "routes": ["%s.bench.com"]}]`, guids[i]))))
		}
		hostToLRP := make(map[string]int, benchLRPs)
		for i, g := range guids {
			hostToLRP[g+".bench.com"] = i
		}
		sent := make([]atomic.Int64, benchEvents) // unix nanos of each call, event = lrp*instances+index
		got := make([]time.Duration, 0, benchEvents)
		recvDone := make(chan error, 1)
		go func() {
			seen := make([]bool, benchEvents)
			for len(got) < benchEvents {
				m, err := stream.Recv()
				if err != nil {
					recvDone <- err
					return
				}
				now := time.Now()
				for _, r := range m.GetUpserts() {
					l, ok := hostToLRP[r.GetHostname()]
					if !ok {
						continue
					}
					for _, ep := range r.GetEndpoints() {
						ev := l*benchInstances + int(ep.GetIndex())
						if !seen[ev] {
							seen[ev] = true
							got = append(got, now.Sub(time.Unix(0, sent[ev].Load())))
						}
					}
				}
			}
			recvDone <- nil
		}()

		jobs := make(chan int, benchEvents)
		var wg sync.WaitGroup
		var sendErr atomic.Value
		for range benchSenders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ev := range jobs {
					l, index := ev/benchInstances, int32(ev%benchInstances)
					inst := fmt.Sprintf("%s-%d", guids[l], index)
					sent[ev].Store(time.Now().UnixNano())
					if _, err := env.Client.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: guids[l], Index: index,
						InstanceKey: instanceKey(inst), NetInfo: netInfo(8080, uint32(20000+ev)), Routable: true}); err != nil {
						sendErr.Store(err)
					}
				}
			}()
		}
		start := time.Now()
		for ev := range benchEvents {
			time.Sleep(time.Until(start.Add(time.Duration(ev) * time.Second / benchRate)))
			jobs <- ev
		}
		close(jobs)
		wg.Wait()
		if err, _ := sendErr.Load().(error); err != nil {
			b.Fatalf("StartActualLRP: %v", err)
		}
		select {
		case err := <-recvDone:
			if err != nil {
				b.Fatalf("watch: %v", err)
			}
		case <-time.After(60 * time.Second):
			b.Fatalf("not all %d starts reached the watcher within 60s", benchEvents)
		}
		latencies = append(latencies, got...)
		b.ReportMetric(float64(benchEvents)/time.Since(start).Seconds(), "events/s")
	}
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
}
