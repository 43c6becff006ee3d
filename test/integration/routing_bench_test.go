package integration

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/bbs"
)

// BenchmarkEventToRouterTable measures, through the real BBS, route-emitter and router in one
// process, the time from a StartActualLRP call until the router's own table sends requests for
// the instance's hostname to it. 3,000 instances of 100 LRPs are started at 1,000/s (bounded);
// it reports p50 and p99 over all of them.
func BenchmarkEventToRouterTable(b *testing.B) {
	const lrps, perLRP, rate = 100, 30, 1000
	c := devcluster.New(devcluster.Config{
		Dir: b.TempDir(), BBSAddress: "127.0.0.1:0", AuctioneerAddress: "127.0.0.1:0", UnsafeNoFsync: true,
		Routing: true, RouteEmitterAddress: "127.0.0.1:0", RouterHTTPAddress: "127.0.0.1:0",
		Logger:       logtest.New(b),
		ConfigureBBS: func(cfg *bbs.Config) { cfg.ConvergenceInterval = bbs.Duration(time.Hour) },
	})
	testkit.Start(b, "cluster", c)
	ctx := b.Context()

	for g := 0; g < lrps; g++ {
		d := desiredLRP(fmt.Sprintf("route-%d", g), "preloaded:cflinuxfs4", perLRP, nil)
		d.Routes = map[string][]byte{"cf-router": []byte(fmt.Sprintf(`[{"port":8080,"routes":["app-%d.bench"]}]`, g))}
		if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
			b.Fatal(err)
		}
	}
	type pending struct {
		host, addr string
		sent       time.Time
	}
	var mu sync.Mutex
	waiting := map[int]pending{}
	var latencies []time.Duration
	seen := make(chan struct{})
	go func() { // watches the router's table
		defer close(seen)
		for {
			changed := c.Router.TableChanged()
			mu.Lock()
			for id, p := range waiting {
				if slices.Contains(c.Router.Endpoints(p.host), p.addr) {
					latencies = append(latencies, time.Since(p.sent))
					delete(waiting, id)
				}
			}
			finished := len(latencies) == lrps*perLRP
			mu.Unlock()
			if finished {
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()

	b.ResetTimer()
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for i := 0; i < lrps*perLRP; i++ {
		<-tick.C
		g, index := i%lrps, int32(i/lrps)
		port := uint32(20000 + i)
		p := pending{host: fmt.Sprintf("app-%d.bench", g), addr: fmt.Sprintf("127.0.0.1:%d", port), sent: time.Now()}
		mu.Lock()
		waiting[i] = p
		mu.Unlock()
		_, err := c.BBS.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{
			ProcessGuid: fmt.Sprintf("route-%d", g), Index: index, Routable: true,
			InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: fmt.Sprintf("ig-%d", i), CellId: "bench-cell"},
			NetInfo:     &modelsv1.ActualLRPNetInfo{Address: "127.0.0.1", Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: port}}},
		})
		if err != nil {
			b.Fatalf("start %d: %v", i, err)
		}
	}
	select {
	case <-seen:
	case <-time.After(30 * time.Second):
		b.Fatalf("router saw %d of %d endpoints", len(latencies), lrps*perLRP)
	}
	b.StopTimer()
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	q := func(f float64) float64 {
		return float64(latencies[int(f*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.5), "p50_ms")
	b.ReportMetric(q(0.99), "p99_ms")
	b.ReportMetric(q(1), "max_ms")
	b.ReportMetric(rate, "events/s")
}
