package e2e

// Fault tests over the built binaries: a rep drained with SIGTERM, an auctioneer and a BBS
// killed while work streams in, a rep killed with its instances. The cells use the sim backend
// (containers without processes), so the tests exercise scheduling, evacuation, leader
// failover and convergence rather than the executor.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
)

// haProc is a process a fault test signals or kills. When the test ends it gets SIGINT (a rep
// stops at once on SIGINT), then SIGKILL after 15s.
type haProc = testkit.Proc

func startHAProc(t *testing.T, name, bin string, args ...string) *haProc {
	t.Helper()
	return testkit.StartProcWait(t, 15*time.Second, name, bin, args...)
}

// haOptions shape an HA cluster.
type haOptions struct {
	bbs, auctioneers, reps int
	// leaseTTL is the reps' presence lease (default 2s).
	leaseTTL time.Duration
	// memoryMB and containers are each rep's capacity (defaults 4096 and 100).
	memoryMB, containers int
}

// haCluster is several BBS, auctioneers and sim reps from the built binaries over one embedded
// etcd; every client is given every BBS address.
type haCluster struct {
	bbsAddrs, auctioneerAddrs []string
	bbsProcs, auctioneerProcs []*haProc
	reps                      map[string]*haProc // by cell id
	bbs                       bbsv1.BBSServiceClient
	auctioneerConns           []grpc.ClientConnInterface
	etcd                      *clientv3.Client
}

func startHACluster(t *testing.T, o haOptions) *haCluster {
	t.Helper()
	if o.leaseTTL == 0 {
		o.leaseTTL = 2 * time.Second
	}
	if o.memoryMB == 0 {
		o.memoryMB = 4096
	}
	if o.containers == 0 {
		o.containers = 100
	}
	bbsBin, auctioneerBin, repBin := binary(t, "bbs"), binary(t, "auctioneer"), binary(t, "rep")
	emb, etcdClient := etcdtest.Start(t)
	etcd := strings.Join(emb.Endpoints(), ",")
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "cflinuxfs4")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}

	c := &haCluster{reps: map[string]*haProc{}, etcd: etcdClient}
	for range o.bbs {
		c.bbsAddrs = append(c.bbsAddrs, testkit.ReservedAddr(t))
	}
	for range o.auctioneers {
		c.auctioneerAddrs = append(c.auctioneerAddrs, testkit.ReservedAddr(t))
	}
	bbsList, auctioneerList := strings.Join(c.bbsAddrs, ","), strings.Join(c.auctioneerAddrs, ",")
	for i, addr := range c.bbsAddrs {
		c.bbsProcs = append(c.bbsProcs, startHAProc(t, fmt.Sprintf("bbs-%d", i), bbsBin,
			"-listen", addr, "-insecure", "-etcd-endpoints", etcd, "-etcd-insecure",
			"-auctioneer-address", auctioneerList,
			"-convergence-interval", "1s", "-unclaimed-timeout", "2s"))
	}
	for i, addr := range c.auctioneerAddrs {
		c.auctioneerProcs = append(c.auctioneerProcs, startHAProc(t, fmt.Sprintf("auctioneer-%d", i), auctioneerBin,
			"-listen", addr, "-insecure", "-bbs-address", bbsList, "-bbs-insecure", "-rep-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-batch-interval", "20ms", "-lock-ttl", "2s"))
	}
	for i := range o.reps {
		id := fmt.Sprintf("cell-%d", i)
		base := 30000 + os.Getpid()%40*600 + 100*i
		c.reps[id] = startHAProc(t, "rep "+id, repBin,
			"--cell-id", id, "--zone", fmt.Sprintf("z%d", i%3),
			"--preloaded-rootfses", fmt.Sprintf(`{"cflinuxfs4":%q}`, rootfs),
			"--backend", "sim", "--sim-start-latency", "100ms",
			"--memory-mb", fmt.Sprint(o.memoryMB), "--disk-mb", "65536", "--containers", fmt.Sprint(o.containers),
			"--listen", testkit.ReservedAddr(t), "--insecure", "--bbs-address", bbsList, "--bbs-insecure",
			"--etcd-endpoints", etcd, "--etcd-insecure", "--lease-ttl", o.leaseTTL.String(),
			"--port-range", fmt.Sprintf("%d-%d", base, base+99), "--work-dir", filepath.Join(dir, id),
			"--bulk-interval", "2s", "--evacuation-timeout", "60s")
	}

	insecure := grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}}
	conn, err := grpcx.DialMulti(c.bbsAddrs, insecure)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c.bbs = bbsv1.NewBBSServiceClient(conn)
	for _, addr := range c.auctioneerAddrs {
		aconn, err := grpcx.Dial(addr, insecure)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { aconn.Close() })
		c.auctioneerConns = append(c.auctioneerConns, aconn)
	}

	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		i := c.leader()
		return i >= 0, fmt.Sprintf("leader %d", i)
	}, "an auctioneer to lead")
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		cells, err := c.cells()
		if err != nil {
			return false, err.Error()
		}
		return len(cells) == o.reps, fmt.Sprintf("%d cells", len(cells))
	}, fmt.Sprintf("%d cells", o.reps))
	return c
}

// leader is the index of the auctioneer serving as leader, or -1.
func (c *haCluster) leader() int {
	for i, conn := range c.auctioneerConns {
		if c.auctioneerProcs[i].Done() {
			continue
		}
		if serving, _ := testkit.Serving(conn, testkit.AuctioneerService); serving {
			return i
		}
	}
	return -1
}

// bbsLeader is the index of the BBS that leads (converges), from the election's first key,
// whose value names the leader's listen address; -1 when none leads.
func (c *haCluster) bbsLeader() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.etcd.Get(ctx, etcdx.LockKey(bbs.LeaderService)+"/", append(clientv3.WithFirstCreate(), clientv3.WithLimit(1))...)
	if err != nil || len(resp.Kvs) == 0 {
		return -1
	}
	for i, addr := range c.bbsAddrs {
		if strings.Contains(string(resp.Kvs[0].Value), "/"+addr+"/") && !c.bbsProcs[i].Done() {
			return i
		}
	}
	return -1
}

func (c *haCluster) cells() ([]*modelsv1.CellPresence, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.bbs.Cells(ctx, &bbsv1.CellsRequest{})
	return resp.GetCells(), err
}

// actuals lists the instances of guids (all when none).
func (c *haCluster) actuals(guids ...string) ([]*modelsv1.ActualLRP, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: guids}})
	return resp.GetActualLrps(), err
}

// simLRP is a small LRP for the sim cells.
func simLRP(guid string, instances int32) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid,
		Domain:      "faults",
		Rootfs:      "preloaded:cflinuxfs4",
		Instances:   instances,
		MemoryMb:    16,
		DiskMb:      16,
		Ports:       []uint32{8080},
		Action:      &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
	}
}

func (c *haCluster) desire(t *testing.T, d *modelsv1.DesiredLRP) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatalf("DesireLRP %s: %v", d.GetProcessGuid(), err)
	}
}

// slots summarises instances by "guid/index": the RUNNING ordinary record's cell, and whether
// any RUNNING copy (ordinary or evacuating) exists.
type slots struct {
	running    map[string]string // guid/index → cell of the RUNNING ordinary record
	anyRunning map[string]bool   // guid/index → a RUNNING ordinary or evacuating copy exists
	other      []string          // every record that is not RUNNING ordinary, for messages
}

func summarize(actuals []*modelsv1.ActualLRP) slots {
	s := slots{running: map[string]string{}, anyRunning: map[string]bool{}}
	for _, a := range actuals {
		k := fmt.Sprintf("%s/%d", a.GetKey().GetProcessGuid(), a.GetKey().GetIndex())
		running := a.GetState() == modelsv1.ActualLRP_STATE_RUNNING
		switch {
		case running && a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY:
			s.running[k] = a.GetInstanceKey().GetCellId()
			s.anyRunning[k] = true
		case running && a.GetPresence() == modelsv1.ActualLRP_PRESENCE_EVACUATING:
			s.anyRunning[k] = true
			fallthrough
		default:
			s.other = append(s.other, fmt.Sprintf("%s:%s/%s@%s", k, a.GetState(), a.GetPresence(), a.GetInstanceKey().GetCellId()))
		}
	}
	sort.Strings(s.other)
	return s
}

// complete reports whether every index of every guid (instances each) is RUNNING ordinary and
// nothing else is recorded for them, with a description of what is missing.
func complete(actuals []*modelsv1.ActualLRP, guids []string, instances int) (bool, string) {
	s := summarize(actuals)
	var missing []string
	for _, g := range guids {
		for i := range instances {
			if _, ok := s.running[fmt.Sprintf("%s/%d", g, i)]; !ok {
				missing = append(missing, fmt.Sprintf("%s/%d", g, i))
			}
		}
	}
	if len(missing) == 0 && len(s.other) == 0 {
		return true, ""
	}
	if len(missing) > 10 {
		missing = append(missing[:10], "…")
	}
	other := s.other
	if len(other) > 10 {
		other = append(other[:10], "…")
	}
	return false, fmt.Sprintf("%d missing %v; other records %v", len(missing), missing, other)
}

// waitComplete waits until every index of guids runs (complete), failing the test with what
// when timeout passes first, and returns the records as last read, summarized.
func (c *haCluster) waitComplete(t *testing.T, timeout time.Duration, guids []string, instances int, what string) slots {
	t.Helper()
	var last slots
	testkit.EventuallyState(t, timeout, func() (bool, string) {
		as, err := c.actuals(guids...)
		if err != nil {
			return false, err.Error()
		}
		last = summarize(as)
		return complete(as, guids, instances)
	}, what)
	return last
}

// heldByReps asks every registered cell's rep for the instances it holds and counts the
// containers per "guid/index".
func (c *haCluster) heldByReps(t *testing.T) map[string]int {
	t.Helper()
	cells, err := c.cells()
	if err != nil {
		t.Fatalf("Cells: %v", err)
	}
	held := map[string]int{}
	for _, cell := range cells {
		conn := testkit.Dial(t, cell.GetRepAddress())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := repv1.NewRepServiceClient(conn).State(ctx, &repv1.StateRequest{})
		cancel()
		conn.Close()
		if err != nil {
			t.Fatalf("State of %s: %v", cell.GetCellId(), err)
		}
		for _, l := range st.GetLrps() {
			held[fmt.Sprintf("%s/%d", l.GetKey().GetProcessGuid(), l.GetKey().GetIndex())]++
		}
	}
	return held
}

// TestRepEvacuatesOnSIGTERM drains a rep with SIGTERM: every index keeps a RUNNING copy at every
// moment, and afterwards every instance runs on the other cells.
func TestRepEvacuatesOnSIGTERM(t *testing.T) {
	c := startHACluster(t, haOptions{bbs: 1, auctioneers: 1, reps: 3})
	const guid, n = "evacuee", 6
	c.desire(t, simLRP(guid, n))
	before := c.waitComplete(t, 30*time.Second, []string{guid}, n, "every instance running")
	victim := before.running[guid+"/0"]
	var held []string
	for k, cell := range before.running {
		if cell == victim {
			held = append(held, k)
		}
	}
	slices.Sort(held)
	t.Logf("draining %s, which holds %v", victim, held)

	// Watch every 50ms: no index may be without a RUNNING copy.
	stop := make(chan struct{})
	var watched sync.WaitGroup
	var gaps []string
	var polls, pollErrors int
	watched.Add(1)
	go func() {
		defer watched.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			as, err := c.actuals(guid)
			polls++
			if err != nil {
				pollErrors++
				continue
			}
			s := summarize(as)
			for i := range n {
				if k := fmt.Sprintf("%s/%d", guid, i); !s.anyRunning[k] {
					gaps = append(gaps, fmt.Sprintf("%s at %s (records %v)", k, time.Now().Format("15:04:05.000"), s.other))
				}
			}
		}
	}()

	start := time.Now()
	rep := c.reps[victim]
	if err := syscall.Kill(rep.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rep.Exited:
	case <-time.After(45 * time.Second):
		t.Fatalf("%s still running 45s after SIGTERM", victim)
	}
	drained := time.Since(start)
	if rep.Err != nil {
		t.Errorf("%s exited with %v after SIGTERM, want a clean exit", victim, rep.Err)
	}
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		as, err := c.actuals(guid)
		if err != nil {
			return false, err.Error()
		}
		ok, state := complete(as, []string{guid}, n)
		for k, cell := range summarize(as).running {
			if cell == victim {
				return false, fmt.Sprintf("%s still on %s", k, victim)
			}
		}
		return ok, state
	}, "every instance running on the other cells")
	close(stop)
	watched.Wait()
	t.Logf("%s drained and exited in %s; %d polls (%d failed)", victim, drained.Round(time.Millisecond), polls, pollErrors)
	if len(gaps) > 0 {
		t.Errorf("%d moments with an index without a RUNNING copy, e.g. %v", len(gaps), gaps[:min(5, len(gaps))])
	}
	if pollErrors > polls/10 {
		t.Errorf("%d of %d polls failed", pollErrors, polls)
	}
	if !strings.Contains(rep.Out.String(), "evacuat") {
		t.Errorf("%s did not log an evacuation", victim)
	}
	cells, err := c.cells()
	if err != nil {
		t.Fatal(err)
	}
	for _, cell := range cells {
		if cell.GetCellId() == victim {
			t.Errorf("%s is still registered after it exited", victim)
		}
	}
}

// TestHAFailoverLosesNoWork streams DesireLRP calls at two BBS while the leading auctioneer and
// one BBS are killed: every acknowledged LRP ends with each instance RUNNING exactly once.
func TestHAFailoverLosesNoWork(t *testing.T) {
	c := startHACluster(t, haOptions{bbs: 2, auctioneers: 2, reps: 3})
	const lrps, instances = 60, 2

	var mu sync.Mutex
	var acked []string
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		for i := range lrps {
			guid := fmt.Sprintf("ha-%02d", i)
			var err error
			for attempt := range 5 { // a call in flight on the killed BBS fails; retry it
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err = c.bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: simLRP(guid, instances)})
				cancel()
				if status.Code(err) == codes.AlreadyExists && attempt > 0 {
					err = nil // an earlier attempt was stored
				}
				if err == nil || status.Code(err) != codes.Unavailable {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err == nil {
				mu.Lock()
				acked = append(acked, guid)
				mu.Unlock()
			} else {
				t.Logf("DesireLRP %s not acknowledged: %v", guid, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// Kill once the stream is well under way (a sixth of the calls acknowledged), so that
	// desires, auctions and starts are in flight at the kill.
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= lrps/6, fmt.Sprintf("%d acknowledged", len(acked))
	}, "the DesireLRP stream under way")
	leader := c.leader()
	if leader < 0 {
		t.Fatal("no auctioneer leads")
	}
	var bbsLeader int
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		bbsLeader = c.bbsLeader()
		return bbsLeader >= 0, "no BBS leads"
	}, "a BBS to lead")
	killed := time.Now()
	c.auctioneerProcs[leader].Kill(t)
	c.bbsProcs[bbsLeader].Kill(t)
	t.Logf("killed auctioneer-%d and bbs-%d (the leaders)", leader, bbsLeader)
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		return c.bbsLeader() >= 0, "no BBS leads"
	}, "the other BBS to lead")
	t.Logf("bbs-%d leads %s after the kill", c.bbsLeader(), time.Since(killed).Round(time.Millisecond))
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		return c.leader() >= 0, "no leader"
	}, "the other auctioneer to lead")
	t.Logf("auctioneer-%d leads %s after the kill", c.leader(), time.Since(killed).Round(time.Millisecond))

	select {
	case <-streamed:
	case <-time.After(60 * time.Second):
		t.Fatal("the DesireLRP stream did not finish within 60s")
	}
	mu.Lock()
	guids := slices.Clone(acked)
	mu.Unlock()
	if len(guids) < lrps*9/10 {
		t.Errorf("only %d of %d DesireLRP calls acknowledged", len(guids), lrps)
	}
	c.waitComplete(t, 60*time.Second, guids, instances, "every acknowledged LRP running")
	t.Logf("%d LRPs × %d instances running %s after the kill", len(guids), instances, time.Since(killed).Round(time.Millisecond))

	// Exactly once: no cell holds a second container of an index (reps stop orphans in their
	// bulk loop, every 2s here).
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		held := c.heldByReps(t)
		var bad []string
		for _, g := range guids {
			for i := range instances {
				if k := fmt.Sprintf("%s/%d", g, i); held[k] != 1 {
					bad = append(bad, fmt.Sprintf("%s×%d", k, held[k]))
				}
			}
		}
		return len(bad) == 0, strings.Join(bad, " ")
	}, "one container per instance on the cells")
}

// TestKilledRepInstancesRestartElsewhere kills a rep holding instances with SIGKILL: once its
// lease expires (lease_ttl 2s) every instance is started on the other cells.
func TestKilledRepInstancesRestartElsewhere(t *testing.T) {
	c := startHACluster(t, haOptions{bbs: 1, auctioneers: 1, reps: 3, leaseTTL: 2 * time.Second})
	const guid, n = "orphaned", 9
	c.desire(t, simLRP(guid, n))
	before := c.waitComplete(t, 30*time.Second, []string{guid}, n, "every instance running")
	victim := before.running[guid+"/0"]
	var held int
	for _, cell := range before.running {
		if cell == victim {
			held++
		}
	}

	killed := time.Now()
	c.reps[victim].Kill(t)
	var expired time.Time
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		if expired.IsZero() {
			cells, err := c.cells()
			if err == nil && !slices.ContainsFunc(cells, func(p *modelsv1.CellPresence) bool { return p.GetCellId() == victim }) {
				expired = time.Now()
			}
		}
		as, err := c.actuals(guid)
		if err != nil {
			return false, err.Error()
		}
		ok, state := complete(as, []string{guid}, n)
		for k, cell := range summarize(as).running {
			if cell == victim {
				return false, fmt.Sprintf("%s still on %s; %s", k, victim, state)
			}
		}
		return ok, state
	}, "every instance running on the other cells")
	done := time.Now()
	if expired.IsZero() {
		expired = done
	}
	t.Logf("%s held %d of %d instances: last replacement RUNNING %s after the kill, %s after the cell disappeared (lease_ttl 2s)",
		victim, held, n, done.Sub(killed).Round(time.Millisecond), done.Sub(expired).Round(time.Millisecond))
}
