package peers

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
)

// fakeAuctioneer is an auctioneer that either leads (takes work) or stands by.
type fakeAuctioneer struct {
	auctioneerv1.UnimplementedAuctioneerServiceServer
	leader atomic.Bool
	addr   string
	stop   func()

	mu     sync.Mutex
	starts []string // process guids taken
	tasks  []string // task guids taken
}

func (f *fakeAuctioneer) RequestLRPAuctions(_ context.Context, req *auctioneerv1.RequestLRPAuctionsRequest) (*auctioneerv1.RequestLRPAuctionsResponse, error) {
	if !f.leader.Load() {
		return nil, status.Error(codes.FailedPrecondition, "not the leader")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range req.GetStarts() {
		f.starts = append(f.starts, s.GetProcessGuid())
	}
	return &auctioneerv1.RequestLRPAuctionsResponse{}, nil
}

func (f *fakeAuctioneer) RequestTaskAuctions(_ context.Context, req *auctioneerv1.RequestTaskAuctionsRequest) (*auctioneerv1.RequestTaskAuctionsResponse, error) {
	if !f.leader.Load() {
		return nil, status.Error(codes.FailedPrecondition, "not the leader")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range req.GetTasks() {
		f.tasks = append(f.tasks, t.GetTaskGuid())
	}
	return &auctioneerv1.RequestTaskAuctionsResponse{}, nil
}

func (f *fakeAuctioneer) taken() (starts, tasks []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.starts...), append([]string(nil), f.tasks...)
}

func startFake(t *testing.T, leader bool) *fakeAuctioneer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAuctioneer{addr: l.Addr().String()}
	f.leader.Store(leader)
	s := grpc.NewServer()
	auctioneerv1.RegisterAuctioneerServiceServer(s, f)
	go func() { _ = s.Serve(l) }()
	var once sync.Once
	f.stop = func() { once.Do(s.Stop) }
	t.Cleanup(f.stop)
	return f
}

// run starts a client of addrs and returns it with a function that queues one LRP.
func run(t *testing.T, addrs ...string) (*Auctioneer, func(guid string)) {
	t.Helper()
	a, err := DialAuctioneers(addrs, grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}}, time.Millisecond, logtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	a.attempt = time.Second
	t.Cleanup(func() { a.Close() }) // after Run returned: cleanups run last-in first-out
	testkit.Start(t, "auctioneer client", a)
	return a, func(guid string) {
		si := &modelsv1.DesiredLRPSchedulingInfo{ProcessGuid: guid, Domain: "d", Rootfs: "preloaded:x"}
		if err := a.RequestLRPAuctions(context.Background(), []core.LRPStart{{SchedulingInfo: si, Indices: []int32{0}}}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAuctioneerFollowsTheLeader(t *testing.T) {
	standby, leader := startFake(t, false), startFake(t, true)
	a, desire := run(t, standby.addr+","+leader.addr)

	desire("one")
	testkit.Eventually(t, 5*time.Second, func() bool { s, _ := leader.taken(); return len(s) == 1 }, "the leader to take one")
	task := &modelsv1.Task{TaskGuid: "task-1", Domain: "d", Definition: &modelsv1.TaskDefinition{Rootfs: "preloaded:x"}}
	if err := a.RequestTaskAuctions(context.Background(), []*modelsv1.Task{task}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { _, ts := leader.taken(); return len(ts) == 1 }, "the leader to take the task")

	// Failover: the leader dies, the standby is elected.
	leader.stop()
	standby.leader.Store(true)
	desire("two")
	testkit.Eventually(t, 5*time.Second, func() bool { s, _ := standby.taken(); return len(s) == 1 }, "the new leader to take two")
	if s, _ := standby.taken(); s[0] != "two" {
		t.Errorf("new leader took %v, want [two]", s)
	}
}

func TestAuctioneerDropsWorkNobodyTakes(t *testing.T) {
	s1, s2 := startFake(t, false), startFake(t, false)
	_, desire := run(t, s1.addr, s2.addr)
	desire("lost")
	time.Sleep(100 * time.Millisecond) // the flush fails on both and drops the work
	s2.leader.Store(true)
	desire("kept")
	testkit.Eventually(t, 5*time.Second, func() bool { s, _ := s2.taken(); return len(s) == 1 }, "the leader to take kept")
	if s, _ := s2.taken(); s[0] != "kept" {
		t.Errorf("leader took %v, want [kept]: dropped work must not be resent", s)
	}
	if s, _ := s1.taken(); len(s) != 0 {
		t.Errorf("standby took %v", s)
	}
}

func TestDialAuctioneersNeedsAnAddress(t *testing.T) {
	if _, err := DialAuctioneers([]string{" , "}, grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}}, time.Millisecond, logtest.New(t)); err == nil {
		t.Error("DialAuctioneers without an address succeeded")
	}
}
