package plan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

var timeouts = Timeouts{Unclaimed: 30 * time.Second, PendingTask: 30 * time.Minute, CompletedTask: 2 * time.Minute}

func ago(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(-d)) }

func desired(guid string, instances int32) *modelsv1.DesiredLRPSchedulingInfo {
	return &modelsv1.DesiredLRPSchedulingInfo{ProcessGuid: guid, Domain: "fresh", Instances: instances}
}

// lrp is an ordinary record of guid/index in domain "fresh", RUNNING on cell-1 for an hour.
func lrp(guid string, index int32, opts ...func(*modelsv1.ActualLRP)) *modelsv1.ActualLRP {
	a := &modelsv1.ActualLRP{
		Key:         &modelsv1.ActualLRPKey{ProcessGuid: guid, Index: index, Domain: "fresh"},
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: guid + "-i", CellId: "cell-1"},
		State:       modelsv1.ActualLRP_STATE_RUNNING,
		Presence:    modelsv1.ActualLRP_PRESENCE_ORDINARY,
		Since:       ago(time.Hour),
	}
	for _, o := range opts {
		o(a)
	}
	return a
}

func state(s modelsv1.ActualLRP_State) func(*modelsv1.ActualLRP) {
	return func(a *modelsv1.ActualLRP) {
		a.State = s
		if s == modelsv1.ActualLRP_STATE_UNCLAIMED || s == modelsv1.ActualLRP_STATE_CRASHED {
			a.InstanceKey = nil
		}
	}
}

func presence(p modelsv1.ActualLRP_Presence) func(*modelsv1.ActualLRP) {
	return func(a *modelsv1.ActualLRP) { a.Presence = p }
}

func onCell(id string) func(*modelsv1.ActualLRP) {
	return func(a *modelsv1.ActualLRP) {
		a.InstanceKey = &modelsv1.ActualLRPInstanceKey{InstanceGuid: a.GetKey().GetProcessGuid() + "-" + id, CellId: id}
	}
}

func since(d time.Duration) func(*modelsv1.ActualLRP) {
	return func(a *modelsv1.ActualLRP) { a.Since = ago(d) }
}

func domain(d string) func(*modelsv1.ActualLRP) {
	return func(a *modelsv1.ActualLRP) { a.Key.Domain = d }
}

func crashes(n int32) func(*modelsv1.ActualLRP) {
	return func(a *modelsv1.ActualLRP) { a.CrashCount = n }
}

func placementError() func(*modelsv1.ActualLRP) {
	return func(a *modelsv1.ActualLRP) { a.PlacementError = &modelsv1.PlacementError{Message: "no cell"} }
}

func task(guid string, s modelsv1.Task_State, opts ...func(*modelsv1.Task)) *modelsv1.Task {
	t := &modelsv1.Task{TaskGuid: guid, Domain: "fresh", State: s, CellId: "cell-1", Definition: &modelsv1.TaskDefinition{},
		CreatedAt: ago(time.Minute), UpdatedAt: ago(time.Second)}
	if s == modelsv1.Task_STATE_COMPLETED || s == modelsv1.Task_STATE_RESOLVING {
		t.FirstCompletedAt = t.UpdatedAt
	}
	for _, o := range opts {
		o(t)
	}
	return t
}

func created(d time.Duration) func(*modelsv1.Task) {
	return func(t *modelsv1.Task) { t.CreatedAt = ago(d) }
}
func updated(d time.Duration) func(*modelsv1.Task) {
	return func(t *modelsv1.Task) { t.UpdatedAt = ago(d) }
}
func completed(d time.Duration) func(*modelsv1.Task) {
	return func(t *modelsv1.Task) { t.FirstCompletedAt = ago(d) }
}
func taskCell(id string) func(*modelsv1.Task) { return func(t *modelsv1.Task) { t.CellId = id } }
func callback() func(*modelsv1.Task) {
	return func(t *modelsv1.Task) { t.Definition.CompletionCallbackUrl = "http://127.0.0.1/cb" }
}

// snap is a snapshot with live cell-1 and cell-2 and fresh domain "fresh"; "stale" is not fresh.
func snap(d []*modelsv1.DesiredLRPSchedulingInfo, a []*modelsv1.ActualLRP, t []*modelsv1.Task) Snapshot {
	return Snapshot{
		Desired: d, Actual: a, Tasks: t,
		Cells:   []*modelsv1.CellPresence{{CellId: "cell-1"}, {CellId: "cell-2"}},
		Domains: []*modelsv1.Domain{{Name: "fresh"}},
		Now:     now,
	}
}

func ds(d ...*modelsv1.DesiredLRPSchedulingInfo) []*modelsv1.DesiredLRPSchedulingInfo { return d }
func as(a ...*modelsv1.ActualLRP) []*modelsv1.ActualLRP                               { return a }
func ts(t ...*modelsv1.Task) []*modelsv1.Task                                         { return t }

const (
	unclaimed  = modelsv1.ActualLRP_STATE_UNCLAIMED
	claimed    = modelsv1.ActualLRP_STATE_CLAIMED
	crashed    = modelsv1.ActualLRP_STATE_CRASHED
	suspect    = modelsv1.ActualLRP_PRESENCE_SUSPECT
	evacuating = modelsv1.ActualLRP_PRESENCE_EVACUATING
	pending    = modelsv1.Task_STATE_PENDING
	running    = modelsv1.Task_STATE_RUNNING
	done       = modelsv1.Task_STATE_COMPLETED
	resolving  = modelsv1.Task_STATE_RESOLVING
)

func TestMake(t *testing.T) {
	tests := []struct {
		name  string
		snap  Snapshot
		want  []string
		found Found
	}{
		{name: "converged: nothing to do",
			snap: snap(ds(desired("a", 2)), as(lrp("a", 0), lrp("a", 1)), ts(task("t", running)))},

		// Missing instances.
		{name: "missing indices are created for their LRP in one change",
			snap:  snap(ds(desired("a", 4), desired("b", 1)), as(lrp("a", 1)), nil),
			want:  []string{"create-missing a (3)", "create-missing b (1)"},
			found: Found{LRPsMissing: 4}},
		{name: "a suspect or evacuating copy does not fill its slot",
			snap: snap(ds(desired("a", 1)), as(lrp("a", 0, presence(suspect), onCell("gone")),
				lrp("a", 0, presence(evacuating), onCell("cell-2"))), nil),
			want:  []string{"create-missing a (1)"},
			found: Found{LRPsMissing: 1, SuspectLRPs: 1}},

		// Extra instances.
		{name: "an index past the count is retired in a fresh domain",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0), lrp("a", 1), lrp("a", 2, state(unclaimed))), nil),
			want:  []string{"retire-extra a/1", "retire-extra a/2"},
			found: Found{LRPsExtra: 2}},
		{name: "the instances of a removed LRP are retired in a fresh domain",
			snap:  snap(nil, as(lrp("gone", 0)), nil),
			want:  []string{"retire-extra gone/0"},
			found: Found{LRPsExtra: 1}},
		{name: "a stale domain keeps its extra instances (counted, not retired)",
			snap:  snap(ds(desired("a", 0)), as(lrp("a", 0, domain("stale")), lrp("b", 3, domain("stale"))), nil),
			found: Found{LRPsExtra: 2}},
		{name: "an extra instance on a vanished cell is retired, not made suspect",
			snap:  snap(nil, as(lrp("a", 0, onCell("gone"))), nil),
			want:  []string{"retire-extra a/0"},
			found: Found{LRPsExtra: 1}},

		// Stale UNCLAIMED.
		{name: "UNCLAIMED younger than the unclaimed timeout waits",
			snap: snap(ds(desired("a", 1)), as(lrp("a", 0, state(unclaimed), since(29*time.Second))), nil)},
		{name: "UNCLAIMED for the unclaimed timeout is auctioned again",
			snap: snap(ds(desired("a", 1)), as(lrp("a", 0, state(unclaimed), since(30*time.Second))), nil),
			want: []string{"auction-lrp a [0]"}},
		{name: "UNCLAIMED with a placement error is auctioned again at once",
			snap: snap(ds(desired("a", 1)), as(lrp("a", 0, state(unclaimed), since(0), placementError())), nil),
			want: []string{"auction-lrp a [0]"}},
		{name: "stale instances are grouped by LRP in index order",
			snap: snap(ds(desired("a", 3), desired("b", 1)), as(
				lrp("b", 0, state(unclaimed), since(time.Minute)),
				lrp("a", 2, state(unclaimed), since(time.Minute)),
				lrp("a", 1),
				lrp("a", 0, state(unclaimed), since(time.Minute))), nil),
			want: []string{"auction-lrp a [0 2]", "auction-lrp b [0]"}},

		// Crashes, on the restart schedule (3 immediate restarts, then 30s × 2^(n−3), capped).
		{name: "crash 4 waits 60s: not yet at 59s",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0, state(crashed), crashes(4), since(59*time.Second))), nil),
			found: Found{CrashedLRPs: 1}},
		{name: "crash 4 waits 60s: restarted at 60s",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0, state(crashed), crashes(4), since(60*time.Second))), nil),
			want:  []string{"restart-crashed a/0"},
			found: Found{CrashedLRPs: 1}},
		{name: "crash 6 waits 4 min",
			snap: snap(ds(desired("a", 2)), as(
				lrp("a", 0, state(crashed), crashes(6), since(4*time.Minute-time.Second)),
				lrp("a", 1, state(crashed), crashes(6), since(4*time.Minute))), nil),
			want:  []string{"restart-crashed a/1"},
			found: Found{CrashedLRPs: 2}},
		{name: "the backoff is capped at 16 min",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0, state(crashed), crashes(150), since(16*time.Minute))), nil),
			want:  []string{"restart-crashed a/0"},
			found: Found{CrashedLRPs: 1}},
		{name: "200 crashes are never restarted",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0, state(crashed), crashes(200), since(24*time.Hour))), nil),
			found: Found{CrashedLRPs: 1}},

		// Vanished cells.
		{name: "RUNNING and CLAIMED instances of a vanished cell are made suspect",
			snap: snap(ds(desired("a", 3)), as(lrp("a", 0, onCell("gone")), lrp("a", 1, state(claimed), onCell("gone")),
				lrp("a", 2, onCell("cell-2"))), nil),
			want: []string{"mark-suspect a/0 on gone", "mark-suspect a/1 on gone"}},

		// SUSPECT copies.
		{name: "a suspect whose replacement runs is removed",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0, presence(suspect), onCell("gone")), lrp("a", 0, onCell("cell-2"))), nil),
			want:  []string{"remove-suspect a/0"},
			found: Found{SuspectLRPs: 1}},
		{name: "a suspect no longer desired is removed",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0), lrp("a", 1, presence(suspect), onCell("gone"))), nil),
			want:  []string{"remove-suspect a/1"},
			found: Found{SuspectLRPs: 1}},
		{name: "a suspect whose cell returned before its replacement runs is promoted",
			snap: snap(ds(desired("a", 2)), as(
				lrp("a", 0, presence(suspect), onCell("cell-1")), lrp("a", 0, state(unclaimed), since(time.Second)),
				lrp("a", 1, presence(suspect), onCell("cell-2")), lrp("a", 1, state(claimed), onCell("cell-1"))), nil),
			want:  []string{"promote-suspect a/0", "promote-suspect a/1"},
			found: Found{SuspectLRPs: 2}},
		{name: "a suspect whose cell is still gone waits for its replacement",
			snap: snap(ds(desired("a", 1)), as(lrp("a", 0, presence(suspect), onCell("gone")),
				lrp("a", 0, state(claimed), onCell("cell-2"))), nil),
			found: Found{SuspectLRPs: 1}},

		// EVACUATING copies.
		{name: "an evacuating copy on a live cell for a desired slot stays",
			snap: snap(ds(desired("a", 1)), as(lrp("a", 0, presence(evacuating), onCell("cell-1")),
				lrp("a", 0, state(unclaimed), since(time.Second))), nil)},
		{name: "an evacuating copy of a vanished cell is removed",
			snap: snap(ds(desired("a", 1)), as(lrp("a", 0, presence(evacuating), onCell("gone")),
				lrp("a", 0, state(unclaimed), since(time.Second))), nil),
			want: []string{"remove-evacuating a/0"}},
		{name: "an evacuating copy of a slot no longer desired is removed",
			snap: snap(ds(desired("a", 0)), as(lrp("a", 0, presence(evacuating), onCell("cell-1"))), nil),
			want: []string{"remove-evacuating a/0"}},

		// Tasks.
		{name: "a PENDING task is failed at the pending timeout",
			snap: snap(nil, nil, ts(task("t1", pending, created(30*time.Minute), updated(time.Minute)),
				task("t2", pending, created(30*time.Minute-time.Second), updated(time.Second)))),
			want: []string{"expire-pending-task t1"}},
		{name: "a PENDING task is auctioned again after the unclaimed timeout",
			snap: snap(nil, nil, ts(task("t1", pending, updated(30*time.Second)), task("t2", pending, updated(29*time.Second)))),
			want: []string{"auction-task t1"}},
		{name: "a RUNNING task on a vanished cell is failed",
			snap: snap(nil, nil, ts(task("t1", running, taskCell("gone")), task("t2", running, taskCell("cell-2")))),
			want: []string{"fail-task-on-vanished-cell t1"}},
		{name: "COMPLETED and RESOLVING tasks are deleted at the completed timeout",
			snap: snap(nil, nil, ts(task("t1", done, completed(2*time.Minute)), task("t2", resolving, completed(3*time.Minute)),
				task("t3", done, completed(2*time.Minute-time.Second)))),
			want: []string{"delete-task t1", "delete-task t2"}},
		{name: "without a first completion time a task's last update counts",
			snap: snap(nil, nil, ts(task("t1", done, updated(2*time.Minute), func(t *modelsv1.Task) { t.FirstCompletedAt = nil }))),
			want: []string{"delete-task t1"}},
		{name: "a completion callback is retried after the unclaimed timeout",
			snap: snap(nil, nil, ts(
				task("t1", done, callback(), updated(30*time.Second), completed(time.Minute)),
				task("t2", resolving, callback(), updated(30*time.Second), completed(time.Minute)),
				task("t3", done, callback(), updated(29*time.Second), completed(time.Minute)),
				task("t4", done, updated(30*time.Second), completed(time.Minute)))),
			want: []string{"retry-task-callback t1", "retry-task-callback t2"}},
		{name: "an expired task is deleted rather than called back",
			snap: snap(nil, nil, ts(task("t1", done, callback(), updated(5*time.Minute), completed(5*time.Minute)))),
			want: []string{"delete-task t1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.snap, timeouts)
			var got []string
			for _, c := range p.Changes {
				got = append(got, c.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("changes:\n got  %s\n want %s", strings.Join(got, "; "), strings.Join(tt.want, "; "))
			}
			if p.Found != tt.found {
				t.Errorf("found %+v, want %+v", p.Found, tt.found)
			}
		})
	}
}

// TestMakeDeadlines checks the deadlines the task changes carry: their transactions re-check
// the rule against them.
func TestMakeDeadlines(t *testing.T) {
	p := Make(snap(nil, nil, ts(task("p", pending, created(time.Hour)), task("c", done, completed(time.Hour)))), timeouts)
	want := []Change{
		DeleteTask{TaskGuid: "c", Deadline: now.Add(-2 * time.Minute)},
		ExpirePendingTask{TaskGuid: "p", Deadline: now.Add(-30 * time.Minute)},
	}
	if !slices.Equal(p.Changes, want) {
		t.Fatalf("changes %v, want %v", p.Changes, want)
	}
}

// TestMakeIsDeterministic checks that the plan does not depend on the order of the snapshot.
func TestMakeIsDeterministic(t *testing.T) {
	d := ds(desired("a", 3), desired("b", 2))
	a := as(lrp("a", 0, onCell("gone")), lrp("a", 2, state(unclaimed), since(time.Minute)),
		lrp("b", 0, presence(suspect), onCell("cell-2")), lrp("b", 0, state(unclaimed), since(time.Second)),
		lrp("c", 0), lrp("b", 1, presence(evacuating), onCell("gone")), lrp("b", 1))
	tk := ts(task("t2", running, taskCell("gone")), task("t1", pending, created(time.Hour)))
	first := Make(snap(d, a, tk), timeouts)
	slices.Reverse(d)
	slices.Reverse(a)
	slices.Reverse(tk)
	second := Make(snap(d, a, tk), timeouts)
	if len(first.Changes) != 8 {
		t.Fatalf("got %d changes (%v), want 8", len(first.Changes), first.Changes)
	}
	for i := range first.Changes {
		if first.Changes[i].String() != second.Changes[i].String() {
			t.Fatalf("change %d: %v, then %v after reversing the snapshot", i, first.Changes[i], second.Changes[i])
		}
	}
}

// TestStaleClaimed: an instance CLAIMED on a present cell is left alone until the claimed
// timeout, then unclaimed (with the deadline the core re-checks); on a vanished cell it is a
// suspect case at once; a zero timeout never unclaims.
func TestStaleClaimed(t *testing.T) {
	claimedOn := func(cell string, age time.Duration) *modelsv1.ActualLRP {
		return &modelsv1.ActualLRP{
			Key:         &modelsv1.ActualLRPKey{ProcessGuid: "p", Index: 0, Domain: "d"},
			InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig", CellId: cell},
			State:       modelsv1.ActualLRP_STATE_CLAIMED, Presence: modelsv1.ActualLRP_PRESENCE_ORDINARY, Since: ago(age),
		}
	}
	withClaimed := timeouts
	withClaimed.Claimed = 5 * time.Minute
	snap := func(a *modelsv1.ActualLRP) Snapshot {
		return Snapshot{Desired: []*modelsv1.DesiredLRPSchedulingInfo{desired("p", 1)}, Actual: []*modelsv1.ActualLRP{a},
			Cells: []*modelsv1.CellPresence{{CellId: "c1"}}, Domains: []*modelsv1.Domain{{Name: "d"}}, Now: now}
	}
	if p := Make(snap(claimedOn("c1", 5*time.Minute-time.Second)), withClaimed); len(p.Changes) != 0 || p.Found.StaleClaimedLRPs != 0 {
		t.Fatalf("claimed for less than the timeout: %v (found %+v), want nothing", p.Changes, p.Found)
	}
	p := Make(snap(claimedOn("c1", 5*time.Minute)), withClaimed)
	want := UnclaimStale{ProcessGuid: "p", Index: 0, Instance: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig", CellId: "c1"}, Deadline: now.Add(-5 * time.Minute)}
	if len(p.Changes) != 1 || p.Found.StaleClaimedLRPs != 1 {
		t.Fatalf("claimed for the timeout: %v (found %+v), want %v", p.Changes, p.Found, want)
	}
	if got, ok := p.Changes[0].(UnclaimStale); !ok || got.ProcessGuid != want.ProcessGuid || got.Index != want.Index ||
		got.Instance.GetCellId() != "c1" || got.Instance.GetInstanceGuid() != "ig" || !got.Deadline.Equal(want.Deadline) {
		t.Fatalf("change %v, want %v", p.Changes[0], want)
	}
	if p := Make(snap(claimedOn("gone", time.Hour)), withClaimed); len(p.Changes) != 1 {
		t.Fatalf("claimed on a vanished cell: %v, want one change", p.Changes)
	} else if _, ok := p.Changes[0].(MarkSuspect); !ok {
		t.Fatalf("claimed on a vanished cell: %v, want MarkSuspect", p.Changes[0])
	}
	if p := Make(snap(claimedOn("c1", time.Hour)), timeouts); len(p.Changes) != 0 {
		t.Fatalf("without a claimed timeout: %v, want nothing", p.Changes)
	}
}

// fullScale is 100,000 RUNNING instances (10,000 LRPs of 10) on 1,000 cells, 100 of which
// have vanished, in the order the store lists them (by guid, index, presence).
func fullScale() Snapshot {
	var d []*modelsv1.DesiredLRPSchedulingInfo
	var a []*modelsv1.ActualLRP
	var cells []*modelsv1.CellPresence
	for c := 100; c < 1000; c++ {
		cells = append(cells, &modelsv1.CellPresence{CellId: fmt.Sprintf("cell-%04d", c)})
	}
	for g := 0; g < 10000; g++ {
		guid := fmt.Sprintf("lrp-%06d", g)
		d = append(d, desired(guid, 10))
		for i := int32(0); i < 10; i++ {
			a = append(a, lrp(guid, i, onCell(fmt.Sprintf("cell-%04d", (g*10+int(i))%1000))))
		}
	}
	return Snapshot{Desired: d, Actual: a, Cells: cells, Domains: []*modelsv1.Domain{{Name: "fresh"}}, Now: now}
}

// BenchmarkMake plans a full pass at full scale with 100 cells vanished.
func BenchmarkMake(b *testing.B) {
	s := fullScale()
	for b.Loop() {
		if p := Make(s, timeouts); len(p.Changes) != 10000 {
			b.Fatalf("%d changes, want 10,000", len(p.Changes))
		}
	}
}

// BenchmarkCellLoss plans the same cell loss as BenchmarkMake the way a triggered pass does:
// only the vanished cells' records are given (store OnLostCells).
func BenchmarkCellLoss(b *testing.B) {
	s := fullScale()
	live := map[string]bool{}
	for _, c := range s.Cells {
		live[c.GetCellId()] = true
	}
	var off []*modelsv1.ActualLRP
	for _, a := range s.Actual {
		if !live[a.GetInstanceKey().GetCellId()] {
			off = append(off, a)
		}
	}
	s.Actual = off
	for b.Loop() {
		if p := CellLoss(s); len(p.Changes) != 10000 {
			b.Fatalf("%d changes, want 10,000", len(p.Changes))
		}
	}
}

// TestCellLossIsMakesCellRules: for random snapshots, CellLoss plans exactly the changes Make
// plans for the records and tasks of vanished cells, in the same order, whether it is given
// every record or only those of the vanished cells (as the store's OnLostCells gives).
func TestCellLossIsMakesCellRules(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	cellIDs := []string{"cell-1", "cell-2", "gone-1", "gone-2"}
	states := []modelsv1.ActualLRP_State{modelsv1.ActualLRP_STATE_UNCLAIMED, modelsv1.ActualLRP_STATE_CLAIMED,
		modelsv1.ActualLRP_STATE_RUNNING, modelsv1.ActualLRP_STATE_CRASHED}
	for round := 0; round < 300; round++ {
		var d []*modelsv1.DesiredLRPSchedulingInfo
		var a []*modelsv1.ActualLRP
		var tasks []*modelsv1.Task
		for g := 0; g < 6; g++ {
			guid := fmt.Sprintf("g%d", g)
			if r.IntN(4) > 0 {
				d = append(d, desired(guid, int32(r.IntN(4))))
			}
			for i := int32(0); i < 4; i++ {
				for _, p := range []modelsv1.ActualLRP_Presence{modelsv1.ActualLRP_PRESENCE_ORDINARY, modelsv1.ActualLRP_PRESENCE_SUSPECT, modelsv1.ActualLRP_PRESENCE_EVACUATING} {
					if r.IntN(3) > 0 {
						continue
					}
					st := states[r.IntN(len(states))]
					if p != modelsv1.ActualLRP_PRESENCE_ORDINARY {
						st = modelsv1.ActualLRP_STATE_RUNNING // suspect and evacuating copies hold a container
					}
					rec := lrp(guid, i, presence(p), state(st))
					if rec.GetState() != modelsv1.ActualLRP_STATE_UNCLAIMED && rec.GetState() != modelsv1.ActualLRP_STATE_CRASHED {
						rec.InstanceKey = &modelsv1.ActualLRPInstanceKey{InstanceGuid: fmt.Sprint(guid, i, p), CellId: cellIDs[r.IntN(len(cellIDs))]}
					}
					a = append(a, rec)
				}
			}
		}
		for i := 0; i < 4; i++ {
			tasks = append(tasks, task(fmt.Sprintf("t%d", i), []modelsv1.Task_State{modelsv1.Task_STATE_PENDING, modelsv1.Task_STATE_RUNNING}[r.IntN(2)],
				taskCell(cellIDs[r.IntN(len(cellIDs))])))
		}
		s := snap(d, a, tasks)
		gone := func(cell string) bool { return cell != "cell-1" && cell != "cell-2" }
		var want []Change
		for _, ch := range Make(s, timeouts).Changes {
			switch ch := ch.(type) {
			case MarkSuspect, FailTaskOnVanishedCell:
				want = append(want, ch)
			case RemoveEvacuating:
				for _, rec := range a {
					if rec.GetKey().GetProcessGuid() == ch.ProcessGuid && rec.GetKey().GetIndex() == ch.Index &&
						rec.GetPresence() == modelsv1.ActualLRP_PRESENCE_EVACUATING && gone(rec.GetInstanceKey().GetCellId()) {
						want = append(want, ch)
					}
				}
			}
		}
		off := s
		off.Actual = nil
		for _, rec := range a {
			if c := rec.GetInstanceKey().GetCellId(); c != "" && gone(c) {
				off.Actual = append(off.Actual, rec)
			}
		}
		for _, in := range []Snapshot{s, off} {
			got := CellLoss(in).Changes
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("round %d (%d records given): CellLoss planned %v, Make's cell rules %v", round, len(in.Actual), got, want)
			}
		}
	}
}

// TestFinishDrain checks the drain rule: a draining record (withdrawn from routing before a
// stop) is finished once the drain timeout has passed, or at once when its cell is gone; it is
// never retired again meanwhile, and a draining EVACUATING copy is not removed under its rep.
func TestFinishDrain(t *testing.T) {
	drainingFor := func(d time.Duration) func(*modelsv1.ActualLRP) {
		return func(a *modelsv1.ActualLRP) { a.DrainingSince = ago(d) }
	}
	to := timeouts
	to.Drain = 2 * time.Second
	tests := []struct {
		name  string
		snap  Snapshot
		want  []string
		found Found
	}{
		{name: "a drain within its timeout waits (not retired again)",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0), lrp("a", 1, drainingFor(time.Second))), nil),
			found: Found{LRPsExtra: 1}},
		{name: "a drain past its timeout is finished",
			snap:  snap(ds(desired("a", 1)), as(lrp("a", 0), lrp("a", 1, drainingFor(3*time.Second))), nil),
			want:  []string{"finish-drain a/1 (PRESENCE_ORDINARY) on cell-1"},
			found: Found{LRPsExtra: 1}},
		{name: "a drain of a removed LRP in a stale domain is finished too",
			snap:  snap(nil, as(lrp("gone", 0, domain("stale"), drainingFor(time.Minute))), nil),
			want:  []string{"finish-drain gone/0 (PRESENCE_ORDINARY) on cell-1"},
			found: Found{LRPsExtra: 1}},
		{name: "a drain on a vanished cell is finished at once",
			snap:  snap(nil, as(lrp("a", 0, onCell("gone"), drainingFor(0))), nil),
			want:  []string{"finish-drain a/0 (PRESENCE_ORDINARY) on gone"},
			found: Found{LRPsExtra: 1}},
		{name: "a draining evacuating copy is left to its rep within its timeout",
			snap: snap(ds(desired("a", 1)), as(lrp("a", 0, onCell("cell-2")),
				lrp("a", 0, presence(evacuating), drainingFor(time.Second))), nil)},
		{name: "a draining evacuating copy past its timeout is finished, not removed",
			snap: snap(nil, as(lrp("a", 0, presence(evacuating), drainingFor(time.Minute))), nil),
			want: []string{"finish-drain a/0 (PRESENCE_EVACUATING) on cell-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.snap, to)
			var got []string
			for _, c := range p.Changes {
				got = append(got, c.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("changes:\n got  %s\n want %s", strings.Join(got, "; "), strings.Join(tt.want, "; "))
			}
			if p.Found != tt.found {
				t.Errorf("found %+v, want %+v", p.Found, tt.found)
			}
		})
	}
}
