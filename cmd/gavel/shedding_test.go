package main

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/config"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/rep"
)

// holder occupies the only write slot of a BBS whose admission bound is 1: it desires an LRP
// named hold-N that a transformer plugin keeps inside the BBS's handler until released, so
// every other write is refused as overloaded meanwhile. Holds are taken one at a time.
type holder struct {
	t    *testing.T
	bbs  func() bbsv1.BBSServiceClient
	mu   sync.Mutex // held from hold to release
	n    atomic.Int64
	gate atomic.Pointer[holdGate]
}

// holdGate is one hold: the plugin closes entered when the hold LRP reached it and returns
// when release is closed.
type holdGate struct{ entered, release chan struct{} }

// plugin is the transformer that keeps hold-N LRPs until their hold is released.
func (h *holder) plugin() *plugin.Plugin {
	return &plugin.Plugin{Name: "hold", Version: "test", DesiredLRP: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
		if strings.HasPrefix(d.GetProcessGuid(), "hold-") {
			g := h.gate.Load()
			close(g.entered)
			<-g.release
		}
		return d, nil
	}}
}

// hold occupies the BBS's write slot until the returned release is called.
func (h *holder) hold() (release func()) {
	h.mu.Lock()
	g := &holdGate{entered: make(chan struct{}), release: make(chan struct{})}
	h.gate.Store(g)
	done := make(chan error, 1)
	go func() {
		lrp := &modelsv1.DesiredLRP{ProcessGuid: fmt.Sprintf("hold-%d", h.n.Add(1)), Domain: "hold", Rootfs: "preloaded:cflinuxfs4",
			Instances: 0, MemoryMb: 16, DiskMb: 16, Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/hold"}}}}
		_, err := h.bbs().DesireLRP(context.Background(), &bbsv1.DesireLRPRequest{DesiredLrp: lrp})
		done <- err
	}()
	select {
	case <-g.entered:
	case err := <-done:
		h.t.Errorf("hold LRP desired without being held: %v", err)
		h.mu.Unlock()
		return func() {}
	}
	return func() {
		close(g.release)
		if err := <-done; err != nil {
			h.t.Errorf("hold LRP: %v", err)
		}
		h.mu.Unlock()
	}
}

// attempts records what the attempts of one client kind's call got from the BBS.
type attempts struct {
	held       atomic.Bool  // the first attempt was made while the slot was held
	refused    atomic.Int64 // attempts refused as overloaded, with a retry-after
	served     atomic.Int64 // attempts the BBS served
	unexpected atomic.Value // the first other error, if any
}

func (a *attempts) String() string {
	return fmt.Sprintf("held %v, refused %d, served %d, other error %v", a.held.Load(), a.refused.Load(), a.served.Load(), a.unexpected.Load())
}

// refuseFirst is a client interceptor (inside the BBS connection's RetryOverloaded, so it sees
// every attempt) that makes the first call of method while the slot is held, so the BBS
// refuses it, and records every attempt of method in a.
func (h *holder) refuseFirst(method string, a *attempts) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if path.Base(m) != method {
			return invoker(ctx, m, req, reply, cc, opts...)
		}
		var err error
		if a.held.CompareAndSwap(false, true) {
			release := h.hold()
			err = invoker(ctx, m, req, reply, cc, opts...)
			release()
		} else {
			err = invoker(ctx, m, req, reply, cc, opts...)
		}
		if _, shed := rpcerr.RetryAfter(err); shed {
			a.refused.Add(1)
		} else if err == nil {
			a.served.Add(1)
		} else {
			a.unexpected.CompareAndSwap(nil, err)
		}
		return err
	}
}

// TestEveryClientHonoursLoadShedding runs a cluster whose BBS admits one write at a time and
// drives it with every kind of BBS client: the rep (StartActualLRP), the auctioneer
// (RejectTask), nsync (its bulk pass's UpsertDomain), the CLI (remove-lrp) and the
// route-emitter (reads and the event stream, which the BBS never sheds). Each kind's write is
// first made while the write slot is taken, so the BBS refuses it with a retry-after; each must
// wait as told and send it again through its ordinary BBS connection (bbsclient.Dial's
// RetryOverloaded) and get it served, and no call of any client may end refused.
func TestEveryClientHonoursLoadShedding(t *testing.T) {
	returnedBefore := bbsclient.Refusals("", bbsclient.OutcomeReturned)
	var c *devcluster.Cluster
	h := &holder{t: t, bbs: func() bbsv1.BBSServiceClient { return c.BBS }}
	dir, err := os.MkdirTemp("", "gvsh") // short: a UNIX socket path is at most 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "hold.sock")
	l, err := plugin.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.plugin().ServeListener(context.Background(), l) }()
	t.Cleanup(func() { l.Close() })

	var repStart, auctioneerReject, nsyncDomain attempts
	var emitterCalls atomic.Int64
	cfg := rep.Default()
	cfg.CellID, cfg.Zone = "cell-1", "z1"
	cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": "/var/gavel/rootfs/cflinuxfs4"}
	cfg.Backend = rep.BackendSim
	cfg.Capacity = rep.Capacity{MemoryMB: 1024, DiskMB: 4096, Containers: 10}
	c = devcluster.New(devcluster.Config{
		Dir: t.TempDir(), BBSAddress: "127.0.0.1:0", AuctioneerAddress: "127.0.0.1:0", UnsafeNoFsync: true,
		Cells:   []devcluster.Cell{{Config: cfg}},
		Routing: true, RouteEmitterAddress: "127.0.0.1:0", RouterHTTPAddress: "127.0.0.1:0", RouterAdminAddress: "127.0.0.1:0",
		Nsync: true, NsyncAddress: "127.0.0.1:0",
		TLS:    true,
		Logger: logtest.New(t),
		ConfigureBBS: func(b *bbs.Config) {
			b.MaxInflightWrites = 1
			b.OverloadRetryAfter = bbs.Duration(20 * time.Millisecond)
		},
		Transformers:      []transform.PluginConfig{{Name: "hold", Socket: socket, Timeout: config.Duration(time.Minute)}},
		RepBBSInterceptor: h.refuseFirst("StartActualLRP", &repStart),
		BBSInterceptors: map[string]grpc.UnaryClientInterceptor{
			"auctioneer": h.refuseFirst("RejectTask", &auctioneerReject),
			"nsync":      h.refuseFirst("UpsertDomain", &nsyncDomain),
			"route-emitter": func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				emitterCalls.Add(1)
				return invoker(ctx, m, req, reply, cc, opts...)
			},
		},
	})
	testkit.Start(t, "cluster", c)
	admin := c.PKI["admin"]
	e := &env{c: c, args: []string{"--bbs", c.BBSAddress,
		"--tls-cert", admin.CertFile, "--tls-key", admin.KeyFile, "--tls-ca", admin.CAFile}}
	ctx := context.Background()

	// rep: its first StartActualLRP is refused, then the instance runs.
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: &modelsv1.DesiredLRP{
		ProcessGuid: "web", Domain: "apps", Rootfs: "preloaded:cflinuxfs4", Instances: 1, MemoryMb: 64, DiskMb: 64,
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/web"}}},
	}}); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		resp, err := c.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{"web"}}})
		running := err == nil && len(resp.GetActualLrps()) == 1 && resp.GetActualLrps()[0].GetState() == modelsv1.ActualLRP_STATE_RUNNING
		return running && repStart.served.Load() > 0, fmt.Sprintf("%v %v; rep StartActualLRP: %s", resp.GetActualLrps(), err, &repStart)
	}, "the instance RUNNING after the rep's start was refused once")

	// auctioneer: a task no cell can run is rejected; the first RejectTask is refused.
	if _, err := c.BBS.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: "nowhere", Domain: "tasks", Definition: &modelsv1.TaskDefinition{
		Rootfs: "preloaded:nowhere", MemoryMb: 16, DiskMb: 16, Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/true"}}},
	}}); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		return auctioneerReject.served.Load() > 0, "auctioneer RejectTask: " + auctioneerReject.String()
	}, "the auctioneer's rejection served after it was refused once")

	// nsync: its bulk pass refreshes the cf-apps domain; the first UpsertDomain is refused.
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		return nsyncDomain.served.Load() > 0, "nsync UpsertDomain: " + nsyncDomain.String()
	}, "nsync's domain refresh served after it was refused once")

	// CLI: remove-lrp is sent while the slot is held; it is refused, waits and succeeds.
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: &modelsv1.DesiredLRP{
		ProcessGuid: "cli", Domain: "apps", Rootfs: "preloaded:cflinuxfs4", Instances: 0, MemoryMb: 16, DiskMb: 16,
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/cli"}}},
	}}); err != nil {
		t.Fatal(err)
	}
	cliRefusals := bbsclient.Refusals("RemoveDesiredLRP", bbsclient.OutcomeRetried)
	release := h.hold()
	cli := make(chan result, 1)
	go func() { cli <- e.run(t, "remove-lrp", "cli") }()
	testkit.Eventually(t, 30*time.Second, func() bool {
		return bbsclient.Refusals("RemoveDesiredLRP", bbsclient.OutcomeRetried) > cliRefusals
	}, "the CLI's remove-lrp refused while the slot is held")
	release()
	if r := <-cli; r.code != 0 {
		t.Fatalf("gavel remove-lrp: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	for name, a := range map[string]*attempts{"rep": &repStart, "auctioneer": &auctioneerReject, "nsync": &nsyncDomain} {
		if !a.held.Load() || a.refused.Load() == 0 || a.served.Load() == 0 || a.unexpected.Load() != nil {
			t.Errorf("%s: %s; want its first attempt refused and a later one served", name, a)
		}
	}
	// The route-emitter drove the BBS over the same kind of connection (it only reads, and the
	// BBS does not shed reads).
	if emitterCalls.Load() == 0 {
		t.Error("the route-emitter made no BBS call")
	}
	if n := bbsclient.Refusals("", bbsclient.OutcomeReturned) - returnedBefore; n != 0 {
		t.Errorf("%d calls ended refused as overloaded; every refusal should have been waited out", n)
	}
}
