package auction

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/reppool"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

// fakeBBS lists fixed cells and records placement failures. With rev set it answers a listing
// that knows rev as unchanged, as the BBS does, and records the revisions it was asked about.
type fakeBBS struct {
	cells    []*modelsv1.CellPresence
	cellsErr error
	rev      int64
	mu       sync.Mutex
	known    []int64
	failed   map[string]*modelsv1.PlacementError // "guid/index" or "task:guid"
}

func (b *fakeBBS) Cells(_ context.Context, in *bbsv1.CellsRequest, _ ...grpc.CallOption) (*bbsv1.CellsResponse, error) {
	if b.cellsErr != nil {
		return nil, b.cellsErr
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.known = append(b.known, in.GetKnownRevision())
	if b.rev > 0 && in.GetKnownRevision() == b.rev {
		return &bbsv1.CellsResponse{Revision: b.rev, Unchanged: true}, nil
	}
	return &bbsv1.CellsResponse{Cells: b.cells, Revision: b.rev}, nil
}

func (b *fakeBBS) FailActualLRP(_ context.Context, in *bbsv1.FailActualLRPRequest, _ ...grpc.CallOption) (*bbsv1.FailActualLRPResponse, error) {
	b.record((&placement.Work{Kind: placement.KindLRP, ProcessGuid: in.GetProcessGuid(), Index: in.GetIndex()}).Key(), in.GetPlacementError())
	return &bbsv1.FailActualLRPResponse{}, nil
}

func (b *fakeBBS) RejectTask(_ context.Context, in *bbsv1.RejectTaskRequest, _ ...grpc.CallOption) (*bbsv1.RejectTaskResponse, error) {
	if in.GetRejectionReason() != in.GetPlacementError().GetMessage() {
		return nil, status.Error(codes.InvalidArgument, "reason differs from the placement error")
	}
	b.record((&placement.Work{Kind: placement.KindTask, TaskGuid: in.GetTaskGuid()}).Key(), in.GetPlacementError())
	return &bbsv1.RejectTaskResponse{}, nil
}

func (b *fakeBBS) record(key string, pe *modelsv1.PlacementError) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failed == nil {
		b.failed = map[string]*modelsv1.PlacementError{}
	}
	b.failed[key] = pe
}

// fakeRep is an in-memory rep client.
type fakeRep struct {
	repv1.RepServiceClient // unused methods panic
	state                  *repv1.StateResponse
	stateErr               error
	performErr             error
	refuseAll              bool
	mu                     sync.Mutex
	performed              []*repv1.PerformRequest
	stateCalls             int
}

func (r *fakeRep) State(context.Context, *repv1.StateRequest, ...grpc.CallOption) (*repv1.StateResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stateCalls++
	return r.state, r.stateErr
}

// states is how many times the rep was asked for its State.
func (r *fakeRep) states() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stateCalls
}

func (r *fakeRep) Perform(_ context.Context, in *repv1.PerformRequest, _ ...grpc.CallOption) (*repv1.PerformResponse, error) {
	r.mu.Lock()
	r.performed = append(r.performed, in)
	r.mu.Unlock()
	if r.performErr != nil {
		return nil, r.performErr
	}
	if r.refuseAll {
		return &repv1.PerformResponse{FailedLrps: in.GetLrps(), FailedTasks: in.GetTasks()}, nil
	}
	if !in.GetIncludeState() {
		return &repv1.PerformResponse{}, nil
	}
	// Asked for its state: take the work's room, as a rep does, and answer the state after.
	r.mu.Lock()
	defer r.mu.Unlock()
	st := proto.Clone(r.state).(*repv1.StateResponse)
	for _, l := range in.GetLrps() {
		st.AvailableResources.MemoryMb -= l.GetResources().GetMemoryMb()
		st.AvailableResources.DiskMb -= l.GetResources().GetDiskMb()
		st.AvailableResources.Containers--
		st.StartingContainerCount++
	}
	r.state = st
	return &repv1.PerformResponse{State: proto.Clone(st).(*repv1.StateResponse)}, nil
}

// got lists the work the rep accepted or was offered, as keys.
func (r *fakeRep) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, p := range r.performed {
		for _, l := range p.GetLrps() {
			out = append(out, (&placement.Work{Kind: placement.KindLRP, ProcessGuid: l.GetKey().GetProcessGuid(), Index: l.GetKey().GetIndex()}).Key())
		}
		for _, t := range p.GetTasks() {
			out = append(out, "task/"+t.GetTaskGuid())
		}
	}
	slices.Sort(out)
	return out
}

type fakeReps map[string]*fakeRep

func (f fakeReps) Client(_, addr string) (repv1.RepServiceClient, error) {
	r, ok := f[addr]
	if !ok {
		return nil, errors.New("no such rep")
	}
	return r, nil
}

// env is a BBS with cells a (zone z1), b (zone z2), both 1 GiB / 10 containers, tag "web".
func env(t *testing.T) (*fakeBBS, fakeReps) {
	t.Helper()
	bbs := &fakeBBS{}
	reps := fakeReps{}
	for _, c := range []struct{ id, zone string }{{"a", "z1"}, {"b", "z2"}} {
		addr := c.id + ":1"
		bbs.cells = append(bbs.cells, &modelsv1.CellPresence{CellId: c.id, RepAddress: addr, Zone: c.zone})
		capacity := &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 4096, Containers: 10}
		reps[addr] = &fakeRep{state: &repv1.StateResponse{
			CellId: c.id, Zone: c.zone, TotalResources: capacity, AvailableResources: capacity,
			PlacementTags: []string{"web"}, PreloadedRootfses: []string{"cflinuxfs4"}, RootfsProviders: []string{"docker"},
		}}
	}
	return bbs, reps
}

func lrpStart(guid string, memory int32, indices ...int32) *auctioneerv1.LRPStartRequest {
	return &auctioneerv1.LRPStartRequest{
		ProcessGuid: guid, Domain: "apps", Indices: indices, Rootfs: "preloaded:cflinuxfs4",
		Resources: &modelsv1.Resources{MemoryMb: memory, DiskMb: 10},
	}
}

func TestRoundPlacesAndReports(t *testing.T) {
	bbs, reps := env(t)
	bbs.cells = append(bbs.cells, &modelsv1.CellPresence{CellId: "c", RepAddress: "c:1", Zone: "z3"})
	reps["c:1"] = &fakeRep{stateErr: status.Error(codes.Unavailable, "down")}
	r := NewRunner(bbs, reps, Config{}, logtest.New(t))

	picky := lrpStart("picky", 64, 0)
	picky.PlacementConstraint = &modelsv1.PlacementConstraint{Require: []string{"gpu"}}
	works := LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 128, 0, 1, 2, 3), lrpStart("huge", 4096, 0), picky})
	works = append(works, TaskWork([]*auctioneerv1.TaskStartRequest{{TaskGuid: "t1", Domain: "apps", Rootfs: "docker:///x", Resources: &modelsv1.Resources{MemoryMb: 64}}})...)
	res, err := r.Run(context.Background(), works)
	if err != nil {
		t.Fatal(err)
	}
	if res.Cells != 3 || res.Unreachable != 1 {
		t.Fatalf("cells %d unreachable %d", res.Cells, res.Unreachable)
	}
	// web spreads 2/2 over the zones; the task goes to the emptier cell.
	if a, b := reps["a:1"].got(), reps["b:1"].got(); len(a)+len(b) != 5 ||
		!slices.Contains(append(a, b...), "task/t1") ||
		countPrefix(a, "lrp/web/") != 2 || countPrefix(b, "lrp/web/") != 2 {
		t.Fatalf("a got %v, b got %v", a, b)
	}
	want := map[string]string{
		"lrp/huge/0":  "CODE_INSUFFICIENT_RESOURCES insufficient resources: memory (2 compatible cells)",
		"lrp/picky/0": `CODE_CELL_MISMATCH found no compatible cell: 0/3 cells eligible (2 lack tag "gpu", 1 lacks rootfs "preloaded:cflinuxfs4")`,
	}
	if got := failures(bbs); !equalMaps(got, want) {
		t.Fatalf("failures %v\nwant %v", got, want)
	}
}

// TestRoundKeepsAnUnchangedCellList checks that a round sends the revision of the cell list it
// holds and places over that list when the BBS answers unchanged, and takes a new list when
// the cells changed.
func TestRoundKeepsAnUnchangedCellList(t *testing.T) {
	bbs, reps := env(t)
	bbs.rev = 7
	r := NewRunner(bbs, reps, Config{}, logtest.New(t))
	round := func(guid string) Result {
		t.Helper()
		res, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart(guid, 128, 0)}))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Placed) != 1 {
			t.Fatalf("round of %s: placed %v, failed %v over %d cells", guid, res.Placed, res.Failed, res.Cells)
		}
		return res
	}
	round("first")
	if res := round("second"); res.Cells != 2 {
		t.Fatalf("the unchanged list gave %d cells, want 2", res.Cells)
	}
	bbs.mu.Lock()
	bbs.rev = 9
	bbs.cells = append(bbs.cells, &modelsv1.CellPresence{CellId: "c", RepAddress: "c:1", Zone: "z3"})
	bbs.mu.Unlock()
	state := proto.Clone(reps["a:1"].state).(*repv1.StateResponse)
	state.CellId, state.Zone = "c", "z3"
	reps["c:1"] = &fakeRep{state: state}
	if res := round("third"); res.Cells != 3 {
		t.Fatalf("the changed list gave %d cells, want 3", res.Cells)
	}
	bbs.mu.Lock()
	defer bbs.mu.Unlock()
	if want := []int64{0, 7, 7}; !slices.Equal(bbs.known, want) {
		t.Fatalf("rounds asked for the cells knowing revisions %v, want %v", bbs.known, want)
	}
}

func TestRoundRetriesRefusedWorkOnce(t *testing.T) {
	bbs, reps := env(t)
	reps["a:1"].refuseAll = true
	r := NewRunner(bbs, reps, Config{}, logtest.New(t))
	res, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 128, 0, 1)}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Placed["lrp/web/0"] != "b" || res.Placed["lrp/web/1"] != "b" || len(res.Failed) != 0 {
		t.Fatalf("placed %v failed %v", res.Placed, res.Failed)
	}
	// a was offered one instance (spread), refused it; b got both in the end.
	if got := reps["a:1"].got(); len(got) != 1 {
		t.Fatalf("a offered %v", got)
	}

	// Both cells fail: the retry fails as CELL_COMMUNICATION.
	bbs, reps = env(t)
	reps["a:1"].performErr = status.Error(codes.Unavailable, "connection refused")
	reps["b:1"].refuseAll = true
	r = NewRunner(bbs, reps, Config{}, logtest.New(t))
	if _, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 128, 0)})); err != nil {
		t.Fatal(err)
	}
	if got := failures(bbs)["lrp/web/0"]; got != "CODE_CELL_COMMUNICATION cells a and b could not start it (the cell refused it)" {
		t.Fatalf("failure %q", got)
	}
	if len(reps["a:1"].got())+len(reps["b:1"].got()) != 2 {
		t.Fatalf("offered %v and %v, want one offer each", reps["a:1"].got(), reps["b:1"].got())
	}
}

func TestRoundInFlightLimit(t *testing.T) {
	bbs, reps := env(t)
	reps["a:1"].state.StartingContainerCount = 1
	r := NewRunner(bbs, reps, Config{MaxInFlight: 3}, logtest.New(t))
	res, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 128, 0, 1, 2, 3)}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Placed) != 2 || len(res.Failed) != 2 {
		t.Fatalf("placed %v failed %v", res.Placed, res.Failed)
	}
	for k, f := range res.Failed {
		if f.Code != modelsv1.PlacementError_CODE_IN_FLIGHT_LIMIT || (k != "lrp/web/2" && k != "lrp/web/3") {
			t.Fatalf("%s: %v", k, f)
		}
	}
}

func TestRoundDefersOverTheInFlightLimit(t *testing.T) {
	bbs, reps := env(t)
	reps["a:1"].state.StartingContainerCount = 1
	r := NewRunner(bbs, reps, Config{MaxInFlight: 3, DeferOverLimit: true}, logtest.New(t))
	res, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 128, 0, 1, 2, 3)}))
	if err != nil {
		t.Fatal(err)
	}
	var deferred []string
	for _, w := range res.Deferred {
		deferred = append(deferred, w.Key())
	}
	slices.Sort(deferred)
	if len(res.Placed) != 2 || len(res.Failed) != 0 || !slices.Equal(deferred, []string{"lrp/web/2", "lrp/web/3"}) {
		t.Fatalf("placed %v failed %v deferred %v", res.Placed, res.Failed, deferred)
	}
	bbs.mu.Lock()
	defer bbs.mu.Unlock()
	if len(bbs.failed) != 0 {
		t.Fatalf("failures reported to the BBS: %v, want none for deferred work", bbs.failed)
	}
}

func TestRoundWithoutCellList(t *testing.T) {
	bbs, reps := env(t)
	bbs.cellsErr = status.Error(codes.Unavailable, "bbs down")
	_, err := NewRunner(bbs, reps, Config{}, logtest.New(t)).Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 1, 0)}))
	if !errors.Is(err, ErrListCells) || len(bbs.failed) != 0 {
		t.Fatalf("err %v, failures %v", err, bbs.failed)
	}
}

func TestRoundClosesConnectionsOfDepartedCells(t *testing.T) {
	p := reppool.New(grpcClientConfig())
	t.Cleanup(func() { _ = p.Close() })
	if _, err := p.Client("gone", "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	bbs := &fakeBBS{cells: []*modelsv1.CellPresence{{CellId: "a", RepAddress: "127.0.0.1:2"}}}
	if _, err := NewRunner(bbs, p, Config{StateTimeout: time.Second}, logtest.New(t)).Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	// The round dialled cell a for its state; the connection of the cell that left is closed.
	if p.Len() != 1 {
		t.Fatalf("%d connections after the round, want 1 (cell a)", p.Len())
	}
}

func TestConnectDialsEveryRegisteredCell(t *testing.T) {
	p := reppool.New(grpcClientConfig())
	t.Cleanup(func() { _ = p.Close() })
	var addrs []string
	accepted := make(chan string, 2)
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		addrs = append(addrs, l.Addr().String())
		go func() {
			if c, err := l.Accept(); err == nil {
				accepted <- l.Addr().String()
				c.Close()
			}
		}()
	}
	bbs := &fakeBBS{cells: []*modelsv1.CellPresence{{CellId: "a", RepAddress: addrs[0]}, {CellId: "b", RepAddress: addrs[1]}}}
	if err := NewRunner(bbs, p, Config{}, logtest.New(t)).Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Both cells are dialled before any round asks them anything.
	for range 2 {
		select {
		case <-accepted:
		case <-time.After(10 * time.Second):
			t.Fatal("Connect did not dial every registered cell")
		}
	}
	if p.Len() != 2 {
		t.Fatalf("%d connections, want 2", p.Len())
	}
	// A cell that left has its connection closed.
	bbs.cells = bbs.cells[:1]
	if err := NewRunner(bbs, p, Config{}, logtest.New(t)).Connect(context.Background()); err != nil || p.Len() != 1 {
		t.Fatalf("Connect after cell b left: %v, %d connections; want 1", err, p.Len())
	}
	bbs.cellsErr = errors.New("bbs down")
	if err := NewRunner(bbs, p, Config{}, logtest.New(t)).Connect(context.Background()); !errors.Is(err, ErrListCells) {
		t.Fatalf("Connect with the BBS down = %v, want ErrListCells", err)
	}
}

func countPrefix(keys []string, prefix string) int {
	n := 0
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

func failures(b *fakeBBS) map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]string{}
	for k, pe := range b.failed {
		out[k] = pe.GetCode().String() + " " + pe.GetMessage()
	}
	return out
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func grpcClientConfig() grpcx.ClientConfig {
	return grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}}
}

// TestRoundMatchingCellsUnavailable: when the cells that match the work exist but are
// evacuating, do not answer State, or fail Perform, the placement error is
// INSUFFICIENT_RESOURCES or CELL_COMMUNICATION with the cells counted per reason, never
// CELL_MISMATCH (which means no cell could ever run it).
func TestRoundMatchingCellsUnavailable(t *testing.T) {
	withPresence := func(bbs *fakeBBS) {
		for _, p := range bbs.cells { // what the cells registered: tags and rootfses
			p.PlacementTags, p.PreloadedRootfses = []string{"web"}, map[string]string{"cflinuxfs4": "/rootfs"}
		}
	}
	tests := []struct {
		name   string
		breakA func(*fakeRep)
		breakB func(*fakeRep)
		want   string
	}{
		{"both evacuating", func(r *fakeRep) { r.state.Evacuating = true }, func(r *fakeRep) { r.state.Evacuating = true },
			"CODE_INSUFFICIENT_RESOURCES insufficient resources: no compatible cell takes work (2 compatible cells: 2 are evacuating)"},
		{"state failed on both", func(r *fakeRep) { r.stateErr = status.Error(codes.Unavailable, "down") }, func(r *fakeRep) { r.stateErr = status.Error(codes.Unavailable, "down") },
			"CODE_CELL_COMMUNICATION could not reach any compatible cell: 0/2 compatible cells available (2 did not answer)"},
		{"one evacuating, one unreachable", func(r *fakeRep) { r.state.Evacuating = true }, func(r *fakeRep) { r.stateErr = status.Error(codes.Unavailable, "down") },
			"CODE_CELL_COMMUNICATION could not reach any compatible cell: 0/2 compatible cells available (1 is evacuating, 1 did not answer)"},
		{"one losing its presence, one evacuating", func(r *fakeRep) { r.state.PresenceLapsed = true }, func(r *fakeRep) { r.state.Evacuating = true },
			"CODE_CELL_COMMUNICATION could not reach any compatible cell: 0/2 compatible cells available (1 is losing its presence, 1 is evacuating)"},
		{"both losing their presence", func(r *fakeRep) { r.state.PresenceLapsed = true }, func(r *fakeRep) { r.state.PresenceLapsed = true },
			"CODE_CELL_COMMUNICATION could not reach any compatible cell: 0/2 compatible cells available (2 are losing their presence)"},
		{"perform failed, the other evacuating", func(r *fakeRep) { r.performErr = status.Error(codes.Unavailable, "connection refused") }, func(r *fakeRep) { r.state.Evacuating = true },
			"CODE_CELL_COMMUNICATION cell a could not start it (perform failed: connection refused), and no other cell could take it: " +
				"could not reach any compatible cell: 0/2 compatible cells available (1 already refused it, 1 is evacuating)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bbs, reps := env(t)
			withPresence(bbs)
			tt.breakA(reps["a:1"])
			tt.breakB(reps["b:1"])
			r := NewRunner(bbs, reps, Config{}, logtest.New(t))
			if _, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 128, 0)})); err != nil {
				t.Fatal(err)
			}
			if got := failures(bbs)["lrp/web/0"]; got != tt.want {
				t.Fatalf("failure %q\nwant      %q", got, tt.want)
			}
		})
	}
}

// TestRoundReusesKnownStates: with StateMaxAge, a cell's last known state stands in for State:
// the state its Perform answered after taking the work (so the next round sees that room
// taken), or its last State answer. A failed Perform, an older state, a rep at another address
// and a departed cell are asked (or forgotten) again.
func TestRoundReusesKnownStates(t *testing.T) {
	bbs, reps := env(t)
	r := NewRunner(bbs, reps, Config{StateMaxAge: time.Hour}, logtest.New(t))
	a, b := reps["a:1"], reps["b:1"]
	round := func(starts ...*auctioneerv1.LRPStartRequest) Result {
		t.Helper()
		res, err := r.Run(context.Background(), LRPWork(starts))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	// Round 1 asks both cells; the tie goes to a, which answers its state after taking 128 MiB.
	if res := round(lrpStart("web", 128, 0)); res.Placed["lrp/web/0"] != "a" || res.Reused != 0 {
		t.Fatalf("round 1 placed %v, reused %d", res.Placed, res.Reused)
	}
	// Round 2 asks nobody. 900 MiB no longer fit on a (896 left, as its Perform said; its first
	// State said 1,024, and the tie would have gone to a): it goes to b.
	if res := round(lrpStart("api", 900, 0)); res.Placed["lrp/api/0"] != "b" || res.Reused != 2 {
		t.Fatalf("round 2 placed %v, reused %d", res.Placed, res.Reused)
	}
	if a.states() != 1 || b.states() != 1 {
		t.Fatalf("State asked %d and %d times, want once each", a.states(), b.states())
	}
	// A failed Perform forgets the cell's state: the next round asks it.
	a.performErr = status.Error(codes.Unavailable, "down")
	round(lrpStart("db", 64, 0)) // a is emptier than b: tried first, fails, retried on b
	a.performErr = nil
	round(lrpStart("db", 64, 1))
	if a.states() != 2 || b.states() != 1 {
		t.Fatalf("after a failed Perform on a: State asked %d and %d times, want 2 and 1", a.states(), b.states())
	}
	// A state older than StateMaxAge is asked again.
	r.mu.Lock()
	k := r.states["b"]
	k.at = time.Now().Add(-2 * time.Hour)
	r.states["b"] = k
	r.mu.Unlock()
	round(lrpStart("web", 64, 1))
	if b.states() != 2 {
		t.Fatalf("an old state was reused: b asked %d times, want 2", b.states())
	}
	// A rep at another address is asked; a departed cell's state is dropped.
	reps["a:2"] = a
	bbs.cells = []*modelsv1.CellPresence{{CellId: "a", RepAddress: "a:2", Zone: "z1"}}
	round(lrpStart("web", 64, 2))
	if a.states() != 3 {
		t.Fatalf("a cell at a new address was not asked: %d", a.states())
	}
	r.mu.Lock()
	_, kept := r.states["b"]
	r.mu.Unlock()
	if kept {
		t.Fatal("the state of a departed cell was kept")
	}
}

// TestRoundAsksEveryCellWithoutMaxAge: with no StateMaxAge every round asks every cell, and
// Perform does not ask for the state.
func TestRoundAsksEveryCellWithoutMaxAge(t *testing.T) {
	bbs, reps := env(t)
	r := NewRunner(bbs, reps, Config{}, logtest.New(t))
	for i := range 3 {
		if _, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 64, int32(i))})); err != nil {
			t.Fatal(err)
		}
	}
	if reps["a:1"].states() != 3 || reps["b:1"].states() != 3 {
		t.Fatalf("State asked %d and %d times, want 3 each", reps["a:1"].states(), reps["b:1"].states())
	}
	for _, rep := range reps {
		for _, p := range rep.performed {
			if p.GetIncludeState() {
				t.Fatal("Perform asked for the state without StateMaxAge")
			}
		}
	}
}

// TestRoundAsksEveryCellNearTheInFlightLimit: once a round ends with half of MaxInFlight
// containers starting, the next asks every cell, so the limit is judged on fresh counts.
func TestRoundAsksEveryCellNearTheInFlightLimit(t *testing.T) {
	bbs, reps := env(t)
	r := NewRunner(bbs, reps, Config{StateMaxAge: time.Hour, MaxInFlight: 4}, logtest.New(t))
	run := func(index int32) Result {
		t.Helper()
		res, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("web", 64, index)}))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	run(0) // asks both; ends with 1 starting
	if res := run(1); res.Reused != 2 {
		t.Fatalf("far from the limit, reused %d states, want 2", res.Reused)
	}
	// The last round ended with two containers starting: half the limit. Its Perform did not ask
	// for a state it could not reuse.
	if res := run(2); res.Reused != 0 {
		t.Fatalf("at half the limit, reused %d states, want 0", res.Reused)
	}
	var asked []bool
	for _, addr := range []string{"a:1", "b:1"} {
		for _, p := range reps[addr].performed {
			asked = append(asked, p.GetIncludeState())
		}
	}
	// Only the first round ended far enough from the limit (one starting) for its state to be
	// reused.
	if n := len(slices.DeleteFunc(asked, func(b bool) bool { return !b })); len(asked) != 3 || n != 1 {
		t.Fatalf("%d of %d Performs asked for the state, want 1 of 3", n, len(asked))
	}
}

// manyCells is a BBS with n cells "c00".. in three zones, each 1 GiB / 10 containers; the last
// one alone carries the tag "gpu".
func manyCells(t *testing.T, n int) (*fakeBBS, fakeReps) {
	t.Helper()
	bbs := &fakeBBS{}
	reps := fakeReps{}
	for i := range n {
		id, zone := fmt.Sprintf("c%02d", i), fmt.Sprintf("z%d", i%3)
		addr := id + ":1"
		bbs.cells = append(bbs.cells, &modelsv1.CellPresence{CellId: id, RepAddress: addr, Zone: zone})
		capacity := &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 4096, Containers: 10}
		tags := []string{"web"}
		if i == n-1 {
			tags = append(tags, "gpu")
		}
		reps[addr] = &fakeRep{state: &repv1.StateResponse{
			CellId: id, Zone: zone, TotalResources: capacity, AvailableResources: capacity,
			PlacementTags: tags, PreloadedRootfses: []string{"cflinuxfs4"},
		}}
	}
	return bbs, reps
}

// statesAsked sums the State calls every rep answered.
func statesAsked(reps fakeReps) int {
	n := 0
	for _, r := range reps {
		n += r.states()
	}
	return n
}

// TestRoundAsksASampleOfCells: with SampleCells a round of W items asks max(SampleCells,
// W/WorkPerSampledCell) cells for their states, a different random sample each round, and
// every cell once that is as many.
func TestRoundAsksASampleOfCells(t *testing.T) {
	bbs, reps := manyCells(t, 40)
	r := NewRunner(bbs, reps, Config{SampleCells: 8}, logtest.New(t))
	round := func(guid string, n int) Result {
		t.Helper()
		indices := make([]int32, n)
		for i := range indices {
			indices[i] = int32(i)
		}
		res, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart(guid, 16, indices...)}))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Placed) != n || len(res.Failed) != 0 || res.Widened || res.Cells != 40 {
			t.Fatalf("round of %d: placed %d, failed %v, widened %v, cells %d", n, len(res.Placed), res.Failed, res.Widened, res.Cells)
		}
		return res
	}
	seen := map[string]bool{}
	for i := range 5 {
		before := statesAsked(reps)
		if res := round(fmt.Sprintf("small-%d", i), 4); res.Asked != 8 || statesAsked(reps)-before != 8 {
			t.Fatalf("a round of 4 asked %d cells (%d State calls), want the sample of 8", res.Asked, statesAsked(reps)-before)
		}
		for _, r := range reps {
			if r.states() > 0 {
				seen[r.state.GetCellId()] = true
			}
		}
	}
	// Five random samples of 8 out of 40 cover more than 8 cells (all five alike: about 1e-34).
	if len(seen) <= 8 {
		t.Fatalf("five rounds asked the same %d cells", len(seen))
	}
	before := statesAsked(reps)
	if res := round("medium", 100); res.Asked != 25 || statesAsked(reps)-before != 25 {
		t.Fatalf("a round of 100 asked %d cells (%d State calls), want 100/4 = 25", res.Asked, statesAsked(reps)-before)
	}
	before = statesAsked(reps)
	if res := round("large", 160); res.Asked != 40 || statesAsked(reps)-before != 40 {
		t.Fatalf("a round of 160 asked %d cells (%d State calls), want every cell", res.Asked, statesAsked(reps)-before)
	}
}

// TestSampleSizedOnWhatCanStart: a round drains the whole queue, but no more than MaxInFlight
// of its items can start, so its sample is sized on those: a backlog of 160 items with room
// for 20 asks 20/4 = 5 cells, not every cell, and the rest waits for a later round.
func TestSampleSizedOnWhatCanStart(t *testing.T) {
	bbs, reps := manyCells(t, 40)
	r := NewRunner(bbs, reps, Config{SampleCells: 4, MaxInFlight: 20, DeferOverLimit: true}, logtest.New(t))
	indices := make([]int32, 160)
	for i := range indices {
		indices[i] = int32(i)
	}
	res, err := r.Run(context.Background(), LRPWork([]*auctioneerv1.LRPStartRequest{lrpStart("backlog", 16, indices...)}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Asked != 5 || statesAsked(reps) != 5 || res.Widened {
		t.Fatalf("a backlog of 160 with room for 20 asked %d cells (%d State calls, widened %v), want 20/4 = 5",
			res.Asked, statesAsked(reps), res.Widened)
	}
	if len(res.Placed) != 20 || len(res.Deferred) != 140 || len(res.Failed) != 0 {
		t.Fatalf("placed %d, deferred %d, failed %v; want 20 placed and 140 deferred", len(res.Placed), len(res.Deferred), res.Failed)
	}
}

// TestSampledRoundWidens: work no sampled cell can take (only the last of 40 cells has its
// tag) is placed, in the same round, over every cell; work no cell can take fails as it would
// without a sample, judged on every cell.
func TestSampledRoundWidens(t *testing.T) {
	bbs, reps := manyCells(t, 40)
	r := NewRunner(bbs, reps, Config{SampleCells: 4}, logtest.New(t))
	gpu := func(guid string, index int32, tag string) []*placement.Work {
		s := lrpStart(guid, 16, index)
		s.PlacementConstraint = &modelsv1.PlacementConstraint{Require: []string{tag}}
		return LRPWork([]*auctioneerv1.LRPStartRequest{s})
	}
	widened := 0
	for i := range 10 {
		res, err := r.Run(context.Background(), gpu("train", int32(i), "gpu"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Placed[fmt.Sprintf("lrp/train/%d", i)] != "c39" {
			t.Fatalf("round %d placed %v, failed %v; want c39", i, res.Placed, res.Failed)
		}
		if res.Widened {
			widened++
			if res.Asked != 40 {
				t.Fatalf("a widened round used %d cells, want 40", res.Asked)
			}
		} else if res.Asked != 4 {
			t.Fatalf("a round that did not widen used %d cells, want the sample of 4", res.Asked)
		}
	}
	// c39 is in a sample of 4 out of 40 one round in ten: ten rounds all sampling it, 1e-10.
	if widened == 0 {
		t.Fatal("no round widened")
	}
	if _, err := r.Run(context.Background(), gpu("fpga", 0, "fpga")); err != nil {
		t.Fatal(err)
	}
	if got, want := failures(bbs)["lrp/fpga/0"], "0/40 cells"; !strings.Contains(got, want) {
		t.Fatalf("failure %q does not count every cell (%q)", got, want)
	}
}

// TestStartingAcrossScalesASample: the in-flight limit is judged on the sample's starting
// containers scaled to every registered cell (rounded up); unreachable cells count nothing.
func TestStartingAcrossScalesASample(t *testing.T) {
	cells := []*placement.Cell{{ID: "a", Starting: 2}, {ID: "b", Starting: 1}, {ID: "c", Starting: 5, Unreachable: true}}
	if got := startingAcross(cells, 3); got != 3 {
		t.Fatalf("every cell: %d starting, want 3", got)
	}
	if got := startingAcross(cells, 40); got != 40 {
		t.Fatalf("a sample of 3 out of 40 with 3 starting: %d, want 40", got)
	}
	if got := startingAcross(nil, 40); got != 0 {
		t.Fatalf("no cells: %d", got)
	}
}
