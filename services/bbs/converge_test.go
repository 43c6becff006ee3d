package bbs_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gavel-sched/gavel/internal/testkit"
	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/bbs/internal/converge"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

const lrpSuspect = modelsv1.ActualLRP_PRESENCE_SUSPECT

// convClock is a settable clock shared by the BBS's core and its converger.
type convClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *convClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *convClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// convAuctioneer is an auctioneer that records what it is asked to place.
type convAuctioneer struct {
	auctioneerv1.UnimplementedAuctioneerServiceServer
	mu    sync.Mutex
	seen  map[string]int                      // "lrp:<guid>/<index>" and "task:<guid>" → requests
	peers map[string]*auctioneerv1.SpreadPeer // the spread peer of each guid's last start request
}

func (a *convAuctioneer) RequestLRPAuctions(_ context.Context, req *auctioneerv1.RequestLRPAuctionsRequest) (*auctioneerv1.RequestLRPAuctionsResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range req.GetStarts() {
		for _, i := range s.GetIndices() {
			a.seen[fmt.Sprintf("lrp:%s/%d", s.GetProcessGuid(), i)]++
		}
		a.peers[s.GetProcessGuid()] = s.GetSpreadPeer()
	}
	return &auctioneerv1.RequestLRPAuctionsResponse{}, nil
}

func (a *convAuctioneer) RequestTaskAuctions(_ context.Context, req *auctioneerv1.RequestTaskAuctionsRequest) (*auctioneerv1.RequestTaskAuctionsResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, task := range req.GetTasks() {
		a.seen["task:"+task.GetTaskGuid()]++
	}
	return &auctioneerv1.RequestTaskAuctionsResponse{}, nil
}

// peer is the spread peer of guid's last start request (nil: none, or no request).
func (a *convAuctioneer) peer(guid string) *auctioneerv1.SpreadPeer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peers[guid]
}

func (a *convAuctioneer) count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seen[key]
}

// waitCount waits until key has been requested at least n times.
func (a *convAuctioneer) waitCount(t *testing.T, key string, n int) {
	t.Helper()
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		got := a.count(key)
		return got >= n, fmt.Sprintf("%d requests", got)
	}, fmt.Sprintf("auctioneer got %s %d times", key, n))
}

func startConvAuctioneer(t *testing.T) (*convAuctioneer, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &convAuctioneer{seen: map[string]int{}, peers: map[string]*auctioneerv1.SpreadPeer{}}
	srv := grpc.NewServer()
	auctioneerv1.RegisterAuctioneerServiceServer(srv, a)
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return a, ln.Addr().String()
}

type convEnv struct {
	*bbstest.Env
	clock *convClock
	auc   *convAuctioneer
	conv  *converge.Converger
}

// convStart runs a BBS whose convergence the test drives, on a fake clock, with a recording
// auctioneer.
func convStart(t *testing.T) *convEnv {
	t.Helper()
	auc, addr := startConvAuctioneer(t)
	clock := &convClock{now: time.Now()}
	env := bbstest.StartWith(t, []bbs.Option{bbs.WithClock(clock.Now), bbs.WithManualConvergence()},
		func(c *bbs.Config) { c.AuctioneerAddress = addr })
	return &convEnv{Env: env, clock: clock, auc: auc, conv: env.Service.Converger()}
}

func (e *convEnv) converge(t *testing.T) converge.Report {
	t.Helper()
	r, err := e.conv.Converge(ctxT(t))
	if err != nil {
		t.Fatalf("converge: %v", err)
	}
	return r
}

// convPut writes an actual LRP record straight to etcd and waits until the BBS sees it.
func convPut(t *testing.T, env *bbstest.Env, a *modelsv1.ActualLRP) {
	t.Helper()
	b, err := proto.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	k := a.GetKey()
	if _, err := env.Etcd.Put(ctxT(t), store.ActualKey(k.GetProcessGuid(), k.GetIndex(), a.GetPresence()), string(b)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		for _, got := range actuals(t, env, k.GetProcessGuid()) {
			if got.GetKey().GetIndex() == k.GetIndex() && got.GetPresence() == a.GetPresence() && proto.Equal(got, a) {
				return true
			}
		}
		return false
	}, "record visible")
}

// convCellVisible waits until the BBS does (or does not) see a cell.
func convCellVisible(t *testing.T, env *bbstest.Env, id string, want bool) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool {
		_, ids := domCells(t, env)
		return strings.Contains(ids, id) == want
	}, fmt.Sprintf("cell %s visible=%v", id, want))
}

func convRegister(t *testing.T, env *bbstest.Env, id string) clientv3.LeaseID {
	t.Helper()
	lease := domRegisterCell(t, env, &modelsv1.CellPresence{CellId: id, RepAddress: "127.0.0.1:1", Zone: "z1",
		Capacity: &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 1024, Containers: 10}})
	convCellVisible(t, env, id, true)
	return lease
}

func convVanish(t *testing.T, env *bbstest.Env, id string, lease clientv3.LeaseID) {
	t.Helper()
	if _, err := env.Etcd.Revoke(ctxT(t), lease); err != nil {
		t.Fatalf("revoke lease of %s: %v", id, err)
	}
	convCellVisible(t, env, id, false)
}

func TestConvergeMissingAndStaleUnclaimed(t *testing.T) {
	e := convStart(t)
	lrpDesire(t, e.Env, "miss", 2)
	e.auc.waitCount(t, "lrp:miss/1", 1)

	// A lost instance record is created again and auctioned.
	if _, err := e.Etcd.Delete(ctxT(t), store.ActualKey("miss", 1, lrpOrdinary)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return len(actuals(t, e.Env, "miss")) == 1 }, "record deleted")
	r := e.converge(t)
	if r.LRPsMissing != 1 || r.Created != 1 || r.Reauctioned != 0 {
		t.Fatalf("report %+v, want 1 missing created and nothing re-auctioned", r)
	}
	if a := lrpStored(t, e.Env, "miss", 1, lrpOrdinary); a.GetState() != lrpUnclaimed {
		t.Fatalf("recreated instance %v, want UNCLAIMED", a)
	}
	e.auc.waitCount(t, "lrp:miss/1", 2)

	// UNCLAIMED instances are auctioned again only once they are 30 s old.
	e.clock.Advance(29 * time.Second)
	if r := e.converge(t); r.Reauctioned != 0 {
		t.Fatalf("after 29s re-auctioned %d, want 0", r.Reauctioned)
	}
	e.clock.Advance(time.Second)
	if r := e.converge(t); r.Reauctioned != 2 {
		t.Fatalf("after 30s re-auctioned %d, want 2", r.Reauctioned)
	}
	e.auc.waitCount(t, "lrp:miss/0", 2)
	e.auc.waitCount(t, "lrp:miss/1", 3)

	// An instance with a placement error is auctioned again at once.
	lrpDesire(t, e.Env, "perr", 1)
	if _, err := e.Client.FailActualLRP(ctxT(t), &bbsv1.FailActualLRPRequest{ProcessGuid: "perr", Index: 0,
		PlacementError: &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES, Message: "insufficient resources: memory"}}); err != nil {
		t.Fatalf("FailActualLRP: %v", err)
	}
	if r := e.converge(t); r.Reauctioned != 3 { // perr/0 at once, miss/0 and miss/1 still stale
		t.Fatalf("re-auctioned %d, want the instance with a placement error and the 2 stale ones", r.Reauctioned)
	}
	e.auc.waitCount(t, "lrp:perr/0", 2)
}

func TestConvergeExtraOnlyWhileDomainFresh(t *testing.T) {
	e := convStart(t)
	lrpDesire(t, e.Env, "shrunk", 1)
	extra := func(guid string, index int32, state modelsv1.ActualLRP_State, cell string) *modelsv1.ActualLRP {
		a := &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: guid, Index: index, Domain: "apps"},
			State: state, Presence: lrpOrdinary, Since: timestamppb.New(e.clock.Now()),
			ModificationTag: &modelsv1.ModificationTag{Epoch: "e", Index: 0}}
		if cell != "" {
			a.InstanceKey = lrpInstKey("ig-"+guid, cell)
			a.NetInfo = lrpNetInfo(61000)
		}
		convPut(t, e.Env, a)
		return a
	}
	extra("shrunk", 3, lrpUnclaimed, "")
	extra("ghost", 0, lrpUnclaimed, "")
	extra("ghost", 1, lrpRunning, "vanished-cell")

	// Domain "apps" is not fresh: extras are counted and left alone.
	r := e.converge(t)
	if r.LRPsExtra != 3 || r.Retired != 0 {
		t.Fatalf("report %+v, want 3 extra, none retired", r)
	}
	for _, k := range []struct {
		guid  string
		index int32
	}{{"shrunk", 3}, {"ghost", 0}, {"ghost", 1}} {
		if lrpStored(t, e.Env, k.guid, k.index, lrpOrdinary) == nil {
			t.Fatalf("%s/%d retired while its domain is stale", k.guid, k.index)
		}
	}

	// Fresh: every extra is retired (none holds a container on a live cell, so all are deleted).
	domUpsert(t, e.Env, "apps", 0)
	r = e.converge(t)
	if r.LRPsExtra != 3 || r.Retired != 3 {
		t.Fatalf("report %+v, want 3 extra retired", r)
	}
	if n := len(actuals(t, e.Env, "ghost")); n != 0 {
		t.Fatalf("ghost still has %d instances", n)
	}
	if got := actuals(t, e.Env, "shrunk"); len(got) != 1 || got[0].GetKey().GetIndex() != 0 {
		t.Fatalf("shrunk instances %v, want only index 0", got)
	}
	if r := e.converge(t); r.LRPsExtra != 0 || r.LRPsMissing != 0 {
		t.Fatalf("second pass %+v, want nothing to do", r)
	}
}

func TestConvergeCrashRestartSchedule(t *testing.T) {
	e := convStart(t)
	lrpRegisterCell(t, e.Env, "cell-1", "z1")
	lrpDesire(t, e.Env, "crashy", 1)

	// Diego's policy (pkg/models): crashes 1-3 restart at once, then 30s × 2^(n−3) capped at 16m.
	delays := map[int32]time.Duration{4: time.Minute, 5: 2 * time.Minute, 6: 4 * time.Minute, 7: 8 * time.Minute,
		8: 16 * time.Minute, 9: 16 * time.Minute, 10: 16 * time.Minute}
	for n := int32(1); n <= 10; n++ {
		ik := lrpInstKey(fmt.Sprintf("ig-%d", n), "cell-1")
		lrpClaim(t, e.Env, "crashy", 0, ik)
		lrpStart(t, e.Env, "crashy", 0, ik, lrpNetInfo(61000))
		after := lrpCrash(t, e.Env, "crashy", 0, ik, "boom")
		if after.GetCrashCount() != n {
			t.Fatalf("crash %d: count %d", n, after.GetCrashCount())
		}
		if n <= 3 {
			if after.GetState() != lrpUnclaimed {
				t.Fatalf("crash %d: state %v, want UNCLAIMED at once", n, after.GetState())
			}
			continue
		}
		if after.GetState() != lrpCrashed {
			t.Fatalf("crash %d: state %v, want CRASHED", n, after.GetState())
		}
		if d := models.RestartDelay(n); d != delays[n] {
			t.Fatalf("crash %d: policy delay %v, want %v", n, d, delays[n])
		}
		e.clock.Advance(delays[n] - time.Second)
		if r := e.converge(t); r.Restarted != 0 || r.CrashedLRPs != 1 {
			t.Fatalf("crash %d, %v later: report %+v, want still waiting", n, delays[n]-time.Second, r)
		}
		if a := lrpStored(t, e.Env, "crashy", 0, lrpOrdinary); a.GetState() != lrpCrashed {
			t.Fatalf("crash %d: restarted before its delay: %v", n, a)
		}
		e.clock.Advance(time.Second)
		if r := e.converge(t); r.Restarted != 1 {
			t.Fatalf("crash %d, %v later: report %+v, want restarted", n, delays[n], r)
		}
		a := lrpStored(t, e.Env, "crashy", 0, lrpOrdinary)
		if a.GetState() != lrpUnclaimed || a.GetCrashCount() != n {
			t.Fatalf("crash %d: after restart %v, want UNCLAIMED keeping the count", n, a)
		}
		e.auc.waitCount(t, "lrp:crashy/0", int(n)+1) // desire, 3 immediate restarts, then one per converged restart
	}

	// Five minutes RUNNING resets the count.
	ik := lrpInstKey("ig-long", "cell-1")
	lrpClaim(t, e.Env, "crashy", 0, ik)
	lrpStart(t, e.Env, "crashy", 0, ik, lrpNetInfo(61000))
	e.clock.Advance(5 * time.Minute)
	if a := lrpCrash(t, e.Env, "crashy", 0, ik, "boom"); a.GetCrashCount() != 1 || a.GetState() != lrpUnclaimed {
		t.Fatalf("crash after 5m running: %v, want count 1 and UNCLAIMED", a)
	}

	// Crash 200 is never restarted; 199 still is (after 16 minutes).
	ik = lrpInstKey("ig-199", "cell-1")
	cur := lrpStored(t, e.Env, "crashy", 0, lrpOrdinary)
	cur.CrashCount = 198
	convPut(t, e.Env, cur)
	lrpClaim(t, e.Env, "crashy", 0, ik)
	lrpStart(t, e.Env, "crashy", 0, ik, lrpNetInfo(61000))
	if a := lrpCrash(t, e.Env, "crashy", 0, ik, "boom"); a.GetCrashCount() != 199 || a.GetState() != lrpCrashed {
		t.Fatalf("crash 199: %v", a)
	}
	e.clock.Advance(16 * time.Minute)
	if r := e.converge(t); r.Restarted != 1 {
		t.Fatalf("crash 199 not restarted after 16m: %+v", r)
	}
	ik = lrpInstKey("ig-200", "cell-1")
	lrpClaim(t, e.Env, "crashy", 0, ik)
	lrpStart(t, e.Env, "crashy", 0, ik, lrpNetInfo(61000))
	if a := lrpCrash(t, e.Env, "crashy", 0, ik, "boom"); a.GetCrashCount() != 200 || a.GetState() != lrpCrashed {
		t.Fatalf("crash 200: %v", a)
	}
	for _, d := range []time.Duration{16 * time.Minute, time.Hour, 24 * time.Hour} {
		e.clock.Advance(d)
		if r := e.converge(t); r.Restarted != 0 || r.CrashedLRPs != 1 {
			t.Fatalf("crash 200 after another %v: %+v, want never restarted", d, r)
		}
	}
}

func TestConvergeSuspectReplacedThenRemoved(t *testing.T) {
	e := convStart(t)
	lease1 := convRegister(t, e.Env, "cell-1")
	convRegister(t, e.Env, "cell-2")
	lrpDesire(t, e.Env, "sus", 2)
	old := lrpInstKey("ig-old", "cell-1")
	running := lrpStart(t, e.Env, "sus", 0, old, lrpNetInfo(61001))
	lrpClaim(t, e.Env, "sus", 1, lrpInstKey("ig-claimed", "cell-1"))
	e.auc.waitCount(t, "lrp:sus/1", 1)

	convVanish(t, e.Env, "cell-1", lease1)
	r := e.converge(t)
	if r.Suspected != 2 {
		t.Fatalf("report %+v, want both instances of cell-1 handled", r)
	}
	sus := lrpStored(t, e.Env, "sus", 0, lrpSuspect)
	if sus == nil || sus.GetState() != lrpRunning || !proto.Equal(sus.GetInstanceKey(), old) || !proto.Equal(sus.GetNetInfo(), running.GetNetInfo()) {
		t.Fatalf("suspect copy %v, want the running instance of cell-1", sus)
	}
	if ord := lrpStored(t, e.Env, "sus", 0, lrpOrdinary); ord.GetState() != lrpUnclaimed || ord.GetInstanceKey() != nil {
		t.Fatalf("slot 0 %v, want UNCLAIMED for a replacement", ord)
	}
	if ord := lrpStored(t, e.Env, "sus", 1, lrpOrdinary); ord.GetState() != lrpUnclaimed {
		t.Fatalf("claimed slot 1 %v, want UNCLAIMED", ord)
	}
	if s := lrpStored(t, e.Env, "sus", 1, lrpSuspect); s != nil {
		t.Fatalf("a CLAIMED instance must not leave a suspect: %v", s)
	}
	e.auc.waitCount(t, "lrp:sus/0", 2)
	e.auc.waitCount(t, "lrp:sus/1", 2)
	if r := e.converge(t); r.SuspectLRPs != 1 || r.Suspected != 0 || r.Promoted != 0 || r.SuspectsRemoved != 0 {
		t.Fatalf("second pass %+v, want the suspect kept while its replacement is pending", r)
	}

	// The replacement runs: the suspect is removed in the same transaction.
	repl := lrpInstKey("ig-new", "cell-2")
	lrpClaim(t, e.Env, "sus", 0, repl)
	lrpStart(t, e.Env, "sus", 0, repl, lrpNetInfo(61002))
	if s := lrpStored(t, e.Env, "sus", 0, lrpSuspect); s != nil {
		t.Fatalf("suspect still stored after its replacement started: %v", s)
	}

	// A suspect left behind next to a running replacement is removed by convergence.
	sus.ModificationTag = &modelsv1.ModificationTag{Epoch: "x", Index: 9}
	convPut(t, e.Env, sus)
	if r := e.converge(t); r.SuspectsRemoved != 1 {
		t.Fatalf("report %+v, want the stale suspect removed", r)
	}
	if s := lrpStored(t, e.Env, "sus", 0, lrpSuspect); s != nil {
		t.Fatalf("stale suspect still stored: %v", s)
	}
}

// TestConvergeSuspectsOfALostCellTogether: the instances of a lost cell are replaced together,
// in transactions of at most 64 instances each: 145 instances of one cell (140 RUNNING, 5
// CLAIMED, so three groups) and one of another lost cell take at most four etcd revisions, and
// each is handled as alone: RUNNING ones leave a SUSPECT copy, every slot is unclaimed and sent
// for placement, and the instances of a cell that stayed are left alone.
func TestConvergeSuspectsOfALostCellTogether(t *testing.T) {
	e := convStart(t)
	lease1 := convRegister(t, e.Env, "cell-1")
	lease2 := convRegister(t, e.Env, "cell-2")
	convRegister(t, e.Env, "cell-3")
	lrpDesire(t, e.Env, "many", 150)
	lrpDesire(t, e.Env, "other", 1)
	for i := range int32(150) {
		ik := lrpInstKey(fmt.Sprintf("ig-%d", i), "cell-1")
		switch {
		case i >= 145:
			ik = lrpInstKey(fmt.Sprintf("ig-%d", i), "cell-3")
			lrpStart(t, e.Env, "many", i, ik, lrpNetInfo(uint32(61000+i)))
		case i >= 140:
			lrpClaim(t, e.Env, "many", i, ik)
		default:
			lrpStart(t, e.Env, "many", i, ik, lrpNetInfo(uint32(61000+i)))
		}
	}
	lrpStart(t, e.Env, "other", 0, lrpInstKey("ig-other", "cell-2"), lrpNetInfo(62000))

	convVanish(t, e.Env, "cell-1", lease1)
	convVanish(t, e.Env, "cell-2", lease2)
	revision := func() int64 {
		resp, err := e.Etcd.Get(ctxT(t), "gavel-test-revision")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	before := revision()
	if r := e.converge(t); r.Suspected != 146 || r.Errors != 0 {
		t.Fatalf("report %+v, want the 146 instances of the lost cells handled", r)
	}
	if n := revision() - before; n > 4 {
		t.Fatalf("the pass took %d etcd revisions, want at most 4 (a transaction per 64 instances of a cell)", n)
	}
	for i := range int32(150) {
		ord := lrpStored(t, e.Env, "many", i, lrpOrdinary)
		sus := lrpStored(t, e.Env, "many", i, lrpSuspect)
		switch {
		case i >= 145:
			if ord.GetState() != lrpRunning || sus != nil {
				t.Fatalf("instance %d on the cell that stayed: %v (suspect %v), want it RUNNING, untouched", i, ord, sus)
			}
			continue
		case i >= 140:
			if sus != nil {
				t.Fatalf("CLAIMED instance %d left a suspect: %v", i, sus)
			}
		default:
			if sus.GetState() != lrpRunning || sus.GetInstanceKey().GetCellId() != "cell-1" {
				t.Fatalf("instance %d: suspect %v, want the RUNNING instance of cell-1 kept", i, sus)
			}
		}
		if ord.GetState() != lrpUnclaimed || ord.GetInstanceKey() != nil {
			t.Fatalf("slot %d: %v, want UNCLAIMED", i, ord)
		}
		e.auc.waitCount(t, fmt.Sprintf("lrp:many/%d", i), 2)
	}
	if sus := lrpStored(t, e.Env, "other", 0, lrpSuspect); sus == nil {
		t.Fatal("the instance of cell-2 left no suspect")
	}
	e.auc.waitCount(t, "lrp:other/0", 2)
}

func TestConvergeSuspectPromotedWhenCellReturns(t *testing.T) {
	e := convStart(t)
	lease := convRegister(t, e.Env, "cell-1")
	convRegister(t, e.Env, "cell-2")
	lrpDesire(t, e.Env, "back", 1)
	old := lrpInstKey("ig-old", "cell-1")
	lrpStart(t, e.Env, "back", 0, old, lrpNetInfo(61001))

	convVanish(t, e.Env, "cell-1", lease)
	if r := e.converge(t); r.Suspected != 1 {
		t.Fatalf("report %+v, want a suspect", r)
	}
	repl := lrpInstKey("ig-new", "cell-2")
	lrpClaim(t, e.Env, "back", 0, repl)

	convRegister(t, e.Env, "cell-1")
	if r := e.converge(t); r.Promoted != 1 {
		t.Fatalf("report %+v, want the suspect promoted", r)
	}
	ord := lrpStored(t, e.Env, "back", 0, lrpOrdinary)
	if ord.GetState() != lrpRunning || !proto.Equal(ord.GetInstanceKey(), old) || ord.GetPresence() != lrpOrdinary {
		t.Fatalf("slot %v, want the old instance RUNNING as ordinary", ord)
	}
	if s := lrpStored(t, e.Env, "back", 0, lrpSuspect); s != nil {
		t.Fatalf("suspect still stored after promotion: %v", s)
	}
	_, err := e.Client.StartActualLRP(ctxT(t), &bbsv1.StartActualLRPRequest{ProcessGuid: "back", Index: 0, InstanceKey: repl, NetInfo: lrpNetInfo(61002)})
	wantCode(t, err, codes.FailedPrecondition)
	if r := e.converge(t); r.SuspectLRPs != 0 || r.Suspected != 0 || r.LRPsMissing != 0 {
		t.Fatalf("second pass %+v, want nothing to do", r)
	}
}

func TestConvergeTasks(t *testing.T) {
	e := convStart(t)
	convRegister(t, e.Env, "cell-live")
	cb := taskNewCallbackServer(t, http.StatusBadRequest, http.StatusOK)
	withCallback := taskDefinition()
	withCallback.CompletionCallbackUrl = cb.URL

	taskDesire(t, e.Env, "t-pending", "d", taskDefinition())
	taskDesire(t, e.Env, "t-vanished", "d", taskDefinition())
	taskDesire(t, e.Env, "t-live", "d", taskDefinition())
	taskDesire(t, e.Env, "t-callback", "d", withCallback)
	taskDesire(t, e.Env, "t-done", "d", taskDefinition())
	taskDesire(t, e.Env, "t-resolving", "d", taskDefinition())
	e.auc.waitCount(t, "task:t-pending", 1)
	start := func(guid, cell string) {
		if _, err := e.Client.StartTask(ctxT(t), &bbsv1.StartTaskRequest{TaskGuid: guid, CellId: cell}); err != nil {
			t.Fatalf("StartTask %s: %v", guid, err)
		}
	}
	complete := func(guid string) {
		if _, err := e.Client.CompleteTask(ctxT(t), &bbsv1.CompleteTaskRequest{TaskGuid: guid, CellId: "cell-live", Result: "ok"}); err != nil {
			t.Fatalf("CompleteTask %s: %v", guid, err)
		}
	}
	start("t-vanished", "cell-gone")
	for _, g := range []string{"t-live", "t-callback", "t-done", "t-resolving"} {
		start(g, "cell-live")
	}
	for _, g := range []string{"t-callback", "t-done", "t-resolving"} {
		complete(g)
	}
	if _, err := e.Client.ResolvingTask(ctxT(t), &bbsv1.ResolvingTaskRequest{TaskGuid: "t-resolving"}); err != nil {
		t.Fatalf("ResolvingTask: %v", err)
	}
	cb.waitRequests(t, 1, 10*time.Second) // answered 400: not retried by the worker itself

	// At once: the task on a vanished cell fails; nothing else changes.
	r := e.converge(t)
	if r.TasksFailed != 1 || r.TasksReauctioned != 0 || r.TasksDeleted != 0 || r.TaskCallbacksRetried != 0 {
		t.Fatalf("first pass %+v", r)
	}
	if v := taskStored(t, e.Env, "t-vanished"); !v.GetFailed() || v.GetFailureReason() != "cell disappeared before completion" {
		t.Fatalf("task on vanished cell: %v", v)
	}
	if l := taskStored(t, e.Env, "t-live"); l.GetState() != modelsv1.Task_STATE_RUNNING {
		t.Fatalf("task on live cell: %v", l)
	}

	// 30 s: the pending task is auctioned again and the failed callback retried (now 200:
	// resolved and deleted).
	e.clock.Advance(30 * time.Second)
	r = e.converge(t)
	if r.TasksReauctioned != 1 || r.TaskCallbacksRetried != 1 || r.TasksDeleted != 0 {
		t.Fatalf("pass at 30s %+v", r)
	}
	e.auc.waitCount(t, "task:t-pending", 2)
	// The worker may still be finishing the first delivery (a task in flight is not queued
	// twice); every later pass retries again until the callback is delivered.
	testkit.Eventually(t, 10*time.Second, func() bool {
		if len(cb.got()) >= 2 {
			return true
		}
		e.converge(t)
		return false
	}, "callback retried")
	taskWaitGone(t, e.Env, "t-callback", 10*time.Second)

	// 2 min after completion: completed and resolving tasks are deleted.
	e.clock.Advance(90 * time.Second)
	r = e.converge(t)
	if r.TasksDeleted != 3 { // t-done, t-resolving and the failed t-vanished
		t.Fatalf("pass at 2m %+v, want 3 deleted", r)
	}
	for _, g := range []string{"t-done", "t-resolving", "t-vanished"} {
		if taskStored(t, e.Env, g) != nil {
			t.Fatalf("%s not deleted", g)
		}
	}

	// 30 min: the pending task fails as never started.
	e.clock.Advance(28 * time.Minute)
	if r := e.converge(t); r.TasksFailed != 1 {
		t.Fatalf("pass at 30m %+v, want the pending task failed", r)
	}
	if p := taskStored(t, e.Env, "t-pending"); p.GetState() != modelsv1.Task_STATE_COMPLETED || !p.GetFailed() || p.GetFailureReason() != "not started within time limit" {
		t.Fatalf("pending task: %v", p)
	}
	if l := taskStored(t, e.Env, "t-live"); l.GetState() != modelsv1.Task_STATE_RUNNING {
		t.Fatalf("task on live cell changed: %v", l)
	}
}

// TestConvergenceLeaderTriggerAndMetrics runs two BBS instances with their convergence loops:
// one leads, a vanished cell makes the leader converge at once (not after the 30 s timer), and
// /metrics shows convergence's series.
func TestConvergenceLeaderTriggerAndMetrics(t *testing.T) {
	withMetrics := func(c *bbs.Config) { c.MetricsAddress = "127.0.0.1:0" }
	a := bbstest.StartWith(t, nil, withMetrics)
	b := bbstest.StartOnWith(t, a.Etcd, nil, withMetrics)
	testkit.Eventually(t, 10*time.Second, func() bool { return a.Service.IsLeader() != b.Service.IsLeader() }, "one leader")
	leader := a
	if b.Service.IsLeader() {
		leader = b
	}

	lease := convRegister(t, a, "cell-1")
	lrpDesire(t, a, "lead", 1)
	lrpStart(t, a, "lead", 0, lrpInstKey("ig", "cell-1"), lrpNetInfo(61000))
	if _, err := a.Etcd.Revoke(ctxT(t), lease); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return lrpStored(t, a, "lead", 0, lrpSuspect) != nil }, "suspect created by the leader")

	var body string
	testkit.Eventually(t, 10*time.Second, func() bool {
		body = testkit.Scrape(t, leader.Service.MetricsAddr())
		return strings.Contains(body, "gavel_bbs_convergence_runs_total ") && !strings.Contains(body, "gavel_bbs_convergence_runs_total 0")
	}, "metrics after a convergence")
	for _, name := range []string{"gavel_bbs_convergence_duration_seconds_count", "gavel_bbs_lrps_missing", "gavel_bbs_lrps_extra",
		"gavel_bbs_crashed_actual_lrps", "gavel_bbs_suspect_actual_lrps", `gavel_bbs_auctions_requested_total{kind="lrp"}`,
		`gavel_bbs_auctions_failed_total{kind="lrp"}`} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s:\n%s", name, body)
		}
	}
	t.Run("promtool", func(t *testing.T) { testkit.Promtool(t, body) })
}

func TestConvergeRemovesEvacuatingCopyOfVanishedCell(t *testing.T) {
	e := convStart(t)
	lease1 := convRegister(t, e.Env, "cell-1")
	convRegister(t, e.Env, "cell-2")
	lrpDesire(t, e.Env, "evac", 2)
	ik0, ik1 := lrpInstKey("ig-0", "cell-1"), lrpInstKey("ig-1", "cell-2")
	for i, ik := range []*modelsv1.ActualLRPInstanceKey{ik0, ik1} {
		lrpStart(t, e.Env, "evac", int32(i), ik, lrpNetInfo(uint32(61010+i)))
		resp, err := e.Client.EvacuateRunningActualLRP(ctxT(t), &bbsv1.EvacuateRunningActualLRPRequest{
			ProcessGuid: "evac", Index: int32(i), InstanceKey: ik, NetInfo: lrpNetInfo(uint32(61010 + i))})
		if err != nil || !resp.GetKeepContainer() {
			t.Fatalf("evacuate %d: %v %v", i, resp, err)
		}
	}
	if r := e.converge(t); r.EvacuatingRemoved != 0 {
		t.Fatalf("report %+v: evacuating copies on live cells must stay", r)
	}

	// cell-1 vanishes mid-evacuation: its copy goes, cell-2's stays.
	convVanish(t, e.Env, "cell-1", lease1)
	if r := e.converge(t); r.EvacuatingRemoved != 1 {
		t.Fatalf("report %+v, want the evacuating copy of cell-1 removed", r)
	}
	if a := lrpStored(t, e.Env, "evac", 0, modelsv1.ActualLRP_PRESENCE_EVACUATING); a != nil {
		t.Fatalf("evacuating copy of a vanished cell still stored: %v", a)
	}
	if a := lrpStored(t, e.Env, "evac", 1, modelsv1.ActualLRP_PRESENCE_EVACUATING); a == nil {
		t.Fatal("evacuating copy of a live cell removed")
	}

	// Scaled down: the copy of the slot no longer desired goes too.
	zero := int32(1)
	if _, err := e.Client.UpdateDesiredLRP(ctxT(t), &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "evac", Update: &modelsv1.DesiredLRPUpdate{Instances: &zero}}); err != nil {
		t.Fatal(err)
	}
	if r := e.converge(t); r.EvacuatingRemoved != 1 {
		t.Fatalf("report %+v, want the evacuating copy of the undesired slot removed", r)
	}
	if a := lrpStored(t, e.Env, "evac", 1, modelsv1.ActualLRP_PRESENCE_EVACUATING); a != nil {
		t.Fatalf("evacuating copy of an undesired slot still stored: %v", a)
	}
}

// TestConvergeUnclaimsStaleClaimed: an instance CLAIMED on a present cell whose rep never
// reports it running is unclaimed and auctioned again once it has been CLAIMED for the claimed
// timeout (5 min), not before; a younger claim is left alone. Afterwards one container holds the
// slot whichever report comes first: once the replacement has claimed it, the old container's
// late start is refused (its rep stops it); a late start that comes first is accepted (the BBS
// starts an UNCLAIMED slot, as Diego does) and the replacement's claim is refused.
func TestConvergeUnclaimsStaleClaimed(t *testing.T) {
	e := convStart(t)
	convRegister(t, e.Env, "cell-1")
	lrpDesire(t, e.Env, "stale", 2)
	e.auc.waitCount(t, "lrp:stale/0", 1)
	old := lrpInstKey("ig-old", "cell-1")
	lrpClaim(t, e.Env, "stale", 0, old)
	e.clock.Advance(4 * time.Minute)
	lrpClaim(t, e.Env, "stale", 1, lrpInstKey("ig-young", "cell-1"))

	e.clock.Advance(time.Minute - time.Second)
	if r := e.converge(t); r.Unclaimed != 0 || r.StaleClaimedLRPs != 0 {
		t.Fatalf("report %+v after 4m59s, want nothing unclaimed", r)
	}
	e.clock.Advance(time.Second)
	if r := e.converge(t); r.Unclaimed != 1 || r.StaleClaimedLRPs != 1 {
		t.Fatalf("report %+v after 5m, want the old claim unclaimed", r)
	}
	if a := lrpStored(t, e.Env, "stale", 0, lrpOrdinary); a.GetState() != lrpUnclaimed || a.GetInstanceKey() != nil {
		t.Fatalf("stale instance %v, want UNCLAIMED without an instance", a)
	}
	if a := lrpStored(t, e.Env, "stale", 1, lrpOrdinary); a.GetState() != modelsv1.ActualLRP_STATE_CLAIMED {
		t.Fatalf("young claim %v, want still CLAIMED", a)
	}
	e.auc.waitCount(t, "lrp:stale/0", 2)

	lrpClaim(t, e.Env, "stale", 0, lrpInstKey("ig-new", "cell-1"))
	_, err := e.Client.StartActualLRP(ctxT(t), &bbsv1.StartActualLRPRequest{ProcessGuid: "stale", Index: 0, InstanceKey: old, NetInfo: lrpNetInfo(61001)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("late start report of the unclaimed container after the replacement's claim = %v, want FailedPrecondition", err)
	}

	e.clock.Advance(5 * time.Minute)
	if r := e.converge(t); r.Unclaimed != 2 { // the young claim, and the replacement that never started
		t.Fatalf("report %+v, want both stale claims unclaimed", r)
	}
	lrpStart(t, e.Env, "stale", 1, lrpInstKey("ig-young", "cell-1"), lrpNetInfo(61002))
	_, err = e.Client.ClaimActualLRP(ctxT(t), &bbsv1.ClaimActualLRPRequest{ProcessGuid: "stale", Index: 1, InstanceKey: lrpInstKey("ig-late", "cell-1")})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("replacement's claim after the old container started = %v, want FailedPrecondition", err)
	}
}
