package scale

import (
	"flag"
	"os"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/services/rep"
)

// Flags of BenchmarkScale (`make bench-scale ARGS='-cells 200 -instances 20000'`).
var (
	flagCells        = flag.Int("cells", 5000, "simulated cells")
	flagInstances    = flag.Int("instances", 250000, "instances desired in all: half as a burst, half as a stream")
	flagPerLRP       = flag.Int("per-lrp", 10, "instances per desired LRP")
	flagWriters      = flag.Int("writers", 32, "concurrent DesireLRP callers")
	flagStreamRate   = flag.Int("stream-rate", int(goalStreamRate), "offered rate of the stream phase, instances per second (the sustained goal; routing is measured at this event rate)")
	flagLoss         = flag.Float64("loss", 0.10, "fraction of cells lost at full size")
	flagSmallLoss    = flag.Float64("small-loss", 0.01, "as deployed: fraction of cells lost first, alone, before -loss (the last sim host holds them; 0: no such phase)")
	flagCellsPerHost = flag.Int("cells-per-host", 0, "cells per host: per sim host process as deployed (default 100), per shared etcd connection in process (default 10); losing a host loses all its cells")
	flagProfileDir   = flag.String("profile-dir", "", "as deployed: write each process's CPU profile of the run to DIR/NAME.cpu and its heap profile at exit to DIR/NAME.heap (DIR made if missing) and each service's final metrics to DIR/NAME.metrics (in process: use go test's -cpuprofile)")
	flagInProcess    = flag.Bool("in-process", false, "run every service and cell in this process over plaintext (for profiles, and the cost of TLS and process boundaries) instead of as deployed")
	flagHostNice     = flag.Int("host-nice", 5, "as deployed: the niceness of the sim hosts (0: the services'), which stand for cells on machines of their own")
	flagHostProcs    = flag.Int("host-procs", 1, "as deployed: each sim host's GOMAXPROCS (0: Go's default, every core), for hosts that stand for machines of their own")
	flagLeaseTTL     = flag.Duration("lease-ttl", 0, "cells' presence TTL (0: rep.LeaseTTLFor the cells, the operators' rule: 10s up to 1,666 cells, 30s at 5,000)")
	flagStartLatency = flag.Duration("start-latency", 10*time.Millisecond, "simulated container start time")
	flagPhaseTimeout = flag.Duration("phase-timeout", 15*time.Minute, "bound of each phase")
	flagCeiling      = flag.Duration("ceiling", 3*time.Second, "duration of each etcd ceiling measurement")
	flagFsync        = flag.Bool("fsync", true, "keep etcd's fsync on")
	flagHeapProfile  = flag.String("heap-profile", "", "write a heap profile at full size to this file")
	flagBBSLimit     = flag.Int("bbs-max-inflight-writes", -1, "override the BBS's max_inflight_writes (0: unbounded; -1: its default)")
	flagAuctLimit    = flag.Int("auctioneer-max-inflight", -1, "override the auctioneer's max_inflight_starts (0: unlimited; -1: its default)")
	flagAuctSample   = flag.Int("auctioneer-sample-cells", -1, "override the auctioneer's sample_cells, the fewest cells a round asks (0: every cell; -1: its default)")
	flagRouteSync    = flag.Duration("route-sync-interval", 0, "override the route-emitter's sync_interval (0: its default, 60s)")
	flagBBSMemLimit  = flag.String("bbs-memory-limit", "1792MiB", "as deployed: the BBS's GOMEMLIMIT, its soft memory limit (docs/operations.md: about 7/8 of its memory budget; the goal's budget is 2 GiB); empty: none")
	flagQuick        = flag.Bool("quick", false, "run the quick size (200 cells, 20,000 instances) instead of -cells/-instances")
)

// BenchmarkScale runs the scale harness once per iteration at the size the flags give
// (default 5,000 cells, 250,000 instances), as deployed unless -in-process, and prints the
// report. Run it with `make bench-scale`; its figures are quoted in docs/performance.md.
func BenchmarkScale(b *testing.B) {
	perHost := *flagCellsPerHost
	if perHost <= 0 {
		perHost = 100
		if *flagInProcess {
			perHost = 10
		}
	}
	cfg := runConfig{Deployed: !*flagInProcess, ProfileDir: *flagProfileDir,
		Cells: *flagCells, Instances: *flagInstances, PerLRP: *flagPerLRP, Writers: *flagWriters,
		StreamRate: *flagStreamRate, LossFraction: *flagLoss, CellsPerHost: perHost,
		HostNice: *flagHostNice, HostProcs: *flagHostProcs, LeaseTTL: *flagLeaseTTL, StartLatency: *flagStartLatency, PhaseTimeout: *flagPhaseTimeout,
		CeilingDuration: *flagCeiling, Fsync: *flagFsync, HeapProfile: *flagHeapProfile,
		BBSMaxInflightWrites: *flagBBSLimit, AuctioneerMaxInflight: *flagAuctLimit, AuctioneerSampleCells: *flagAuctSample, RouteSyncInterval: *flagRouteSync,
		BBSMemoryLimit: *flagBBSMemLimit,
	}
	if cfg.Deployed {
		cfg.SmallLossFraction = *flagSmallLoss
	}
	if *flagQuick {
		cfg.Cells, cfg.Instances = 200, 20000
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = rep.LeaseTTLFor(cfg.Cells)
	}
	for i := 0; i < b.N; i++ {
		r := run(b, cfg)
		r.print(os.Stdout)
		r.check(b)
		b.ReportMetric(r.burstRate, "burst_placements/s")
		b.ReportMetric(r.streamRate, "sustained_placements/s")
		b.ReportMetric(float64(r.listMedian)/1e6, "list_ms")
		b.ReportMetric(float64(r.routeP99)/1e6, "route_p99_ms")
		b.ReportMetric(r.loss.max.Seconds(), "cell_loss_max_s")
		if r.smallLoss.cells > 0 {
			b.ReportMetric(r.smallLoss.max.Seconds(), "small_cell_loss_max_s")
		}
		b.ReportMetric(float64(r.peakRSS)/(1<<20), "peak_rss_MiB")
	}
}

// TestScaleQuick runs the harness at a size `make test` affords on a small machine and fails
// on broken correctness only: stranded or doubly-running instances, a healthy cell that lost
// its presence, an instance never routed, a phase that never finishes. Timings are printed,
// never asserted.
func TestScaleQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("scale run (about a minute) skipped with -short")
	}
	r := run(t, runConfig{
		Cells: 50, Instances: 2000, PerLRP: 10, Writers: 16, StreamRate: 500, LossFraction: 0.10,
		CellsPerHost: 5, LeaseTTL: 3 * time.Second, StartLatency: 10 * time.Millisecond,
		PhaseTimeout: 3 * time.Minute, CeilingDuration: 500 * time.Millisecond, Fsync: false,
		// Small rounds (the stream, the lost cells' instances) ask a sample of 10 of the 50
		// cells; the burst's rounds ask every cell.
		BBSMaxInflightWrites: -1, AuctioneerMaxInflight: -1, AuctioneerSampleCells: 10,
	})
	r.print(testWriter{t})
	r.check(t)
}

// TestScaleDeployedQuick runs the harness as deployed at a small size (the built binaries,
// mutual TLS, sim hosts of five cells and fewer; a host of two lost alone, then one of five),
// so the deployed mode of `make bench-scale` is kept working; it fails on broken correctness
// only, as TestScaleQuick.
func TestScaleDeployedQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("scale run over built binaries skipped with -short")
	}
	r := run(t, runConfig{
		Deployed: true, Cells: 20, Instances: 1000, PerLRP: 10, Writers: 8, StreamRate: 250, LossFraction: 0.10, SmallLossFraction: 0.01,
		CellsPerHost: 5, HostNice: 5, HostProcs: 1, LeaseTTL: 3 * time.Second, StartLatency: 10 * time.Millisecond,
		PhaseTimeout: 3 * time.Minute, CeilingDuration: 300 * time.Millisecond, Fsync: true,
		BBSMaxInflightWrites: -1, AuctioneerMaxInflight: -1, AuctioneerSampleCells: 5,
	})
	r.print(testWriter{t})
	r.check(t)
}

// TestMain removes the binaries TestScaleDeployedQuick and BenchmarkScale built. Started
// with listerEnv set, the test binary is instead a client of its own that lists the actual
// LRPs (runLister).
func TestMain(m *testing.M) {
	if spec := os.Getenv(listerEnv); spec != "" {
		os.Exit(runLister(spec))
	}
	code := m.Run()
	testkit.RemoveBinaries()
	os.Exit(code)
}

// testWriter writes to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
