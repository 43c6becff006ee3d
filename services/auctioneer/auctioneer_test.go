package auctioneer_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/auctioneer"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// proposalCells registers the placement pools proposal's nine cells: 1–4 "staging", 5–8
// "production", "skynet" on 1, 2, 5, 6 and 9; zones z1–z3 round robin; 1 GiB each.
func proposalCells(t *testing.T, env *bbstest.Env) []*fakeRep {
	t.Helper()
	tags := map[int][]string{
		1: {"staging", "skynet"}, 2: {"staging", "skynet"}, 3: {"staging"}, 4: {"staging"},
		5: {"production", "skynet"}, 6: {"production", "skynet"}, 7: {"production"}, 8: {"production"},
		9: {"skynet"},
	}
	reps := make([]*fakeRep, 0, 9)
	for i := 1; i <= 9; i++ {
		reps = append(reps, startRep(t, env, cellSpec{id: fmt.Sprintf("cell-%d", i), zone: fmt.Sprintf("z%d", (i-1)%3+1), tags: tags[i]}))
	}
	waitCells(t, env, 9)
	return reps
}

// receivedBy maps each fake rep's received work to its cell number.
func receivedBy(reps []*fakeRep) map[string][]int {
	out := map[string][]int{}
	for i, r := range reps {
		for _, k := range r.received() {
			out[k] = append(out[k], i+1)
		}
	}
	return out
}

func TestAuctionPlacesOnTaggedCellsAndReportsFailures(t *testing.T) {
	env := bbstest.Start(t)
	reps := proposalCells(t, env)
	a := startAuctioneer(t, env)

	starts := []*auctioneerv1.LRPStartRequest{
		desire(t, env, "web", 4, 128, &modelsv1.PlacementConstraint{Require: []string{"staging"}}),
		desire(t, env, "api", 2, 128, &modelsv1.PlacementConstraint{Require: []string{"Staging", "SKYNET"}}),
		desire(t, env, "batch", 2, 128, &modelsv1.PlacementConstraint{Require: []string{"staging"}, Disallow: []string{"skynet"}}),
		desire(t, env, "edge", 5, 64, &modelsv1.PlacementConstraint{Disallow: []string{"production"}}),
		desire(t, env, "conflict", 1, 64, &modelsv1.PlacementConstraint{Require: []string{"staging"}, Disallow: []string{"staging"}}),
		desire(t, env, "alfalfa", 1, 64, &modelsv1.PlacementConstraint{Require: []string{"alfalfa"}}),
		desire(t, env, "huge", 2, 2048, &modelsv1.PlacementConstraint{Require: []string{"staging"}}),
	}
	requestLRPs(t, a, starts...)
	testkit.Eventually(t, 15*time.Second, func() bool { return len(receivedBy(reps)) == 13 }, "every placeable instance to reach a rep")

	want := map[string][]int{ // instance → eligible cells
		"web":   {1, 2, 3, 4},
		"api":   {1, 2},
		"batch": {3, 4},
		"edge":  {1, 2, 3, 4, 9},
	}
	got := receivedBy(reps)
	for k, cells := range got {
		if len(cells) != 1 {
			t.Errorf("%s sent to cells %v, want exactly one", k, cells)
		}
		guid := k[:strings.IndexByte(k, '/')]
		if !slices.Contains(want[guid], cells[0]) {
			t.Errorf("%s placed on cell-%d, eligible cells are %v", k, cells[0], want[guid])
		}
	}
	// Spread: web's four instances on four different cells, api's two on cells 1 and 2.
	for guid, n := range map[string]int{"web": 4, "api": 2, "batch": 2, "edge": 5} {
		used := map[int]bool{}
		for i := range n {
			if cells, ok := got[fmt.Sprintf("%s/%d", guid, i)]; ok {
				used[cells[0]] = true
			}
		}
		if len(used) != n {
			t.Errorf("%s's %d instances used cells %v, want %d different cells", guid, n, slices.Sorted(maps.Keys(used)), n)
		}
	}

	wantErrs := map[string]map[string]string{
		"conflict": {"conflict/0": `CODE_CELL_MISMATCH found no compatible cell: 0/9 cells eligible (5 lack tag "staging", 4 carry disallowed tag "staging")`},
		"alfalfa":  {"alfalfa/0": `CODE_CELL_MISMATCH found no compatible cell: 0/9 cells eligible (9 lack tag "alfalfa")`},
		"huge": {
			"huge/0": `CODE_INSUFFICIENT_RESOURCES insufficient resources: memory (4 compatible cells)`,
			"huge/1": `CODE_INSUFFICIENT_RESOURCES insufficient resources: memory (4 compatible cells)`,
		},
	}
	for guid, want := range wantErrs {
		testkit.Eventually(t, 15*time.Second, func() bool { return len(placementErrors(t, env, guid)) == len(want) }, guid+"'s placement errors")
		if got := placementErrors(t, env, guid); !maps.Equal(got, want) {
			t.Errorf("%s placement errors\n%v\nwant\n%v", guid, got, want)
		}
	}
	for _, guid := range []string{"web", "api", "batch", "edge"} {
		if pe := placementErrors(t, env, guid); len(pe) != 0 {
			t.Errorf("%s has placement errors %v", guid, pe)
		}
	}
}

func TestAuctionTasksRetriesAndUnreachableCells(t *testing.T) {
	env := bbstest.Start(t)
	refusing := startRep(t, env, cellSpec{id: "cell-a", zone: "z1"})
	refusing.refuse = true
	good := startRep(t, env, cellSpec{id: "cell-b", zone: "z2", memoryMB: 512})
	gone := startRep(t, env, cellSpec{id: "cell-c", zone: "z3"})
	waitCells(t, env, 3)
	if err := gone.run.Stop(); err != nil { // registered, but its rep no longer answers
		t.Fatalf("stop rep cell-c: %v", err)
	}
	a := startAuctioneer(t, env, func(c *auctioneer.Config) { c.CellStateTimeout = auctioneer.Duration(500 * time.Millisecond) })

	for guid, memory := range map[string]int32{"t-small": 64, "t-big": 768} {
		if _, err := env.Client.DesireTask(ctxT(t), &bbsv1.DesireTaskRequest{TaskGuid: guid, Domain: "jobs", Definition: &modelsv1.TaskDefinition{
			Rootfs: "docker:///library/busybox#1", MemoryMb: memory, DiskMb: 10,
			Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/true"}}},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	taskReq := func(guid string, memory int32) *auctioneerv1.RequestTaskAuctionsRequest {
		return &auctioneerv1.RequestTaskAuctionsRequest{Tasks: []*auctioneerv1.TaskStartRequest{
			{TaskGuid: guid, Domain: "jobs", Rootfs: "docker:///library/busybox#1", Resources: &modelsv1.Resources{MemoryMb: memory, DiskMb: 10}},
		}}
	}
	var err error
	testkit.Eventually(t, 15*time.Second, func() bool {
		_, err = a.client.RequestTaskAuctions(ctxT(t), taskReq("t-small", 64))
		return status.Code(err) != codes.FailedPrecondition
	}, "the leader to accept tasks")
	if err != nil {
		t.Fatal(err)
	}
	// t-small: offered to the empty cell-a first (better score), refused, retried on cell-b.
	testkit.Eventually(t, 15*time.Second, func() bool { return slices.Contains(good.received(), "task:t-small") }, "t-small on cell-b")
	if got := refusing.received(); !slices.Equal(got, []string{"task:t-small"}) {
		t.Errorf("cell-a was offered %v, want t-small", got)
	}

	if _, err := a.client.RequestTaskAuctions(ctxT(t), taskReq("t-big", 768)); err != nil {
		t.Fatal(err)
	}
	// t-big fits only cell-a, which refuses it; cell-b is too small and cell-c does not answer.
	var task *modelsv1.Task
	testkit.Eventually(t, 15*time.Second, func() bool {
		resp, err := env.Client.TaskByGuid(ctxT(t), &bbsv1.TaskByGuidRequest{TaskGuid: "t-big"})
		task = resp.GetTask()
		return err == nil && task.GetPlacementError() != nil
	}, "t-big's placement error")
	pe := task.GetPlacementError()
	if pe.GetCode() != modelsv1.PlacementError_CODE_CELL_COMMUNICATION ||
		pe.GetMessage() != "cell cell-a could not start it (the cell refused it), and no other cell could take it: insufficient resources: memory (3 compatible cells: 1 without room, 1 already refused it, 1 did not answer)" {
		t.Errorf("t-big placement error %s %q", pe.GetCode(), pe.GetMessage())
	}
	if task.GetRejectionCount() != 1 {
		t.Errorf("t-big rejection count %d, want 1", task.GetRejectionCount())
	}
	if slices.Contains(good.received(), "task:t-big") {
		t.Error("t-big was sent to cell-b, which has no room")
	}
}

func TestAuctionUnschedulableTaskAndInFlightLimit(t *testing.T) {
	env := bbstest.Start(t)
	rep := startRep(t, env, cellSpec{id: "cell-a", zone: "z1", tags: []string{"gpu"}})
	waitCells(t, env, 1)
	a := startAuctioneer(t, env, func(c *auctioneer.Config) { c.MaxInflightStarts = 2 })

	if _, err := env.Client.DesireTask(ctxT(t), &bbsv1.DesireTaskRequest{TaskGuid: "t-cpu", Domain: "jobs", Definition: &modelsv1.TaskDefinition{
		Rootfs: "preloaded:cflinuxfs4", MemoryMb: 64, PlacementConstraint: &modelsv1.PlacementConstraint{Disallow: []string{"GPU"}},
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/true"}}},
	}}); err != nil {
		t.Fatal(err)
	}
	web := desire(t, env, "web", 3, 64, nil)
	requestLRPs(t, a, web) // waits for leadership
	if _, err := a.client.RequestTaskAuctions(ctxT(t), &auctioneerv1.RequestTaskAuctionsRequest{Tasks: []*auctioneerv1.TaskStartRequest{{
		TaskGuid: "t-cpu", Domain: "jobs", Rootfs: "preloaded:cflinuxfs4", Resources: &modelsv1.Resources{MemoryMb: 64},
		PlacementConstraint: &modelsv1.PlacementConstraint{Disallow: []string{"GPU"}},
	}}}); err != nil {
		t.Fatal(err)
	}

	// The first round places two (the limit); web/2 waits in the auctioneer for a later round,
	// placed once the cell no longer reports them starting (this fake cell never does), and is
	// never reported to the BBS as a failure.
	testkit.Eventually(t, 15*time.Second, func() bool { return slices.Contains(rep.received(), "web/2") }, "web/2 placed in a later round")
	if first := rep.performed(0); !slices.Equal(first, []string{"web/0", "web/1"}) {
		t.Errorf("first Perform carried %v, want web/0 and web/1", first)
	}
	if got := placementErrors(t, env, "web"); len(got) != 0 {
		t.Errorf("web placement errors %v, want none", got)
	}
	testkit.Eventually(t, 15*time.Second, func() bool {
		resp, err := env.Client.TaskByGuid(ctxT(t), &bbsv1.TaskByGuidRequest{TaskGuid: "t-cpu"})
		return err == nil && resp.GetTask().GetPlacementError() != nil
	}, "t-cpu's placement error")
	resp, _ := env.Client.TaskByGuid(ctxT(t), &bbsv1.TaskByGuidRequest{TaskGuid: "t-cpu"})
	if pe := resp.GetTask().GetPlacementError(); pe.GetCode() != modelsv1.PlacementError_CODE_CELL_MISMATCH ||
		pe.GetMessage() != `found no compatible cell: 0/1 cell eligible (1 carries disallowed tag "gpu")` {
		t.Errorf("t-cpu placement error %s %q", pe.GetCode(), pe.GetMessage())
	}
}

func TestOnlyTheLeaderServes(t *testing.T) {
	env := bbstest.Start(t)
	rep := startRep(t, env, cellSpec{id: "cell-a", zone: "z1"})
	waitCells(t, env, 1)
	a1 := startAuctioneer(t, env)
	a2 := startAuctioneer(t, env)

	var leader, standby *runningAuctioneer
	testkit.Eventually(t, 15*time.Second, func() bool {
		if a1.svc.IsLeader() != a2.svc.IsLeader() {
			leader, standby = a1, a2
			if a2.svc.IsLeader() {
				leader, standby = a2, a1
			}
			return true
		}
		return false
	}, "one leader")
	time.Sleep(200 * time.Millisecond)
	if !leader.svc.IsLeader() || standby.svc.IsLeader() {
		t.Fatal("leadership changed without cause")
	}

	// The standby refuses and reports NOT_SERVING; the leader serves.
	web := desire(t, env, "web", 2, 64, nil)
	_, err := standby.client.RequestLRPAuctions(ctxT(t), &auctioneerv1.RequestLRPAuctionsRequest{Starts: []*auctioneerv1.LRPStartRequest{web}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "not the leader") {
		t.Fatalf("standby answered %v, want FailedPrecondition \"not the leader\"", err)
	}
	_, err = standby.client.RequestTaskAuctions(ctxT(t), &auctioneerv1.RequestTaskAuctionsRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("standby answered tasks with %v", err)
	}
	checkHealth(t, standby.addr, healthpb.HealthCheckResponse_NOT_SERVING)
	checkHealth(t, leader.addr, healthpb.HealthCheckResponse_SERVING)
	requestLRPs(t, leader, web)
	testkit.Eventually(t, 15*time.Second, func() bool { return len(rep.received()) == 2 }, "web on the rep")
	if standby.svc.Rounds() != 0 {
		t.Fatalf("the standby ran %d rounds", standby.svc.Rounds())
	}

	// Stopping the leader hands over at once (it resigns).
	leader.stop(t)
	testkit.Eventually(t, 15*time.Second, standby.svc.IsLeader, "the standby to lead")
	checkHealth(t, standby.addr, healthpb.HealthCheckResponse_SERVING)
	api := desire(t, env, "api", 1, 64, nil)
	requestLRPs(t, standby, api)
	testkit.Eventually(t, 15*time.Second, func() bool { return slices.Contains(rep.received(), "api/0") }, "api on the rep")
}

func TestBadRequestsAreRefused(t *testing.T) {
	env := bbstest.Start(t)
	a := startAuctioneer(t, env)
	testkit.Eventually(t, 15*time.Second, a.svc.IsLeader, "leadership")
	for name, req := range map[string]*auctioneerv1.RequestLRPAuctionsRequest{
		"no guid":        {Starts: []*auctioneerv1.LRPStartRequest{{Domain: "apps", Indices: []int32{0}, Rootfs: "preloaded:x"}}},
		"negative index": {Starts: []*auctioneerv1.LRPStartRequest{{ProcessGuid: "g", Domain: "apps", Indices: []int32{-1}, Rootfs: "preloaded:x"}}},
		"no rootfs":      {Starts: []*auctioneerv1.LRPStartRequest{{ProcessGuid: "g", Domain: "apps", Indices: []int32{0}}}},
		"bad tag": {Starts: []*auctioneerv1.LRPStartRequest{{ProcessGuid: "g", Domain: "apps", Indices: []int32{0}, Rootfs: "preloaded:x",
			PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{"a,b"}}}}},
	} {
		if _, err := a.client.RequestLRPAuctions(ctxT(t), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
	if _, err := a.client.RequestTaskAuctions(ctxT(t), &auctioneerv1.RequestTaskAuctionsRequest{Tasks: []*auctioneerv1.TaskStartRequest{{Domain: "d", Rootfs: "preloaded:x"}}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("task without guid: got %v", err)
	}
}

func checkHealth(t *testing.T, addr string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	conn := testkit.Dial(t, addr)
	defer conn.Close()
	var got healthpb.HealthCheckResponse_ServingStatus
	testkit.Eventually(t, 15*time.Second, func() bool {
		resp, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: auctioneer.ServiceName})
		got = resp.GetStatus()
		return err == nil && got == want
	}, fmt.Sprintf("health %s of %s", want, addr))
}
