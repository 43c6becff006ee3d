package auctioneer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/auctioneer"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fakeRep is a real RepService server on loopback: State answers a configured state, Perform
// records what it got and reserves it in the state (or hands everything back when refusing).
type fakeRep struct {
	repv1.UnimplementedRepServiceServer
	addr string
	run  *testkit.Running

	mu       sync.Mutex
	state    *repv1.StateResponse
	refuse   bool
	performs []*repv1.PerformRequest
}

// State implements repv1.RepServiceServer.
func (r *fakeRep) State(context.Context, *repv1.StateRequest) (*repv1.StateResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return proto.Clone(r.state).(*repv1.StateResponse), nil
}

// Perform implements repv1.RepServiceServer.
func (r *fakeRep) Perform(_ context.Context, req *repv1.PerformRequest) (*repv1.PerformResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.performs = append(r.performs, req)
	if r.refuse {
		return &repv1.PerformResponse{FailedLrps: req.GetLrps(), FailedTasks: req.GetTasks()}, nil
	}
	avail := r.state.AvailableResources
	for _, l := range req.GetLrps() {
		avail.MemoryMb -= l.GetResources().GetMemoryMb()
		avail.DiskMb -= l.GetResources().GetDiskMb()
		avail.Containers--
		r.state.Lrps = append(r.state.Lrps, l)
	}
	for _, tw := range req.GetTasks() {
		avail.MemoryMb -= tw.GetResources().GetMemoryMb()
		avail.DiskMb -= tw.GetResources().GetDiskMb()
		avail.Containers--
		r.state.Tasks = append(r.state.Tasks, tw)
	}
	return &repv1.PerformResponse{}, nil
}

// received lists the work Perform got, as "guid/index" and "task:guid", sorted.
func (r *fakeRep) received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, p := range r.performs {
		for _, l := range p.GetLrps() {
			out = append(out, fmt.Sprintf("%s/%d", l.GetKey().GetProcessGuid(), l.GetKey().GetIndex()))
		}
		for _, tw := range p.GetTasks() {
			out = append(out, "task:"+tw.GetTaskGuid())
		}
	}
	slices.Sort(out)
	return out
}

// performed lists the LRPs of the i-th Perform, as "guid/index", sorted (nil before it).
func (r *fakeRep) performed(i int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.performs) {
		return nil
	}
	var out []string
	for _, l := range r.performs[i].GetLrps() {
		out = append(out, fmt.Sprintf("%s/%d", l.GetKey().GetProcessGuid(), l.GetKey().GetIndex()))
	}
	slices.Sort(out)
	return out
}

// cellSpec describes a fake cell.
type cellSpec struct {
	id, zone string
	tags     []string
	memoryMB int32
}

// startRep runs a fake rep for spec and registers its cell presence in the BBS's etcd.
func startRep(t *testing.T, env *bbstest.Env, spec cellSpec) *fakeRep {
	t.Helper()
	if spec.memoryMB == 0 {
		spec.memoryMB = 1024
	}
	capacity := &modelsv1.CellCapacity{MemoryMb: spec.memoryMB, DiskMb: 4096, Containers: 10}
	rep := &fakeRep{state: &repv1.StateResponse{
		CellId:             spec.id,
		Zone:               spec.zone,
		TotalResources:     capacity,
		AvailableResources: proto.Clone(capacity).(*modelsv1.CellCapacity),
		PlacementTags:      spec.tags,
		PreloadedRootfses:  []string{"cflinuxfs4"},
		RootfsProviders:    []string{"docker"},
	}}
	srv, err := grpcx.NewServer(grpcx.ServerConfig{ListenAddress: "127.0.0.1:0", TLS: tlsx.Config{Insecure: true}, GracefulStopTimeout: time.Second},
		logtest.New(t).Named("rep-"+spec.id))
	if err != nil {
		t.Fatal(err)
	}
	repv1.RegisterRepServiceServer(srv.GRPC, rep)
	rep.run = testkit.Start(t, "rep "+spec.id, srv)
	rep.addr = srv.Addr().String()

	presence := &modelsv1.CellPresence{
		CellId: spec.id, RepAddress: rep.addr, Zone: spec.zone, Capacity: capacity,
		PlacementTags: spec.tags, PreloadedRootfses: map[string]string{"cflinuxfs4": "/var/rootfs/cflinuxfs4"},
		RootfsProviders: []string{"docker"}, Address: "127.0.0.1",
	}
	b, err := proto.Marshal(presence)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Etcd.Put(ctxT(t), bbstest.CellKey(spec.id), string(b)); err != nil {
		t.Fatalf("register cell %s: %v", spec.id, err)
	}
	return rep
}

// waitCells waits until the BBS lists n cells.
func waitCells(t *testing.T, env *bbstest.Env, n int) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, func() bool {
		resp, err := env.Client.Cells(ctxT(t), &bbsv1.CellsRequest{})
		return err == nil && len(resp.GetCells()) == n
	}, fmt.Sprintf("%d cells in the bbs", n))
}

// runningAuctioneer is an auctioneer running for a test.
type runningAuctioneer struct {
	svc    *auctioneer.Service
	client auctioneerv1.AuctioneerServiceClient
	addr   string
	run    *testkit.Running
}

// startAuctioneer runs an auctioneer against env's BBS and etcd.
func startAuctioneer(t *testing.T, env *bbstest.Env, configure ...func(*auctioneer.Config)) *runningAuctioneer {
	t.Helper()
	cfg := auctioneer.Default()
	cfg.ListenAddress = "127.0.0.1:0"
	cfg.TLS = tlsx.Config{Insecure: true}
	cfg.BBSAddress = env.Addr
	cfg.BBSTLS = tlsx.Config{Insecure: true}
	cfg.RepTLS = tlsx.Config{Insecure: true}
	cfg.EtcdTLS = tlsx.Config{Insecure: true}
	cfg.BatchInterval = auctioneer.Duration(20 * time.Millisecond)
	cfg.LockTTL = auctioneer.Duration(2 * time.Second)
	for _, f := range configure {
		f(&cfg)
	}
	svc, err := auctioneer.New(cfg, logtest.New(t).Named("auctioneer"), env.Etcd, env.Client)
	if err != nil {
		t.Fatal(err)
	}
	a := &runningAuctioneer{svc: svc, run: testkit.Start(t, "auctioneer", svc)}
	a.addr = svc.Addr().String()
	conn := testkit.Dial(t, a.addr)
	a.client = auctioneerv1.NewAuctioneerServiceClient(conn)
	t.Cleanup(func() { conn.Close() })
	return a
}

// stop stops the auctioneer and checks it stopped cleanly.
func (a *runningAuctioneer) stop(t *testing.T) {
	t.Helper()
	if err := a.run.Stop(); err != nil {
		t.Errorf("auctioneer stopped with error: %v", err)
	}
}

// desire desires an LRP in the BBS and returns the auction request for all its instances.
func desire(t *testing.T, env *bbstest.Env, guid string, instances, memoryMB int32, pc *modelsv1.PlacementConstraint) *auctioneerv1.LRPStartRequest {
	t.Helper()
	d := &modelsv1.DesiredLRP{
		ProcessGuid:         guid,
		Domain:              "apps",
		Rootfs:              "preloaded:cflinuxfs4",
		Instances:           instances,
		MemoryMb:            memoryMB,
		DiskMb:              64,
		PlacementConstraint: pc,
		Action:              &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
	}
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatalf("DesireLRP %s: %v", guid, err)
	}
	indices := make([]int32, instances)
	for i := range indices {
		indices[i] = int32(i)
	}
	return &auctioneerv1.LRPStartRequest{
		ProcessGuid: guid, Domain: "apps", Indices: indices, Rootfs: d.Rootfs,
		Resources: &modelsv1.Resources{MemoryMb: memoryMB, DiskMb: 64}, PlacementConstraint: pc,
	}
}

// placementErrors maps "guid/index" to "CODE message" for the LRP's instances that have one.
func placementErrors(t *testing.T, env *bbstest.Env, guid string) map[string]string {
	t.Helper()
	resp, err := env.Client.ActualLRPs(ctxT(t), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}})
	if err != nil {
		t.Fatalf("ActualLRPs %s: %v", guid, err)
	}
	out := map[string]string{}
	for _, a := range resp.GetActualLrps() {
		if pe := a.GetPlacementError(); pe != nil {
			out[fmt.Sprintf("%s/%d", guid, a.GetKey().GetIndex())] = pe.GetCode().String() + " " + pe.GetMessage()
		}
	}
	return out
}

// requestLRPs calls RequestLRPAuctions, retrying while the auctioneer is not yet the leader.
func requestLRPs(t *testing.T, a *runningAuctioneer, starts ...*auctioneerv1.LRPStartRequest) {
	t.Helper()
	var err error
	testkit.Eventually(t, 15*time.Second, func() bool {
		_, err = a.client.RequestLRPAuctions(ctxT(t), &auctioneerv1.RequestLRPAuctionsRequest{Starts: starts})
		return status.Code(err) != codes.FailedPrecondition
	}, "the auctioneer to accept LRP auctions")
	if err != nil {
		t.Fatalf("RequestLRPAuctions: %v", err)
	}
}
