package nsync_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/nsync"
	"github.com/gavel-sched/gavel/services/rep"
)

// cellTags is the placement pools proposal's table: cell-1 … cell-9.
var cellTags = [][]string{
	{"staging", "skynet"}, {"staging", "skynet"}, {"staging"}, {"staging"},
	{"production", "skynet"}, {"production", "skynet"}, {"production"}, {"production"},
	{"skynet"},
}

// env is a cluster of nine sim cells with the proposal's tags, and an nsync that reaches the
// BBS through a proxy the test can cut.
type env struct {
	cluster *devcluster.Cluster
	bbs     bbsv1.BBSServiceClient // direct
	proxy   *proxy
	cfg     nsync.Config
	tr      nsync.Transformer
	nsync   nsyncv1.NsyncServiceClient
	svc     *nsync.Service
	stop    func()
	// clientTLS is how e.nsync dials nsync (plaintext unless a test sets it before startNsync).
	clientTLS tlsx.Config
	// logger, when set before startNsync, is nsync's logger (the test's otherwise).
	logger hclog.Logger
}

func startEnv(t *testing.T, configure func(*nsync.Config), tr nsync.Transformer) *env {
	t.Helper()
	e := newEnv(t, configure, tr)
	e.startNsync(t)
	return e
}

// newEnv is startEnv without starting nsync: the cluster, the proxy and e.cfg.
func newEnv(t *testing.T, configure func(*nsync.Config), tr nsync.Transformer) *env {
	t.Helper()
	return newEnvWith(t, nil, configure, tr)
}

// newEnvWith is newEnv with cluster adjusting the cluster's configuration first.
func newEnvWith(t *testing.T, cluster func(*devcluster.Config), configure func(*nsync.Config), tr nsync.Transformer) *env {
	t.Helper()
	var cells []devcluster.Cell
	for i, tags := range cellTags {
		cfg := rep.Default()
		cfg.CellID, cfg.Zone, cfg.Tags = fmt.Sprintf("cell-%d", i+1), fmt.Sprintf("z%d", i%3), tags
		cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": "/rootfs/fs4"}
		cfg.Backend = rep.BackendSim
		cfg.Capacity = rep.Capacity{MemoryMB: 64 * 1024, DiskMB: 64 * 1024, Containers: 200}
		cfg.Sim.StartLatency = rep.Duration(20 * time.Millisecond)
		cells = append(cells, devcluster.Cell{Config: cfg})
	}
	dc := devcluster.Config{
		Dir: t.TempDir(), BBSAddress: "127.0.0.1:0", AuctioneerAddress: "127.0.0.1:0",
		UnsafeNoFsync: true, Cells: cells, Logger: logtest.New(t),
	}
	if cluster != nil {
		cluster(&dc)
	}
	c := devcluster.New(dc)
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- c.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("cluster stopped before it was ready: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("cluster not ready within 60s")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("cluster did not stop within 30s")
		}
	})
	waitFor(t, 20*time.Second, "nine cells", func() (bool, string) {
		resp, err := c.BBS.Cells(context.Background(), &bbsv1.CellsRequest{})
		if err != nil {
			return false, err.Error()
		}
		return len(resp.GetCells()) == len(cells), fmt.Sprintf("%d cells", len(resp.GetCells()))
	})

	e := &env{cluster: c, bbs: c.BBS, proxy: startProxy(t, c.BBSAddress), tr: tr, clientTLS: tlsx.Config{Insecure: true}}
	e.cfg = nsync.Default()
	e.cfg.ListenAddress = "127.0.0.1:0"
	e.cfg.TLS, e.cfg.BBSTLS, e.cfg.EtcdTLS = tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}
	e.cfg.BBSAddress, e.cfg.EtcdEndpoints = e.proxy.Addr(), c.EtcdEndpoints
	e.cfg.Stacks = map[string]string{"cflinuxfs4": "preloaded:cflinuxfs4", "lucid64": "preloaded:lucid64"}
	e.cfg.BulkInterval, e.cfg.DomainTTL = nsync.Duration(time.Second), nsync.Duration(3*time.Second)
	e.cfg.RestartTimeout, e.cfg.LockTTL = nsync.Duration(30*time.Second), nsync.Duration(2*time.Second)
	e.cfg.RouteDrain = nsync.Duration(500 * time.Millisecond)
	if configure != nil {
		configure(&e.cfg)
	}
	return e
}

// startNsync runs nsync with e.cfg; e.stop stops it.
func (e *env) startNsync(t *testing.T) {
	t.Helper()
	conn, err := bbsclient.Dial(e.cfg.Config)
	if err != nil {
		t.Fatal(err)
	}
	logger := e.logger
	if logger == nil {
		logger = logtest.New(t).Named("nsync")
	}
	svc, err := nsync.New(e.cfg, logger, e.cluster.Etcd, bbsv1.NewBBSServiceClient(conn), nsync.WithTransformer(e.tr))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- svc.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("nsync stopped before it was ready: %v", err)
	}
	client, err := grpcx.Dial(svc.Addr().String(), grpcx.ClientConfig{TLS: e.clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	e.nsync, e.svc = nsyncv1.NewNsyncServiceClient(client), svc
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			client.Close()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("nsync stopped with %v", err)
			}
			conn.Close()
		})
	}
	t.Cleanup(e.stop)
	waitFor(t, 20*time.Second, "nsync to lead", func() (bool, string) { return svc.IsLeader(), "not leading" })
}

// waitFor is testkit.EventuallyState with the description first, as the tests read.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testkit.EventuallyState(t, timeout, cond, what)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// app is a small app of space on cflinuxfs4.
func app(guid, space string, instances int32) *nsyncv1.App {
	return &nsyncv1.App{
		Guid: guid, Name: guid + "-name", SpaceGuid: space, Stack: "cflinuxfs4",
		Command: "/bin/app --port 8080", Instances: instances, MemoryMb: 64, DiskMb: 64,
		Env: map[string]string{"GREETING": "hi"}, Ports: []uint32{8080},
	}
}

// running returns the cells of pg's RUNNING ordinary instances (sorted) and a summary.
func (e *env) running(t *testing.T, pg string) ([]string, string) {
	t.Helper()
	resp, err := e.bbs.ActualLRPs(context.Background(), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{pg}}})
	if err != nil {
		t.Fatal(err)
	}
	var cells, states []string
	for _, a := range resp.GetActualLrps() {
		states = append(states, fmt.Sprintf("%d:%s@%s%s", a.GetKey().GetIndex(), a.GetState(), a.GetInstanceKey().GetCellId(), a.GetPlacementError().GetMessage()))
		if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
			cells = append(cells, a.GetInstanceKey().GetCellId())
		}
	}
	slices.Sort(cells)
	return cells, strings.Join(states, " ")
}

// waitRunning waits until pg has n RUNNING instances and returns their cells.
func (e *env) waitRunning(t *testing.T, pg string, n int) []string {
	t.Helper()
	var cells []string
	waitFor(t, 30*time.Second, fmt.Sprintf("%d running instances of %s", n, pg), func() (bool, string) {
		var s string
		cells, s = e.running(t, pg)
		return len(cells) == n, s
	})
	return cells
}

// desired reports whether pg is desired at the BBS, and its instances.
func (e *env) desired(t *testing.T, pg string) (*modelsv1.DesiredLRP, bool) {
	t.Helper()
	resp, err := e.bbs.DesiredLRPs(context.Background(), &bbsv1.DesiredLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{pg}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetDesiredLrps()) == 0 {
		return nil, false
	}
	return resp.GetDesiredLrps()[0], true
}

func (e *env) appInfo(t *testing.T, guid string) *nsyncv1.AppInfo {
	t.Helper()
	resp, err := e.nsync.Apps(ctxT(t), &nsyncv1.AppsRequest{Guids: []string{guid}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetApps()) != 1 {
		t.Fatalf("Apps(%s): %v", guid, resp.GetApps())
	}
	return resp.GetApps()[0]
}

// onlyOn fails unless every cell is one of allowed (by number).
func onlyOn(t *testing.T, what string, cells []string, allowed ...int) {
	t.Helper()
	for _, c := range cells {
		ok := false
		for _, n := range allowed {
			ok = ok || c == fmt.Sprintf("cell-%d", n)
		}
		if !ok {
			t.Errorf("%s runs on %v, want only cells %v", what, cells, allowed)
			return
		}
	}
}

// proxy forwards TCP to a target until cut; a cut proxy closes every connection and refuses
// new ones until restored.
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { l.Close(); p.Cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *proxy) Addr() string { return p.l.Addr().String() }

func (p *proxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.conns[c] = true
	p.mu.Unlock()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[up] = true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

// Cut closes every connection and refuses new ones.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// Restore accepts connections again.
func (p *proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}
