// Package scale is Gavel's scale harness: etcd, the BBS, the auctioneer, the route-emitter and
// many simulated cells, each service its own process over mutual TLS with the cells in sim
// hosts (as deployed) or all in one process over plaintext, driven through the public APIs as
// clients would. It desires work as a burst and as a steady stream, lists it at full size,
// loses 1% of the cells (as deployed) and then a tenth, checks that nothing is stranded or
// running twice, and prints a report next to the etcd ceiling measured in the same run.
// `make bench-scale` runs it at full size; TestScaleQuick and TestScaleDeployedQuick run small
// sizes in `make test`.
package scale

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/services/auctioneer"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/routeemitter"
)

// runConfig sizes one run.
type runConfig struct {
	// Cells is the number of simulated cells.
	Cells int
	// Instances is the number of instances desired in all; half as a burst, half as a stream.
	Instances int
	// PerLRP is the number of instances of each desired LRP.
	PerLRP int
	// Writers is the number of concurrent DesireLRP callers of the burst.
	Writers int
	// StreamRate is the offered rate of the stream phase, in instances per second.
	StreamRate int
	// LossFraction is the fraction of cells lost at full size.
	LossFraction float64
	// SmallLossFraction, as deployed, is the fraction of cells lost first, alone: the last sim
	// host holds exactly that many (at least two). Zero: no such phase.
	SmallLossFraction float64
	// CellsPerHost is how many cells share one simulated host (one presence connection);
	// losing a host loses all its cells.
	CellsPerHost int
	// HostNice, as deployed, is the niceness the sim hosts run at (0: the services'). The cells
	// stand for thousands of machines of their own; on this one they would otherwise take the
	// CPU that etcd and the services need to answer them.
	HostNice int
	// HostProcs, as deployed, is each sim host's GOMAXPROCS (0: Go's default, every core). A
	// runtime of several Ps wakes another thread to look for work whenever a goroutine becomes
	// runnable; fifty such runtimes on two cores spend the control plane's CPU on it, where a
	// cell's machine would spend its own idle cores.
	HostProcs int
	// LeaseTTL is the cells' presence TTL.
	LeaseTTL time.Duration
	// StartLatency is how long a simulated container takes to become healthy.
	StartLatency time.Duration
	// PhaseTimeout bounds each phase.
	PhaseTimeout time.Duration
	// CeilingDuration is how long each etcd ceiling figure is measured.
	CeilingDuration time.Duration
	// Fsync keeps etcd's fsync on (as a deployment would); off, etcd measures the CPU path.
	Fsync bool
	// HeapProfile, when set, is where a heap profile is written at full size.
	HeapProfile string
	// BBSMaxInflightWrites and AuctioneerMaxInflight override the BBS's admission bound and
	// the auctioneer's in-flight limit when not negative (zero turns them off).
	BBSMaxInflightWrites, AuctioneerMaxInflight int
	// AuctioneerSampleCells overrides the auctioneer's sample_cells when not negative (zero
	// asks every cell every round).
	AuctioneerSampleCells int
	// RouteSyncInterval overrides the route-emitter's full-listing interval when positive.
	RouteSyncInterval time.Duration
	// BBSMemoryLimit, as deployed, is the BBS's GOMEMLIMIT, the Go runtime's soft memory limit
	// (its syntax, e.g. "1792MiB"; empty: none): how an operator fits the BBS to a memory
	// budget (docs/operations.md).
	BBSMemoryLimit string
	// Deployed runs every service as its own process of the built binaries, over mutual TLS,
	// with the cells in sim hosts (rep -sim-cells) of CellsPerHost cells each; otherwise
	// everything runs in this process over plaintext.
	Deployed bool
	// ProfileDir, as deployed, is where each process writes a CPU profile of its run (NAME.cpu;
	// a lost sim host's is lost with it).
	ProfileDir string
}

// report is what one run measured.
type report struct {
	cfg     runConfig
	ceiling ceiling

	// startup is the time from starting the services and cells to every cell registered.
	startup time.Duration

	burstN, streamN         int
	burstDesire, burstTotal time.Duration
	burstRate, burstSteady  float64
	burstP50, burstP99      time.Duration
	streamTotal             time.Duration
	streamRate, offered     float64
	streamSteady            float64
	streamP50, streamP99    time.Duration

	listN                  int
	listMedian, listMax    time.Duration
	listRawMedian          time.Duration // the same list, its response taken undecoded
	listBytes              int           // the list's response, in bytes
	listHeap               uint64        // this process's live heap before the lists
	listOwnMedian          time.Duration // as deployed: the list from a client process of its own
	listOwnMax             time.Duration
	routeP50, routeP99     time.Duration
	routeN, routeMissing   int
	smallLoss, loss        lossResult // the first, small loss (as deployed) and the LossFraction one
	peakRSS, peakHeap      uint64
	stranded, duplicates   int
	healthyLost            []string
	healthyLostLog         map[string][]string // as deployed: what each one's sim host logged about it
	auctionStates, auction time.Duration
	auctionPerform         time.Duration
	bbsLimit               int
	auctioneerLimit        int
	auctioneerSample       int // the auctioneer's sample_cells (0: every cell)
	auctionRounds          int64
	desireRefusals         int64
	desireTransient        int64
	heapShares             []heapShare
	writes                 bbs.CommitStats
	usage                  []procUsage
	// placing is the CPU each process used while the burst and the stream placed (no start-up,
	// no loss), over placingWall; the harness (this process) is the last entry.
	placing     []procUsage
	placingWall time.Duration
	// idle is the CPU each process used over idleWall with every cell registered and nothing
	// placed yet (as deployed): what the cells and their presence cost at rest.
	idle     []procUsage
	idleWall time.Duration
	// cores is the machine's CPU count (the goals' bound: what a target needs of it).
	cores int
}

// scaleLRP is an LRP of the run: one HTTP route per LRP, so every start is a routing event.
func scaleLRP(guid string, instances int) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid,
		Domain:      "scale",
		Rootfs:      "preloaded:cflinuxfs4",
		Instances:   int32(instances),
		MemoryMb:    64,
		DiskMb:      64,
		Ports:       []uint32{8080},
		Routes:      map[string][]byte{"cf-router": []byte(fmt.Sprintf(`[{"port": 8080, "routes": ["%s.scale.test"]}]`, guid))},
		Action:      &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
	}
}

// simCells are the run's cells, in three zones, each with room for twice its share of the work.
func simCells(cfg runConfig) []devcluster.Cell {
	perCell := 2*cfg.Instances/cfg.Cells + 20
	cells := make([]devcluster.Cell, cfg.Cells)
	for i := range cells {
		rc := rep.Default()
		rc.CellID, rc.Zone = fmt.Sprintf("cell-%04d", i), fmt.Sprintf("z%d", i%3)
		rc.Backend = rep.BackendSim
		rc.PreloadedRootfses = map[string]string{"cflinuxfs4": "/rootfs"}
		rc.Capacity = rep.Capacity{MemoryMB: int32(64 * perCell), DiskMB: int32(64 * perCell), Containers: int32(perCell)}
		rc.Sim.StartLatency = rep.Duration(cfg.StartLatency)
		rc.Sim.LogInterval = 0 // no synthetic log lines, as the sim hosts run as deployed
		rc.LeaseTTL = rep.Duration(cfg.LeaseTTL)
		rc.BulkInterval = rep.Duration(time.Hour) // nothing may depend on the bulk loop
		rc.Log.Level = "error"
		cells[i] = devcluster.Cell{Config: rc}
	}
	return cells
}

// startInProcess runs the cluster of an in-process run (every service and cell in this process,
// plaintext) until the test ends, and waits until it is ready.
func startInProcess(t testing.TB, cfg runConfig, r *report, dir string) *inProcess {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// The cluster stops in a cleanup registered before its test logger, so the logger is muted
	// first: a failed run ends its output with the failure, not with the shutdown's warnings.
	// The cluster stops its reps together (one after another, 5,000 of them took 3.5 minutes).
	const stopWait = 2 * time.Minute
	started := false
	t.Cleanup(func() {
		cancel()
		if !started {
			return
		}
		stopping := time.Now()
		select {
		case <-done:
			fmt.Printf("stop: the in-process cluster of %d cells stopped in %s\n", cfg.Cells, time.Since(stopping).Round(time.Millisecond))
		case <-time.After(stopWait):
			buf := make([]byte, 64<<20)
			path := filepath.Join(os.TempDir(), "scale-stop-goroutines.txt")
			if err := os.WriteFile(path, buf[:runtime.Stack(buf, true)], 0o644); err != nil {
				path = err.Error()
			}
			t.Errorf("cluster did not stop within %s (every goroutine's stack: %s)", stopWait, path)
		}
	})
	c := devcluster.New(devcluster.Config{
		Dir: dir, BBSAddress: "127.0.0.1:0", AuctioneerAddress: "127.0.0.1:0",
		UnsafeNoFsync: !cfg.Fsync, Cells: simCells(cfg), CellsPerHost: cfg.CellsPerHost,
		Logger: logtest.New(t).Named("cluster"), Routing: true, RouteEmitterAddress: "127.0.0.1:0",
		RouterHTTPAddress: "127.0.0.1:0", RouterAdminAddress: "127.0.0.1:0",
		ConfigureBBS: func(bc *bbs.Config) {
			bc.MaxInflightWrites = overridden(cfg.BBSMaxInflightWrites, bc.MaxInflightWrites)
			r.bbsLimit = bc.MaxInflightWrites
		},
		ConfigureAuctioneer: func(ac *auctioneer.Config) {
			ac.MaxInflightStarts = overridden(cfg.AuctioneerMaxInflight, ac.MaxInflightStarts)
			ac.SampleCells = overridden(cfg.AuctioneerSampleCells, ac.SampleCells)
			r.auctioneerLimit, r.auctioneerSample = ac.MaxInflightStarts, ac.SampleCells
		},
		ConfigureRouteEmitter: func(rc *routeemitter.Config) {
			if cfg.RouteSyncInterval > 0 {
				rc.SyncInterval = routeemitter.Duration(cfg.RouteSyncInterval)
			}
		},
	})
	ready := make(chan struct{})
	started = true
	go func() { done <- c.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("cluster: %v", err)
	case <-time.After(cfg.PhaseTimeout):
		t.Fatalf("cluster not ready after %s", cfg.PhaseTimeout)
	}
	reConn := testkit.Dial(t, c.RouteEmitterAddress)
	t.Cleanup(func() { reConn.Close() })
	return &inProcess{c: c, re: routeemitterv1.NewRouteEmitterServiceClient(reConn), cells: cfg.Cells}
}

// overridden is a run's override of a service setting when it is not negative (runConfig's
// convention: -1 keeps the service's own value, def), else def.
func overridden(v, def int) int {
	if v >= 0 {
		return v
	}
	return def
}

// run runs one whole scale run and returns its report; it fails t on a broken run (an error,
// a phase that does not finish), not on slow figures.
func run(t testing.TB, cfg runConfig) *report {
	r := &report{cfg: cfg, cores: runtime.NumCPU()}
	dir := t.TempDir() // removed after the cluster has stopped: cleanups run last-registered first
	var mem memory
	memCtx, stopMem := context.WithCancel(context.Background())
	defer stopMem()
	go mem.sample(memCtx, 250*time.Millisecond)
	var (
		tg target
		ip *inProcess
	)
	began := time.Now()
	if cfg.Deployed {
		ad := auctioneer.Default()
		r.bbsLimit = overridden(cfg.BBSMaxInflightWrites, bbs.Default().MaxInflightWrites)
		r.auctioneerLimit = overridden(cfg.AuctioneerMaxInflight, ad.MaxInflightStarts)
		r.auctioneerSample = overridden(cfg.AuctioneerSampleCells, ad.SampleCells)
		tg = startDeployed(t, cfg, dir)
	} else {
		ip = startInProcess(t, cfg, r, dir)
		tg = ip
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lastProgress := began
	waitUntil(t, cfg.PhaseTimeout, "every cell registered", func() (bool, string) {
		if d, ok := tg.(*deployed); ok {
			d.alive(t, "every cell registered") // a host whose cell failed at start-up ends the wait with its output
		}
		resp, err := tg.BBS().Cells(ctx, &bbsv1.CellsRequest{})
		if err != nil {
			return false, err.Error()
		}
		if time.Since(lastProgress) >= 30*time.Second {
			lastProgress = time.Now()
			fmt.Printf("start-up: %d/%d cells registered after %s\n", len(resp.GetCells()), cfg.Cells, time.Since(began).Round(time.Second))
		}
		return len(resp.GetCells()) == cfg.Cells, fmt.Sprintf("%d/%d cells", len(resp.GetCells()), cfg.Cells)
	})
	r.startup = time.Since(began)
	if cfg.Deployed {
		// At rest: every cell registered, nothing placed yet.
		before, from := withHarness(tg.Usage()), time.Now()
		time.Sleep(idleWindow)
		r.idle, r.idleWall = usageSince(before, withHarness(tg.Usage())), time.Since(from)
	}

	var err error
	if r.ceiling, err = measureCeiling(ctx, tg.Etcd(), cfg.CeilingDuration); err != nil {
		t.Fatalf("etcd ceiling: %v", err)
	}

	obs := newObserver()
	evReady, rtReady := make(chan struct{}), make(chan struct{})
	go obs.followEvents(ctx, tg.BBS(), evReady)
	go obs.followRoutes(ctx, tg.RouteEmitter(), rtReady)
	<-evReady
	<-rtReady

	desired := map[string]time.Time{}
	var transient atomic.Int64
	var desiredMu sync.Mutex
	desire := func(guid string) error {
		desiredMu.Lock()
		desired[guid] = time.Now()
		desiredMu.Unlock()
		// As a well-behaved client: a BBS that sheds load is asked again after the wait it names
		// (by the BBS connection, bbsclient.RetryOverloaded); one that is unavailable, too slow
		// for the call's deadline or still shedding after those waits is asked again after a
		// backoff (retried), and an AlreadyExists then means an earlier try landed.
		req := &bbsv1.DesireLRPRequest{DesiredLrp: scaleLRP(guid, cfg.PerLRP)}
		calls := 0
		_, err := retried(ctx, func() (*bbsv1.DesireLRPResponse, error) {
			calls++
			return tg.BBS().DesireLRP(ctx, req)
		})
		transient.Add(int64(calls - 1))
		if status.Code(err) == codes.AlreadyExists && calls > 1 {
			return nil
		}
		return err
	}
	refusalsBefore := bbsclient.Refusals("DesireLRP", bbsclient.OutcomeRetried)
	var (
		before        auctioneer.Timings
		commitsBefore bbs.CommitStats
	)
	if ip != nil {
		before, commitsBefore = ip.c.Auctioneer.Stats(), ip.c.BBSService.CommitStats()
	}

	// Burst: half the instances, desired by cfg.Writers callers as fast as the BBS takes them.
	burstLRPs := max(1, cfg.Instances/2/cfg.PerLRP)
	r.burstN = burstLRPs * cfg.PerLRP
	usageNow := tg.Usage
	if cfg.Deployed {
		usageNow = func() []procUsage { return withHarness(tg.Usage()) }
	}
	usageBefore := usageNow()
	start := time.Now()
	placingFrom := start
	var next atomic.Int64
	g, _ := errgroup.WithContext(ctx)
	for w := 0; w < cfg.Writers; w++ {
		g.Go(func() error {
			for i := next.Add(1) - 1; i < int64(burstLRPs); i = next.Add(1) - 1 {
				if err := desire(fmt.Sprintf("burst-%06d", i)); err != nil {
					return fmt.Errorf("desire burst-%06d: %w", i, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	r.burstDesire = time.Since(start)
	waitRunning(t, obs, "burst-", r.burstN, cfg.PhaseTimeout)
	lat, last, steady := obs.placements("burst-", desired)
	r.burstSteady = steady
	r.burstTotal = last.Sub(start)
	r.burstRate = float64(r.burstN) / r.burstTotal.Seconds()
	r.burstP50, r.burstP99 = percentile(lat, 50), percentile(lat, 99)

	// Stream: the other half at a steady offered rate, one LRP at a time.
	streamLRPs := max(1, (cfg.Instances-r.burstN)/cfg.PerLRP)
	r.streamN = streamLRPs * cfg.PerLRP
	every := time.Duration(float64(time.Second) * float64(cfg.PerLRP) / float64(cfg.StreamRate))
	start = time.Now()
	sem := make(chan struct{}, cfg.Writers)
	g, _ = errgroup.WithContext(ctx)
	for i := 0; i < streamLRPs; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * every)); wait > 0 {
			time.Sleep(wait)
		}
		sem <- struct{}{}
		g.Go(func() error {
			defer func() { <-sem }()
			if err := desire(fmt.Sprintf("stream-%06d", i)); err != nil {
				return fmt.Errorf("desire stream-%06d: %w", i, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	r.offered = float64(r.streamN) / time.Since(start).Seconds()
	waitRunning(t, obs, "stream-", r.streamN, cfg.PhaseTimeout)
	lat, last, r.streamSteady = obs.placements("stream-", desired)
	r.streamTotal = last.Sub(start)
	r.streamRate = float64(r.streamN) / r.streamTotal.Seconds()
	r.streamP50, r.streamP99 = percentile(lat, 50), percentile(lat, 99)
	r.placing, r.placingWall = usageSince(usageBefore, usageNow()), time.Since(placingFrom)
	r.desireRefusals, r.desireTransient = bbsclient.Refusals("DesireLRP", bbsclient.OutcomeRetried)-refusalsBefore, transient.Load()
	if ip != nil { // what only the services' own objects tell
		after := ip.c.Auctioneer.Stats()
		r.auctionStates = after.ListCells + after.FetchStates - before.ListCells - before.FetchStates
		r.auction = after.Place - before.Place
		r.auctionPerform = after.Perform - before.Perform
		r.auctionRounds = ip.c.Auctioneer.Rounds()
		r.writes = ip.c.BBSService.CommitStats().Sub(commitsBefore)
	}

	// Routing: every container that ran during the stream must reach the table.
	waitUntil(t, cfg.PhaseTimeout, "every streamed instance routed", func() (bool, string) {
		rs, missing := obs.routeTimes(start, last.Add(time.Nanosecond))
		return missing == 0, fmt.Sprintf("%d routed, %d missing", len(rs), missing)
	})
	rs, missing := obs.routeTimes(start, last.Add(time.Nanosecond))
	lat = latencies(rs)
	r.routeN, r.routeMissing = len(lat), missing
	r.routeP50, r.routeP99 = percentile(lat, 50), percentile(lat, 99)
	if cfg.ProfileDir != "" {
		if err := writeRouteTimeline(filepath.Join(cfg.ProfileDir, "routes.tsv"), rs); err != nil {
			t.Logf("route timeline: %v", err)
		}
	}

	// Reads at full size: five lists, each followed by one whose response is taken undecoded,
	// which splits a list's time between the BBS and the wire and the client's decoding.
	var lists, raw []time.Duration
	var heap runtime.MemStats
	runtime.ReadMemStats(&heap)
	r.listHeap = heap.HeapAlloc
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		resp, err := tg.BBS().ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{}, grpc.MaxCallRecvMsgSize(1<<30))
		if err != nil {
			t.Fatalf("ActualLRPs at full size: %v", err)
		}
		lists = append(lists, time.Since(t0))
		r.listN = len(resp.GetActualLrps())
		t0 = time.Now()
		if _, err := tg.BBS().ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{}, grpc.MaxCallRecvMsgSize(1<<30), grpc.ForceCodec(undecoded{&r.listBytes})); err != nil {
			t.Fatalf("ActualLRPs at full size, undecoded: %v", err)
		}
		raw = append(raw, time.Since(t0))
	}
	r.listMedian, r.listMax = percentile(lists, 50), percentile(lists, 100)
	r.listRawMedian = percentile(raw, 50)
	if d, ok := tg.(*deployed); ok {
		// The same list from a client process of its own, as an operator's tool lists: it
		// decodes into a heap of its own, where this process's holds the observer's records
		// of every instance (the report gives that heap beside both figures).
		own, n, err := d.listFromOwnProcess(ctx, 5)
		if err != nil {
			t.Fatalf("ActualLRPs at full size from a client process: %v", err)
		}
		if n != r.listN {
			t.Fatalf("a client process listed %d instances, this process %d", n, r.listN)
		}
		r.listOwnMedian, r.listOwnMax = percentile(own, 50), percentile(own, 100)
	}
	if ip != nil {
		r.heapShares = heapByOwner()
	}
	if cfg.HeapProfile != "" {
		if err := writeHeapProfile(cfg.HeapProfile); err != nil {
			t.Fatal(err)
		}
	}

	// Cell loss. As deployed with SmallLossFraction, the last sim host holds that fraction of
	// the cells and is lost first, alone (the 1% goal); then whole hosts from the end are cut
	// until LossFraction of the cells are newly gone (the 10% goal). Their leases expire and
	// every instance they held must run elsewhere.
	lost := map[string]bool{}
	nextHost := tg.Hosts() - 1
	if cfg.Deployed && smallLossCells(cfg) > 0 {
		r.smallLoss = loseHosts(t, ctx, cfg, tg, obs, lost, &nextHost, 1)
	}
	r.loss = loseHosts(t, ctx, cfg, tg, obs, lost, &nextHost, cfg.LossFraction*float64(cfg.Cells))
	for id := range obs.disappearedCells() {
		if !lost[id] {
			r.healthyLost = append(r.healthyLost, id)
		}
	}
	sort.Strings(r.healthyLost)
	if d, ok := tg.(*deployed); ok && len(r.healthyLost) > 0 {
		r.healthyLostLog = d.cellLogs(r.healthyLost, 20)
	}

	// Correctness at full size.
	r.stranded, r.duplicates = audit(t, ctx, tg, lost, r.burstN+r.streamN)
	r.peakRSS, r.peakHeap = peakRSS(), mem.peak()
	r.usage = tg.Usage()
	if d, ok := tg.(*deployed); ok {
		d.saveRunFiles() // with -profile-dir, the services' counters and output at the end of the run
	}
	if err := obs.err(); err != nil {
		t.Fatalf("observer: %v", err)
	}
	return r
}

// undecoded is a gRPC codec that takes a response's bytes without decoding them (it records
// their number in *size): the list timed with it is the BBS and the wire without the client.
type undecoded struct{ size *int }

// Name implements encoding.Codec: it stands in for the proto codec it replaces.
func (undecoded) Name() string { return "proto" }

// Marshal implements encoding.Codec for the request, as the proto codec does.
func (undecoded) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

// Unmarshal implements encoding.Codec: it records the response's size and leaves it undecoded.
func (u undecoded) Unmarshal(data []byte, _ any) error {
	*u.size = len(data)
	return nil
}

// lossResult is what one cell-loss phase measured.
type lossResult struct {
	cells, slots int
	fromExpiry   time.Duration       // from the first expiry seen to every instance running elsewhere
	p50, max     time.Duration       // per instance, from its own cell's disappearance
	steps        [3][2]time.Duration // p50 and max of: → UNCLAIMED, → CLAIMED, → RUNNING
	movedTwice   int                 // lost instances re-placed onto another lost cell first
}

// loseHosts cuts whole hosts from *next downwards until at least want cells are newly lost,
// adds them to lost, and waits until each has disappeared and every instance it held runs
// elsewhere.
func loseHosts(t testing.TB, ctx context.Context, cfg runConfig, tg target, obs *observer, lost map[string]bool, next *int, want float64) lossResult {
	t.Helper()
	phase := map[string]bool{}
	for ; *next >= 0 && float64(len(phase)) < want; *next-- {
		for _, id := range tg.HostCells(*next) {
			phase[id], lost[id] = true, true
		}
		tg.LoseHost(t, *next)
	}
	slots := obs.slotsOn(phase)
	res := lossResult{cells: len(phase), slots: len(slots)}
	start := time.Now()
	waitUntil(t, cfg.PhaseTimeout+2*cfg.LeaseTTL, "every lost cell disappeared and its instances run elsewhere", func() (bool, string) {
		gone := 0
		for id := range obs.disappearedCells() {
			if phase[id] {
				gone++
			}
		}
		left := obs.notMoved(slots, lost)
		state := fmt.Sprintf("%d/%d cells disappeared, %d/%d instances not yet running elsewhere", gone, len(phase), len(left), len(slots))
		if len(left) > 0 && time.Since(start) > cfg.PhaseTimeout {
			// About to time out: what the BBS holds for the first few, against what the
			// observer saw on the event stream.
			state += "; the BBS has " + describeSlots(ctx, tg.BBS(), left[:min(len(left), 5)])
		}
		return len(left) == 0 && gone == len(phase), state
	})
	recovered := time.Now()
	var firstExpiry time.Time
	for id, at := range obs.disappearedCells() {
		if phase[id] && (firstExpiry.IsZero() || at.Before(firstExpiry)) {
			firstExpiry = at
		}
	}
	res.fromExpiry = recovered.Sub(firstExpiry)
	rec, steps := obs.recoverySteps(slots, slots)
	res.movedTwice = obs.movedTwice(slots, lost)
	res.p50, res.max = percentile(rec, 50), percentile(rec, 100)
	for i, st := range steps {
		res.steps[i] = [2]time.Duration{percentile(st, 50), percentile(st, 100)}
	}
	return res
}

// smallLossCells is how many cells the first, small loss cuts as deployed (the last sim host
// holds exactly these): SmallLossFraction of the cells, at least two (a sim host's least), or
// 0 when there is no such phase.
func smallLossCells(cfg runConfig) int {
	if cfg.SmallLossFraction <= 0 {
		return 0
	}
	n := max(2, int(math.Ceil(cfg.SmallLossFraction*float64(cfg.Cells))))
	if n >= cfg.Cells {
		return 0
	}
	return n
}

// audit lists every instance and asks every live cell what it holds: stranded are desired
// slots without a RUNNING ordinary instance; duplicates are slots held by more than one
// container on live cells.
func audit(t testing.TB, ctx context.Context, tg target, lost map[string]bool, want int) (stranded, duplicates int) {
	resp, err := retried(ctx, func() (*bbsv1.ActualLRPsResponse, error) {
		return tg.BBS().ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{}, grpc.MaxCallRecvMsgSize(1<<30))
	})
	if err != nil {
		t.Fatalf("audit: list: %v", err)
	}
	running := 0
	for _, a := range resp.GetActualLrps() {
		if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY && a.GetState() == modelsv1.ActualLRP_STATE_RUNNING &&
			!lost[a.GetInstanceKey().GetCellId()] {
			running++
		}
	}
	stranded = want - running
	cells, err := retried(ctx, func() (*bbsv1.CellsResponse, error) { return tg.BBS().Cells(ctx, &bbsv1.CellsRequest{}) })
	if err != nil {
		t.Fatalf("audit: cells: %v", err)
	}
	var mu sync.Mutex
	holders := map[string][]string{} // slot → the cells holding a container for it
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, cell := range cells.GetCells() {
		g.Go(func() error {
			conn, err := tg.DialRep(cell.GetRepAddress())
			if err != nil {
				return err
			}
			defer conn.Close()
			st, err := retried(gctx, func() (*repv1.StateResponse, error) {
				return repv1.NewRepServiceClient(conn).State(gctx, &repv1.StateRequest{})
			})
			if err != nil {
				return fmt.Errorf("state of %s: %w", cell.GetCellId(), err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, l := range st.GetLrps() {
				holders[slot(l.GetKey())] = append(holders[slot(l.GetKey())], cell.GetCellId())
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("audit: %v", err)
	}
	records := map[string]*modelsv1.ActualLRP{}
	for _, a := range resp.GetActualLrps() {
		if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
			records[slot(a.GetKey())] = a
		}
	}
	for s, cells := range holders {
		if len(cells) > 1 {
			// The first few, with the record, say which side kept a container it should not.
			if duplicates++; duplicates <= 5 {
				a := records[s]
				t.Logf("audit: %s held on cells %v; its record is %s on %s (instance %s)", s, cells, a.GetState(),
					a.GetInstanceKey().GetCellId(), a.GetInstanceKey().GetInstanceGuid())
			}
		}
	}
	return stranded, duplicates
}

// transientTries bounds the calls retried makes; transientPolicy is the wait between them.
const transientTries = 11

var transientPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: time.Second}

// retried calls f, as a well-behaved client, until it succeeds or fails other than because the
// server was unavailable, too slow for the call's deadline or still shedding load after the
// waits the BBS connection made, at most transientTries times.
func retried[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var v T
	err := retry.Do(ctx, transientPolicy, transientTries, func() error {
		var err error
		v, err = f()
		if c := status.Code(err); err != nil && c != codes.Unavailable && c != codes.DeadlineExceeded && c != codes.ResourceExhausted {
			return retry.Permanent(err)
		}
		return err
	}, nil)
	return v, err
}

// waitRunning waits until want slots whose guid starts with prefix are RUNNING.
func waitRunning(t testing.TB, obs *observer, prefix string, want int, timeout time.Duration) {
	t.Helper()
	waitUntil(t, timeout, fmt.Sprintf("%d %s instances running", want, prefix), func() (bool, string) {
		if err := obs.err(); err != nil {
			t.Fatalf("observer: %v", err)
		}
		n := obs.runningWith(prefix)
		return n == want, fmt.Sprintf("%d/%d running", n, want)
	})
}

// waitUntil polls cond every 100ms until it holds or timeout passes.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// print writes the report.
func (r *report) print(w io.Writer) {
	ratio := func(v, of float64) string {
		if of == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.1f%%", 100*v/of)
	}
	var b strings.Builder
	mode := "in process, plaintext (every service and cell in this process)"
	if r.cfg.Deployed {
		mode = fmt.Sprintf("as deployed: each service its own process, mutual TLS on every hop, cells in sim hosts of %d at nice %d", max(r.cfg.CellsPerHost, 2), r.cfg.HostNice)
		if r.cfg.HostProcs > 0 {
			mode += fmt.Sprintf(" with GOMAXPROCS %d", r.cfg.HostProcs)
		}
	}
	sample := "every cell"
	if r.auctioneerSample > 0 {
		sample = fmt.Sprintf("a sample of at least %d cells", r.auctioneerSample)
	}
	memLimit := "none"
	if r.cfg.Deployed && r.cfg.BBSMemoryLimit != "" {
		memLimit = r.cfg.BBSMemoryLimit
	}
	fmt.Fprintf(&b, "gavel scale report: %d cells, %d instances (%d per LRP), %s; fsync %v, bbs max in-flight writes %d, auctioneer max in-flight starts %d, a round asks %s; presence lease TTL %s (%.0f renewals/s); BBS GOMEMLIMIT %s\n",
		r.cfg.Cells, r.burstN+r.streamN, r.cfg.PerLRP, mode, r.cfg.Fsync || r.cfg.Deployed, r.bbsLimit, r.auctioneerLimit, sample,
		r.cfg.LeaseTTL, rep.RenewalsPerSecond(r.cfg.Cells, r.cfg.LeaseTTL), memLimit)
	if r.cfg.Deployed {
		fmt.Fprintf(&b, "  start-up: %d cells registered %s after the services were started (sim hosts started as earlier ones registered, at most %d registering at once)\n",
			r.cfg.Cells, r.startup.Round(100*time.Millisecond), hostsStartingAtOnce)
	} else {
		fmt.Fprintf(&b, "  start-up: %d cells registered %s after the services and cells were started\n", r.cfg.Cells, r.startup.Round(100*time.Millisecond))
	}
	fmt.Fprintf(&b, "  etcd ceiling (same run):  %.0f single-key txn/s, %.0f keys/s in 64-key txns\n", r.ceiling.TxnPerSec, r.ceiling.KeysPerSec)
	fmt.Fprintf(&b, "  burst:    %d instances by %d writers: desired in %s, all RUNNING in %s = %.0f placements/s (%s of single-key txn/s), %.0f/s over the middle 80%%; per instance p50 %s p99 %s\n",
		r.burstN, r.cfg.Writers, r.burstDesire.Round(time.Millisecond), r.burstTotal.Round(time.Millisecond), r.burstRate, ratio(r.burstRate, r.ceiling.TxnPerSec), r.burstSteady, ms(r.burstP50), ms(r.burstP99))
	fmt.Fprintf(&b, "  stream:   %d instances offered at %.0f/s: all RUNNING in %s = %.0f placements/s sustained (%s of single-key txn/s), %.0f/s over the middle 80%%; per instance p50 %s p99 %s\n",
		r.streamN, r.offered, r.streamTotal.Round(time.Millisecond), r.streamRate, ratio(r.streamRate, r.ceiling.TxnPerSec), r.streamSteady, ms(r.streamP50), ms(r.streamP99))
	fmt.Fprintf(&b, "  intake:   %d DesireLRP calls refused by the BBS's admission bound and sent again by the BBS connection after the wait it named; %d retried after Unavailable, DeadlineExceeded or a refusal that outlasted those waits\n", r.desireRefusals, r.desireTransient)
	if r.cfg.Deployed {
		fmt.Fprintf(&b, "  auction, writes, heap: measured in process only (run with -in-process)\n")
	} else {
		r.printInProcess(&b)
	}
	fmt.Fprintf(&b, "  list:     ActualLRPs of %d instances: median %s, max %s (5 calls); the same %.1f MB taken undecoded (the BBS and the wire): median %s, so the client's decoding is about %s\n",
		r.listN, ms(r.listMedian), ms(r.listMax), float64(r.listBytes)/1e6, ms(r.listRawMedian), ms(max(r.listMedian-r.listRawMedian, 0)))
	if r.listOwnMedian > 0 {
		fmt.Fprintf(&b, "            the same list from a client process of its own: median %s, max %s (5 calls); this process's heap held %.0f MB before its lists\n",
			ms(r.listOwnMedian), ms(r.listOwnMax), float64(r.listHeap)/1e6)
	}
	fmt.Fprintf(&b, "  routing:  event → route table during the stream: p50 %s p99 %s (%d routed, %d missing)\n", ms(r.routeP50), ms(r.routeP99), r.routeN, r.routeMissing)
	if r.smallLoss.cells > 0 {
		r.smallLoss.print(&b, fmt.Sprintf("loss %s:", share(r.smallLoss.cells, r.cfg.Cells)), r.burstRate, goalSmallLoss)
	}
	r.loss.print(&b, fmt.Sprintf("loss %s:", share(r.loss.cells, r.cfg.Cells)), r.burstRate, goalLoss)
	if r.cfg.Deployed {
		fmt.Fprintf(&b, "  harness:  peak RSS %.0f MiB (this process: the clients, the observer and the report)\n", float64(r.peakRSS)/(1<<20))
	} else {
		fmt.Fprintf(&b, "  memory:   peak RSS %.0f MiB, peak heap objects %.0f MiB (live and not yet swept; whole process: etcd, services, cells, harness)\n", float64(r.peakRSS)/(1<<20), float64(r.peakHeap)/(1<<20))
		fmt.Fprintf(&b, "  heap:     live at full size, after a GC, by allocating service: %s\n", formatShares(r.heapShares))
	}
	for _, u := range r.usage {
		fmt.Fprintf(&b, "  process:  %-40s CPU %8.1fs, peak RSS %6.0f MiB", u.name, u.cpu.Seconds(), float64(u.peakRSS)/(1<<20))
		if u.n > 1 {
			fmt.Fprintf(&b, " (%d processes: CPU summed, the largest peak; %d cells, %.1f MiB per hosted cell)", u.n, u.cells, float64(u.peakRSS)/(1<<20)/float64(max(u.cells/u.n, 1)))
		}
		b.WriteString("\n")
	}
	if len(r.idle) > 0 {
		fmt.Fprintf(&b, "  at rest:  CPU with every cell registered and nothing placed, %s:", r.idleWall.Round(100*time.Millisecond))
		writeUsage(&b, r.idle, r.idleWall, r.cores)
	}
	if len(r.placing) > 0 {
		fmt.Fprintf(&b, "  placing:  CPU while the burst and the stream placed, %s:", r.placingWall.Round(100*time.Millisecond))
		writeUsage(&b, r.placing, r.placingWall, r.cores)
	}
	fmt.Fprintf(&b, "  correct:  %d stranded, %d indexes running twice, %d healthy cells lost %v\n", r.stranded, r.duplicates, len(r.healthyLost), r.healthyLost)
	for _, id := range r.healthyLost {
		if lines, ok := r.healthyLostLog[id]; ok {
			fmt.Fprintf(&b, "    %s: its sim host's log about it (%d lines, the last 20 at most):\n", id, len(lines))
			for _, l := range lines {
				fmt.Fprintf(&b, "      %s\n", l)
			}
		}
	}
	r.printGoals(&b)
	_, _ = io.WriteString(w, b.String())
}

// idleWindow is how long the report measures the processes' CPU at rest.
const idleWindow = 5 * time.Second

// writeUsage writes each process's CPU over wall, as seconds and as a share of one core, and
// the share of the machine's cores they add up to.
func writeUsage(b *strings.Builder, us []procUsage, wall time.Duration, cores int) {
	for i, u := range us {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(b, " %s %.1fs (%.0f%% of a core)", u.name, u.cpu.Seconds(), 100*u.cpu.Seconds()/wall.Seconds())
	}
	fmt.Fprintf(b, "; %.0f%% of the machine's %d cores\n", 100*busy(us, wall, cores), cores)
}

// ms formats d in milliseconds, to a tenth, for the report.
func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

// share is n of all as a percentage, rounded to a tenth.
func share(n, all int) string {
	return strconv.FormatFloat(math.Round(1000*float64(n)/float64(max(all, 1)))/10, 'f', -1, 64) + "%"
}

// print writes one loss phase's lines under label; goal is the phase's goal, for the
// bound line (the placement rate recovering within it takes).
func (l lossResult) print(b *strings.Builder, label string, burstRate float64, goal time.Duration) {
	fmt.Fprintf(b, "  %-9s %d cells lost (lease expiry), %d instances: each RUNNING elsewhere p50 %s, max %s after its cell's expiry was seen; all %s after the first expiry\n",
		label, l.cells, l.slots, ms(l.p50), ms(l.max), l.fromExpiry.Round(time.Millisecond))
	fmt.Fprintf(b, "            steps (p50 / max): expiry → UNCLAIMED %s / %s, → CLAIMED %s / %s, → RUNNING %s / %s (of the last move); %d re-placed first onto another lost cell whose lease had not expired yet\n",
		ms(l.steps[0][0]), ms(l.steps[0][1]), ms(l.steps[1][0]), ms(l.steps[1][1]), ms(l.steps[2][0]), ms(l.steps[2][1]), l.movedTwice)
	if burstRate > 0 && l.slots > 0 {
		fmt.Fprintf(b, "            bound: placing %d instances at this run's burst rate (%.0f/s) takes %.1fs; within %.0f s needs %.0f/s\n",
			l.slots, burstRate, float64(l.slots)/burstRate, goal.Seconds(), l.neededRate(goal))
	}
}

// printInProcess writes what only an in-process run measures: the auctioneer's and the BBS
// committer's own counters.
func (r *report) printInProcess(b *strings.Builder) {
	fmt.Fprintf(b, "  auction:  %d rounds; cell states %s, placement %s, perform %s (summed over rounds)\n", r.auctionRounds, r.auctionStates.Round(time.Millisecond), r.auction.Round(time.Millisecond), r.auctionPerform.Round(time.Millisecond))
	fmt.Fprintf(b, "  writes:   %d change requests in %d etcd transactions during burst and stream: %.1f per transaction; %d transactions carried several; %d requests lost a compare in one, %d re-sent together after another's, %d re-sent alone\n",
		r.writes.Requests, r.writes.Transactions, r.writes.RequestsPerTransaction(), r.writes.Batched, r.writes.Conflicts, r.writes.Resent, r.writes.RetriedAlone)
}

// check fails t on what must hold at any size and load: nothing stranded or running twice,
// no healthy cell lost, every streamed instance routed.
func (r *report) check(t testing.TB) {
	t.Helper()
	if r.stranded != 0 {
		t.Errorf("%d instances stranded (not RUNNING on a live cell)", r.stranded)
	}
	if r.duplicates != 0 {
		t.Errorf("%d instance indexes held by more than one container", r.duplicates)
	}
	if len(r.healthyLost) != 0 {
		t.Errorf("healthy cells lost their presence: %v", r.healthyLost)
	}
	if r.routeMissing != 0 {
		t.Errorf("%d running instances never reached the routing table", r.routeMissing)
	}
	if r.listN < r.burstN+r.streamN {
		t.Errorf("ActualLRPs at full size listed %d of %d instances", r.listN, r.burstN+r.streamN)
	}
}

// describeSlots says what the BBS holds for each slot ("guid/index"): its records' states,
// cells and placement errors.
func describeSlots(ctx context.Context, bbs bbsv1.BBSServiceClient, slots []string) string {
	var parts []string
	for _, sl := range slots {
		guid, idx, _ := strings.Cut(sl, "/")
		i, _ := strconv.Atoi(idx)
		index := int32(i)
		resp, err := bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}, Index: &index})
		if err != nil {
			parts = append(parts, sl+": "+err.Error())
			continue
		}
		for _, a := range resp.GetActualLrps() {
			parts = append(parts, fmt.Sprintf("%s: %s %s on %q since %s (placement error %q)", sl, a.GetPresence(), a.GetState(),
				a.GetInstanceKey().GetCellId(), a.GetSince().AsTime().Format(time.TimeOnly), a.GetPlacementError().GetMessage()))
		}
		if len(resp.GetActualLrps()) == 0 {
			parts = append(parts, sl+": no record")
		}
	}
	return strings.Join(parts, "; ")
}
