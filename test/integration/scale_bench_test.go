package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/rep"
)

// BenchmarkPlacement desires 10,000 instances (1,000 LRPs × 10) on 100 simulated cells and
// measures desire → every instance RUNNING. Each iteration is one full run on the same cluster
// (the previous run's LRPs are removed first); run it with -benchtime 3x or more and quote the
// median placements/s it prints. It also splits the auctioneer's time (cell states, placement,
// Perform) and the reps' lifecycle writes to the BBS.
//
// It runs twice in one process: tracing=off (the default: no spans recorded, W3C trace context
// still crossing every hop) and tracing=on (every desire traced at 100% sampling, spans
// exported over OTLP to a receiver in the test), so the cost of tracing is their ratio.
func BenchmarkPlacement(b *testing.B) {
	b.Run("tracing=off", func(b *testing.B) { benchmarkPlacement(b) })
	b.Run("tracing=on", func(b *testing.B) {
		rcv := &otlpReceiver{}
		srv := countingServer(rcv)
		coltracepb.RegisterTraceServiceServer(srv, rcv)
		l := testkit.Listen(b)
		go func() { _ = srv.Serve(l) }()
		b.Cleanup(srv.Stop)
		shutdown, err := tracing.Start(b.Context(), "gavel", tracing.Config{OTLPEndpoint: l.Addr().String(), OTLPInsecure: true, SamplingRatio: 1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = shutdown(context.Background())
			otel.SetTracerProvider(tracenoop.NewTracerProvider())
			b.Logf("spans exported: %d (%s)", rcv.count.Load(), rcv.counts())
		})
		benchmarkPlacement(b)
	})
}

func benchmarkPlacement(b *testing.B) {
	const cells, lrps, perLRP = 100, 1000, 10
	var bbsCalls, bbsNanos atomic.Int64
	timeCalls := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.Contains(method, "/ClaimActualLRP") || strings.Contains(method, "/StartActualLRP") { // single calls or batches
			bbsCalls.Add(1)
			bbsNanos.Add(int64(time.Since(start)))
		}
		return err
	}
	var specs []devcluster.Cell
	for i := 0; i < cells; i++ {
		c := simCell(fmt.Sprintf("cell-%03d", i), fmt.Sprintf("z%d", i%3), nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)
		c.Config.Sim.StartLatency = rep.Duration(10 * time.Millisecond)
		c.Config.BulkInterval = rep.Duration(time.Hour)
		c.Config.Log.Level = "error"
		specs = append(specs, c)
	}
	c := devcluster.New(devcluster.Config{
		Dir: b.TempDir(), BBSAddress: "127.0.0.1:0", AuctioneerAddress: "127.0.0.1:0",
		UnsafeNoFsync: false, Cells: specs, Logger: logtest.New(b), RepBBSInterceptor: timeCalls,
	})
	testkit.Start(b, "cluster", c)
	ctx := b.Context()

	var rates, cpus []float64
	b.ResetTimer()
	for iter := 0; iter < b.N; iter++ {
		b.StopTimer()
		for g := 0; g < lrps && iter > 0; g++ {
			_, _ = c.BBS.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: fmt.Sprintf("scale-%d-%d", iter-1, g)})
		}
		waitRunning(b, c, "", 0, 2*time.Minute)
		before := c.Auctioneer.Stats()
		bbsCalls.Store(0)
		bbsNanos.Store(0)
		b.StartTimer()

		start, cpuStart := time.Now(), testkit.SelfCPU(b)
		refusedBefore := bbsclient.Refusals("DesireLRP", bbsclient.OutcomeRetried)
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					g := next.Add(1) - 1
					if g >= lrps {
						return
					}
					d := desiredLRP(fmt.Sprintf("scale-%d-%d", iter, g), "preloaded:cflinuxfs4", perLRP, nil)
					// A BBS that sheds load is asked again after the wait it names (by the BBS
					// connection, bbsclient.RetryOverloaded).
					if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
		desired := time.Since(start)
		waitRunning(b, c, fmt.Sprintf("scale-%d-", iter), lrps*perLRP, 5*time.Minute)
		elapsed, cpu := time.Since(start), testkit.SelfCPU(b)-cpuStart
		b.StopTimer()

		after := c.Auctioneer.Stats()
		rate := float64(lrps*perLRP) / elapsed.Seconds()
		rates = append(rates, rate)
		cpus = append(cpus, cpu.Seconds()*1e6/float64(lrps*perLRP))
		b.Logf("run %d: %d instances RUNNING in %s (%.0f placements/s); CPU %s; desires sent in %s (%d refused by the BBS's admission bound and sent again); auctioneer: cell states %s, placement %s, perform %s, report %s; rep claim+start BBS calls %d, mean %.2fms",
			iter, lrps*perLRP, elapsed.Round(time.Millisecond), rate, cpu.Round(time.Millisecond), desired.Round(time.Millisecond), bbsclient.Refusals("DesireLRP", bbsclient.OutcomeRetried)-refusedBefore,
			(after.ListCells + after.FetchStates - before.ListCells - before.FetchStates).Round(time.Millisecond),
			(after.Place - before.Place).Round(time.Millisecond),
			(after.Perform - before.Perform).Round(time.Millisecond),
			(after.Report - before.Report).Round(time.Millisecond),
			bbsCalls.Load(), float64(bbsNanos.Load())/float64(max(bbsCalls.Load(), 1))/1e6)
		b.ReportMetric((after.FetchStates+after.ListCells-before.FetchStates-before.ListCells).Seconds()*1000, "auction_states_ms")
		b.ReportMetric((after.Place-before.Place).Seconds()*1000, "auction_place_ms")
		b.ReportMetric((after.Perform-before.Perform).Seconds()*1000, "auction_perform_ms")
		b.ReportMetric(float64(bbsNanos.Load())/1e6, "rep_bbs_write_busy_ms")
		b.StartTimer()
	}
	sort.Float64s(rates)
	b.ReportMetric(rates[len(rates)/2], "median_placements/s")
	// The process's CPU time per instance placed: the whole cluster runs in this process, so
	// on a busy machine, where the rate follows the CPU share the process gets, the ratio of
	// the two arms' CPU per placement is the steadier measure of what tracing costs.
	sort.Float64s(cpus)
	b.ReportMetric(cpus[len(cpus)/2], "median_cpu_us/placement")
}

// waitRunning waits until exactly want instances whose guid starts with prefix are RUNNING
// (want 0: no instances at all).
func waitRunning(b *testing.B, c *devcluster.Cluster, prefix string, want int, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.BBS.ActualLRPs(context.Background(), &bbsv1.ActualLRPsRequest{})
		if err != nil {
			b.Fatal(err)
		}
		running, total := 0, len(resp.GetActualLrps())
		for _, a := range resp.GetActualLrps() {
			if strings.HasPrefix(a.GetKey().GetProcessGuid(), prefix) && a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				running++
			}
		}
		if (want == 0 && total == 0) || (want > 0 && running == want) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("timed out: %d/%d running, %d records", running, want, total)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
