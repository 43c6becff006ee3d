package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/rep"
)

// buildHello builds the sample app (examples/hello) for process-backed cells.
func buildHello(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "hello")
	cmd := exec.Command("go", "build", "-o", out, "../../examples/hello")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build hello: %v\n%s", err, b)
	}
	return out
}

// processCell is a process-backed cell with its own block of host ports.
func processCell(t *testing.T, id string) devcluster.Cell {
	cfg := rep.Default()
	cfg.CellID, cfg.Zone = id, "z1"
	cfg.Backend = rep.BackendProcess
	cfg.WorkDir = t.TempDir()
	cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": t.TempDir()}
	cfg.Capacity = rep.Capacity{MemoryMB: 4096, DiskMB: 4096, Containers: 10}
	first, last := testkit.PortBlock(t, 20)
	cfg.PortRange = fmt.Sprintf("%d-%d", first, last)
	return devcluster.Cell{Config: cfg}
}

// stopObserver is the BBS's way to the reps in TestDrainFirstUnderRouterTraffic: at every
// StopLRPInstance it checks, before passing the call to the cell's rep, that the router's own
// table no longer sends host's requests to the instance (the router of the cluster, read in
// process: no watcher of ours in between). Evacuated instances are stopped by their rep when
// the BBS answers keep_container false; the reps' interceptor checks those (evacuations).
type stopObserver struct {
	host string
	c    *devcluster.Cluster // set once the cluster runs; stops come only after

	checked    atomic.Int64
	mu         sync.Mutex
	violations []string
}

// check records a violation when the router's endpoints eps still hold the instance at net.
func (o *stopObserver) check(what string, net *modelsv1.ActualLRPNetInfo, eps []string) {
	if len(net.GetPorts()) == 0 {
		return
	}
	addr := fmt.Sprintf("%s:%d", net.GetAddress(), net.GetPorts()[0].GetHostPort())
	o.checked.Add(1)
	if slices.Contains(eps, addr) {
		o.mu.Lock()
		o.violations = append(o.violations, fmt.Sprintf("%s at %s (router table %v)", what, addr, eps))
		o.mu.Unlock()
	}
}

// evacuations is a rep's interceptor of its BBS calls: when the BBS tells an evacuating rep
// to give up a running instance (keep_container false), the router must no longer hold it.
func (o *stopObserver) evacuations(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	r, ok := req.(*bbsv1.EvacuateRunningActualLRPRequest)
	if ok && err == nil && o.c != nil && o.c.Router != nil && !reply.(*bbsv1.EvacuateRunningActualLRPResponse).GetKeepContainer() {
		o.check(fmt.Sprintf("evacuation of %s/%d", r.GetProcessGuid(), r.GetIndex()), r.GetNetInfo(), o.c.Router.Endpoints(o.host))
	}
	return err
}

func (o *stopObserver) rep(cell *modelsv1.CellPresence) (repv1.RepServiceClient, func(), error) {
	conn, err := grpcx.Dial(cell.GetRepAddress(), grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}})
	if err != nil {
		return nil, nil, err
	}
	return repv1.NewRepServiceClient(conn), func() { conn.Close() }, nil
}

// StopLRPInstance implements bbs.CellClient.
func (o *stopObserver) StopLRPInstance(ctx context.Context, cell *modelsv1.CellPresence, key *modelsv1.ActualLRPKey, ik *modelsv1.ActualLRPInstanceKey) error {
	if o.c != nil && o.c.Router != nil {
		resp, err := o.c.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{key.GetProcessGuid()}}})
		if err != nil {
			return err
		}
		eps := o.c.Router.Endpoints(o.host)
		for _, a := range resp.GetActualLrps() {
			if a.GetInstanceKey().GetInstanceGuid() == ik.GetInstanceGuid() {
				o.check(fmt.Sprintf("stop of %s/%d", key.GetProcessGuid(), key.GetIndex()), a.GetNetInfo(), eps)
			}
		}
	}
	client, done, err := o.rep(cell)
	if err != nil {
		return err
	}
	defer done()
	_, err = client.StopLRPInstance(ctx, &repv1.StopLRPInstanceRequest{Key: key, InstanceKey: ik})
	return err
}

// CancelTask implements bbs.CellClient.
func (o *stopObserver) CancelTask(ctx context.Context, cell *modelsv1.CellPresence, taskGuid string) error {
	client, done, err := o.rep(cell)
	if err != nil {
		return err
	}
	defer done()
	_, err = client.CancelTask(ctx, &repv1.CancelTaskRequest{TaskGuid: taskGuid})
	return err
}

// TestDrainFirstUnderRouterTraffic runs an LRP of 4 process-backed instances behind the real
// route-emitter and router under a bounded request loop (50 requests/s) while it is scaled down
// to 1 and then, scaled to 2, while the cell of one instance evacuates: no request fails, every
// instance stopped was drained first (its record went unrouted with draining_since), and when
// the BBS asks a rep to stop an instance (or an evacuating rep to give one up) the router's
// table no longer holds its endpoint.
func TestDrainFirstUnderRouterTraffic(t *testing.T) {
	hello := buildHello(t)
	stops := &stopObserver{host: "drain.it"}
	c := startClusterWith(t, devcluster.Config{
		Cells:   []devcluster.Cell{processCell(t, "cell-a"), processCell(t, "cell-b")},
		Routing: true, RouteEmitterAddress: "127.0.0.1:0", RouterHTTPAddress: "127.0.0.1:0",
		ConfigureBBS:      func(cfg *bbs.Config) { cfg.DrainTimeout = bbs.Duration(5 * time.Second) },
		BBSOptions:        []bbs.Option{bbs.WithCellClient(stops)},
		RepBBSInterceptor: stops.evacuations,
	})
	stops.c = c
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const guid, host = "drain-web", "drain.it"

	// Count the drains the BBS records, and time each from draining_since until its record is
	// removed (the rep stopped the container): a figure, logged, not asserted.
	var drains atomic.Int64
	var drainMu sync.Mutex
	drainStart := map[string]time.Time{}
	var drainTimes []time.Duration
	events, err := c.BBS.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			resp, err := events.Recv()
			if err != nil {
				return
			}
			for _, e := range resp.GetEvents() {
				ch := e.GetActualLrpChanged()
				if ch != nil && ch.GetAfter().GetDrainingSince() != nil && ch.GetBefore().GetDrainingSince() == nil {
					drains.Add(1)
					drainMu.Lock()
					drainStart[ch.GetAfter().GetInstanceKey().GetInstanceGuid()] = ch.GetAfter().GetDrainingSince().AsTime()
					drainMu.Unlock()
				}
				if rm := e.GetActualLrpRemoved().GetActualLrp(); rm != nil {
					drainMu.Lock()
					if at, ok := drainStart[rm.GetInstanceKey().GetInstanceGuid()]; ok {
						drainTimes = append(drainTimes, time.Since(at).Round(time.Millisecond))
					}
					drainMu.Unlock()
				}
			}
		}
	}()

	d := desiredLRP(guid, "preloaded:cflinuxfs4", 4, nil)
	d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: hello}}}
	d.Routes = map[string][]byte{"cf-router": []byte(`[{"port":8080,"routes":["` + host + `"]}]`)}
	d.CheckDefinition = &modelsv1.CheckDefinition{ReadinessChecks: []*modelsv1.Check{{Kind: &modelsv1.Check_Http{Http: &modelsv1.HTTPCheck{Port: 8080, IntervalMs: 100}}}}}
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatal(err)
	}
	routed := func(n int) {
		t.Helper()
		testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
			eps := c.Router.Endpoints(host)
			as := actualLRPs(t, c, guid)
			return len(eps) == n && len(as) == n, fmt.Sprintf("router endpoints %v, records %d", eps, len(as))
		}, fmt.Sprintf("%d instances routed, and no other record", n))
	}
	routed(4)

	load := testkit.StartRouterLoad(c.Router.HTTPAddr().String(), host, 3000, 20*time.Millisecond)
	scale := func(n int32) {
		t.Helper()
		if _, err := c.BBS.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: guid, Update: &modelsv1.DesiredLRPUpdate{Instances: &n}}); err != nil {
			t.Fatal(err)
		}
	}
	scale(1)
	routed(1)
	scale(2)
	routed(2)

	// Evacuate the cell of index 0.
	var cell string
	for _, a := range actualLRPs(t, c, guid) {
		if a.GetKey().GetIndex() == 0 {
			cell = a.GetInstanceKey().GetCellId()
		}
	}
	var evacuated *rep.Service
	for i, r := range c.Reps {
		if fmt.Sprintf("cell-%c", 'a'+i) == cell {
			evacuated = r
		}
	}
	if evacuated == nil {
		t.Fatalf("no rep for cell %q", cell)
	}
	if err := evacuated.Evacuate(ctx); err != nil {
		t.Fatalf("evacuate %s: %v", cell, err)
	}
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		as := actualLRPs(t, c, guid)
		off := 0
		for _, a := range as {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetInstanceKey().GetCellId() != cell && a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
				off++
			}
		}
		return off == 2 && len(as) == 2 && len(c.Router.Endpoints(host)) == 2, fmt.Sprintf("%v", as)
	}, "both instances running off the evacuated cell, and routed")

	ok, failed, first := load.Finish()
	drainMu.Lock()
	t.Logf("requests through the router: %d ok, %d failed; drains recorded: %d; stops checked against the router's table: %d; draining_since to record removed: %v",
		ok, failed, drains.Load(), stops.checked.Load(), drainTimes)
	drainMu.Unlock()
	if failed != 0 {
		t.Errorf("%d of %d requests failed through the router (first: %s)", failed, ok+failed, first)
	}
	if ok == 0 {
		t.Error("no request succeeded")
	}
	if n := drains.Load(); n < 4 {
		t.Errorf("%d drains recorded, want at least 4 (3 scaled down, 1 evacuated)", n)
	}
	if n := stops.checked.Load(); n < 4 {
		t.Errorf("%d stops of routed instances checked, want at least 4 (3 scaled down, 1 evacuated)", n)
	}
	stops.mu.Lock()
	defer stops.mu.Unlock()
	if len(stops.violations) > 0 {
		t.Errorf("the BBS asked reps to stop instances still in the router's table: %v", stops.violations)
	}
}
