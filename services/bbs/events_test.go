package bbs_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// evEventStream is one SubscribeToEvents call.
type evEventStream struct {
	t      *testing.T
	stream bbsv1.BBSService_SubscribeToEventsClient
	cancel context.CancelFunc
	last   int64 // revision of the last response received
}

func evSubscribe(t *testing.T, env *bbstest.Env, since int64, f *bbsv1.Filter) *evEventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	t.Cleanup(cancel)
	if since == 0 {
		// "From now" as the test sees it: etcd's revision before the subscription, so that a
		// write the test makes after evSubscribe returns is never before the stream's start (a
		// server that took the stream late would otherwise start after it).
		resp, err := env.Etcd.Get(ctx, "/")
		if err != nil {
			cancel()
			t.Fatalf("current revision: %v", err)
		}
		since = resp.Header.Revision
	}
	stream, err := env.Client.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{SinceRevision: since, Filter: f})
	if err != nil {
		cancel()
		t.Fatalf("SubscribeToEvents(since %d): %v", since, err)
	}
	return &evEventStream{t: t, stream: stream, cancel: cancel}
}

// recv returns the next response, checking the invariants every response keeps: evRevisions
// never go back, an event response is a new revision with at least one event all of that
// revision, and a bookmark has no events.
func (s *evEventStream) recv() *bbsv1.SubscribeToEventsResponse {
	s.t.Helper()
	r, err := s.stream.Recv()
	if err != nil {
		s.t.Fatalf("Recv after revision %d: %v", s.last, err)
	}
	if r.GetBookmark() {
		if len(r.GetEvents()) != 0 {
			s.t.Fatalf("bookmark at %d carries %d events", r.GetRevision(), len(r.GetEvents()))
		}
		if r.GetRevision() < s.last {
			s.t.Fatalf("bookmark revision %d before last revision %d", r.GetRevision(), s.last)
		}
	} else {
		if len(r.GetEvents()) == 0 {
			s.t.Fatalf("empty event response at revision %d", r.GetRevision())
		}
		if r.GetRevision() <= s.last {
			s.t.Fatalf("event response at revision %d after revision %d: revisions must increase, one response per revision", r.GetRevision(), s.last)
		}
		for _, e := range r.GetEvents() {
			if e.GetRevision() != r.GetRevision() {
				s.t.Fatalf("event %s has revision %d in the response of revision %d", evKindName(e), e.GetRevision(), r.GetRevision())
			}
		}
	}
	s.last = r.GetRevision()
	return r
}

// until reads until a response at or after rev and returns the event responses read.
func (s *evEventStream) until(rev int64) []*bbsv1.SubscribeToEventsResponse {
	s.t.Helper()
	var out []*bbsv1.SubscribeToEventsResponse
	for s.last < rev {
		if r := s.recv(); !r.GetBookmark() {
			out = append(out, r)
		}
	}
	return out
}

// waitBookmark reads until a bookmark arrives, which proves the subscription is established.
func (s *evEventStream) waitBookmark() *bbsv1.SubscribeToEventsResponse {
	s.t.Helper()
	for {
		if r := s.recv(); r.GetBookmark() {
			return r
		}
	}
}

func evCurrentRev(t *testing.T, env *bbstest.Env) int64 {
	t.Helper()
	resp, err := env.Etcd.Get(ctxT(t), "/gavel", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// evKindName is the event's kind, e.g. "ActualLrpCreated".
func evKindName(e *bbsv1.Event) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", e.GetKind()), "*bbsv1.Event_")
}

func evKinds(evs []*bbsv1.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = evKindName(e)
	}
	return out
}

func evIk(guid, cell string) *modelsv1.ActualLRPInstanceKey {
	return &modelsv1.ActualLRPInstanceKey{InstanceGuid: guid, CellId: cell}
}

func evNetInfo() *modelsv1.ActualLRPNetInfo {
	return &modelsv1.ActualLRPNetInfo{Address: "10.0.0.1", InstanceAddress: "10.255.0.2", Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 61001}}}
}

func evCellPresence(id string) *modelsv1.CellPresence {
	return &modelsv1.CellPresence{CellId: id, RepAddress: "127.0.0.1:1800", Zone: "z1", Capacity: &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 1024, Containers: 10}}
}

func evPutCell(t *testing.T, env *bbstest.Env, c *modelsv1.CellPresence) {
	t.Helper()
	b, err := proto.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Etcd.Put(ctxT(t), store.CellKey(c.GetCellId()), string(b)); err != nil {
		t.Fatal(err)
	}
}

// evSubject is what an event is about, worked out independently of the store's filter.
type evSubject struct {
	domain, guid string
	cells        []string
}

func evSubjectOf(e *bbsv1.Event) evSubject {
	actual := func(as ...*modelsv1.ActualLRP) evSubject {
		var s evSubject
		for _, a := range as {
			if a != nil {
				s.domain, s.guid = a.GetKey().GetDomain(), a.GetKey().GetProcessGuid()
				s.cells = append(s.cells, a.GetInstanceKey().GetCellId())
			}
		}
		return s
	}
	task := func(ts ...*modelsv1.Task) evSubject {
		var s evSubject
		for _, t := range ts {
			s.domain, s.guid = t.GetDomain(), t.GetTaskGuid()
			s.cells = append(s.cells, t.GetCellId())
		}
		return s
	}
	switch k := e.GetKind().(type) {
	case *bbsv1.Event_DesiredLrpCreated:
		d := k.DesiredLrpCreated.GetDesiredLrp()
		return evSubject{domain: d.GetDomain(), guid: d.GetProcessGuid()}
	case *bbsv1.Event_DesiredLrpChanged:
		d := k.DesiredLrpChanged.GetAfter()
		return evSubject{domain: d.GetDomain(), guid: d.GetProcessGuid()}
	case *bbsv1.Event_DesiredLrpRemoved:
		d := k.DesiredLrpRemoved.GetDesiredLrp()
		return evSubject{domain: d.GetDomain(), guid: d.GetProcessGuid()}
	case *bbsv1.Event_ActualLrpCreated:
		return actual(k.ActualLrpCreated.GetActualLrp())
	case *bbsv1.Event_ActualLrpChanged:
		return actual(k.ActualLrpChanged.GetBefore(), k.ActualLrpChanged.GetAfter())
	case *bbsv1.Event_ActualLrpRemoved:
		return actual(k.ActualLrpRemoved.GetActualLrp())
	case *bbsv1.Event_ActualLrpCrashed:
		c := k.ActualLrpCrashed
		return evSubject{domain: c.GetKey().GetDomain(), guid: c.GetKey().GetProcessGuid(), cells: []string{c.GetInstanceKey().GetCellId()}}
	case *bbsv1.Event_TaskCreated:
		return task(k.TaskCreated.GetTask())
	case *bbsv1.Event_TaskChanged:
		return task(k.TaskChanged.GetBefore(), k.TaskChanged.GetAfter())
	case *bbsv1.Event_TaskRemoved:
		return task(k.TaskRemoved.GetTask())
	case *bbsv1.Event_CellAppeared:
		return evSubject{cells: []string{k.CellAppeared.GetCell().GetCellId()}}
	case *bbsv1.Event_CellDisappeared:
		return evSubject{cells: []string{k.CellDisappeared.GetCell().GetCellId()}}
	}
	return evSubject{}
}

// evKeep filters event responses with pred, dropping responses left empty.
func evKeep(rs []*bbsv1.SubscribeToEventsResponse, pred func(evSubject) bool) []*bbsv1.SubscribeToEventsResponse {
	var out []*bbsv1.SubscribeToEventsResponse
	for _, r := range rs {
		var evs []*bbsv1.Event
		for _, e := range r.GetEvents() {
			if pred(evSubjectOf(e)) {
				evs = append(evs, e)
			}
		}
		if len(evs) > 0 {
			out = append(out, &bbsv1.SubscribeToEventsResponse{Revision: r.GetRevision(), Events: evs})
		}
	}
	return out
}

func evSameResponses(t *testing.T, what string, got, want []*bbsv1.SubscribeToEventsResponse) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d responses %v, want %d %v", what, len(got), evRevisions(got), len(want), evRevisions(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s: response %d:\n got %v\nwant %v", what, i, got[i], want[i])
		}
	}
}

func evRevisions(rs []*bbsv1.SubscribeToEventsResponse) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.GetRevision()
	}
	return out
}

func TestEventsLifecycleAndFilters(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	all := evSubscribe(t, env, 0, nil)
	all.waitBookmark()
	r0 := evCurrentRev(t, env)
	filters := map[string]struct {
		filter *bbsv1.Filter
		pred   func(evSubject) bool
	}{
		"domain": {&bbsv1.Filter{Domain: "apps"}, func(s evSubject) bool { return s.domain == "apps" }},
		"guids":  {&bbsv1.Filter{ProcessGuids: []string{"web", "t1"}}, func(s evSubject) bool { return s.guid == "web" || s.guid == "t1" }},
		"cell":   {&bbsv1.Filter{CellId: "cell-1"}, func(s evSubject) bool { return slices.Contains(s.cells, "cell-1") }},
	}
	filtered := map[string]*evEventStream{}
	for name, f := range filters {
		filtered[name] = evSubscribe(t, env, r0, f.filter)
	}

	web0 := evIk("ig-web-0", "cell-1")
	three, v2 := int32(3), "v2"
	worker := lrp("worker", 1)
	worker.Domain = "other"
	moved := evCellPresence("cell-1")
	moved.Zone = "z2"
	steps := []struct {
		name string
		do   func() error
		want []string
	}{
		{"desire web", func() error {
			_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 2)})
			return err
		}, []string{"DesiredLrpCreated", "ActualLrpCreated", "ActualLrpCreated"}},
		{"desire worker", func() error {
			_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: worker})
			return err
		}, []string{"DesiredLrpCreated", "ActualLrpCreated"}},
		{"claim web/0", func() error {
			_, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: web0})
			return err
		}, []string{"ActualLrpChanged"}},
		{"start web/0", func() error {
			_, err := env.Client.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: web0, NetInfo: evNetInfo()})
			return err
		}, []string{"ActualLrpChanged"}},
		{"claim worker/0", func() error {
			_, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "worker", Index: 0, InstanceKey: evIk("ig-worker-0", "cell-2")})
			return err
		}, []string{"ActualLrpChanged"}},
		{"crash web/0", func() error {
			_, err := env.Client.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: web0, ErrorMessage: "boom"})
			return err
		}, []string{"ActualLrpChanged", "ActualLrpCrashed"}},
		{"update web", func() error {
			_, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Instances: &three, Annotation: &v2}})
			return err
		}, []string{"DesiredLrpChanged", "ActualLrpCreated"}},
		{"remove web", func() error {
			_, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"})
			return err
		}, []string{"DesiredLrpRemoved", "ActualLrpRemoved", "ActualLrpRemoved", "ActualLrpRemoved"}},
		{"desire task", func() error {
			_, err := env.Client.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: "t1", Domain: "apps", Definition: &modelsv1.TaskDefinition{
				Rootfs: "docker:///library/alpine#3",
				Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/true"}}},
			}})
			return err
		}, []string{"TaskCreated"}},
		{"start task", func() error {
			_, err := env.Client.StartTask(ctx, &bbsv1.StartTaskRequest{TaskGuid: "t1", CellId: "cell-1"})
			return err
		}, []string{"TaskChanged"}},
		{"complete task", func() error {
			_, err := env.Client.CompleteTask(ctx, &bbsv1.CompleteTaskRequest{TaskGuid: "t1", CellId: "cell-1", Result: "ok"})
			return err
		}, []string{"TaskChanged"}},
		{"resolve task", func() error {
			_, err := env.Client.ResolvingTask(ctx, &bbsv1.ResolvingTaskRequest{TaskGuid: "t1"})
			return err
		}, []string{"TaskChanged"}},
		{"delete task", func() error {
			_, err := env.Client.DeleteTask(ctx, &bbsv1.DeleteTaskRequest{TaskGuid: "t1"})
			return err
		}, []string{"TaskRemoved"}},
		{"cell-1 appears", func() error { evPutCell(t, env, evCellPresence("cell-1")); return nil }, []string{"CellAppeared"}},
		{"cell-2 appears", func() error { evPutCell(t, env, evCellPresence("cell-2")); return nil }, []string{"CellAppeared"}},
		// A re-registration is not an appearance: its revision has no event and no response.
		{"cell-1 re-registers", func() error { evPutCell(t, env, moved); return nil }, nil},
		{"cell-1 disappears", func() error {
			_, err := env.Etcd.Delete(ctx, store.CellKey("cell-1"))
			return err
		}, []string{"CellDisappeared"}},
	}
	type expect struct {
		step  string
		rev   int64
		kinds []string
	}
	var want []expect
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		rev := evCurrentRev(t, env)
		if s.want != nil {
			want = append(want, expect{s.name, rev, s.want})
		}
	}
	final := evCurrentRev(t, env)

	got := all.until(final)
	if len(got) != len(want) {
		t.Fatalf("got %d responses at revisions %v, want %d", len(got), evRevisions(got), len(want))
	}
	for i, w := range want {
		if got[i].GetRevision() != w.rev || !slices.Equal(evKinds(got[i].GetEvents()), w.kinds) {
			t.Fatalf("%s: got revision %d %v, want revision %d %v", w.step, got[i].GetRevision(), evKinds(got[i].GetEvents()), w.rev, w.kinds)
		}
	}

	// The payloads.
	desire := got[0].GetEvents()
	if d := desire[0].GetDesiredLrpCreated().GetDesiredLrp(); d.GetProcessGuid() != "web" || d.GetInstances() != 2 || d.GetAction() == nil || d.GetModificationTag().GetEpoch() == "" {
		t.Fatalf("DesiredLrpCreated carries %v", d)
	}
	for i, e := range desire[1:] {
		a := e.GetActualLrpCreated().GetActualLrp()
		if a.GetKey().GetIndex() != int32(i) || a.GetState() != modelsv1.ActualLRP_STATE_UNCLAIMED {
			t.Fatalf("ActualLrpCreated %d carries %v", i, a)
		}
	}
	start := got[3].GetEvents()[0].GetActualLrpChanged()
	if start.GetBefore().GetState() != modelsv1.ActualLRP_STATE_CLAIMED || start.GetAfter().GetState() != modelsv1.ActualLRP_STATE_RUNNING || !proto.Equal(start.GetAfter().GetNetInfo(), evNetInfo()) {
		t.Fatalf("start changed %v", start)
	}
	crash := got[5].GetEvents()
	if c := crash[0].GetActualLrpChanged(); c.GetBefore().GetState() != modelsv1.ActualLRP_STATE_RUNNING || c.GetAfter().GetState() != modelsv1.ActualLRP_STATE_UNCLAIMED || c.GetAfter().GetCrashCount() != 1 {
		t.Fatalf("crash changed %v", c)
	}
	if c := crash[1].GetActualLrpCrashed(); c.GetKey().GetProcessGuid() != "web" || c.GetKey().GetIndex() != 0 || !proto.Equal(c.GetInstanceKey(), web0) || c.GetCrashCount() != 1 || c.GetCrashReason() != "boom" {
		t.Fatalf("crashed %v", c)
	}
	update := got[6].GetEvents()
	if c := update[0].GetDesiredLrpChanged(); c.GetBefore().GetInstances() != 2 || c.GetBefore().GetAnnotation() != "" || c.GetAfter().GetInstances() != 3 || c.GetAfter().GetAnnotation() != "v2" ||
		c.GetAfter().GetAction() == nil || c.GetAfter().GetModificationTag().GetIndex() != c.GetBefore().GetModificationTag().GetIndex()+1 {
		t.Fatalf("DesiredLrpChanged %v", c)
	}
	if a := update[1].GetActualLrpCreated().GetActualLrp(); a.GetKey().GetIndex() != 2 {
		t.Fatalf("scale up created %v", a)
	}
	if d := got[7].GetEvents()[0].GetDesiredLrpRemoved().GetDesiredLrp(); d.GetProcessGuid() != "web" || d.GetInstances() != 3 {
		t.Fatalf("DesiredLrpRemoved %v", d)
	}
	var removed []int32
	for _, e := range got[7].GetEvents()[1:] {
		removed = append(removed, e.GetActualLrpRemoved().GetActualLrp().GetKey().GetIndex())
	}
	if slices.Sort(removed); !slices.Equal(removed, []int32{0, 1, 2}) {
		t.Fatalf("removed indices %v", removed)
	}
	taskStates := [][2]modelsv1.Task_State{
		{modelsv1.Task_STATE_PENDING, modelsv1.Task_STATE_RUNNING},
		{modelsv1.Task_STATE_RUNNING, modelsv1.Task_STATE_COMPLETED},
		{modelsv1.Task_STATE_COMPLETED, modelsv1.Task_STATE_RESOLVING},
	}
	for i, st := range taskStates {
		c := got[9+i].GetEvents()[0].GetTaskChanged()
		if c.GetBefore().GetState() != st[0] || c.GetAfter().GetState() != st[1] {
			t.Fatalf("task change %d: %v -> %v, want %v", i, c.GetBefore().GetState(), c.GetAfter().GetState(), st)
		}
	}
	if c := got[13].GetEvents()[0].GetCellAppeared().GetCell(); !proto.Equal(c, evCellPresence("cell-1")) {
		t.Fatalf("CellAppeared %v", c)
	}
	if c := got[15].GetEvents()[0].GetCellDisappeared().GetCell(); !proto.Equal(c, moved) {
		t.Fatalf("CellDisappeared carries %v, want the last registration %v", c, moved)
	}

	for name, f := range filters {
		t.Run("filter "+name, func(t *testing.T) {
			s := filtered[name]
			s.t = t
			want := evKeep(got, f.pred)
			if len(want) == 0 || len(want) == len(got) {
				t.Fatalf("filter %s should keep some but not all of %d responses, keeps %d", name, len(got), len(want))
			}
			// Filtered subscribers hear of the store's progress by bookmarks.
			evSameResponses(t, name, s.until(final), want)
		})
	}
	// Spot checks of what each filter delivers.
	kindsOf := func(rs []*bbsv1.SubscribeToEventsResponse) []string {
		var out []string
		for _, r := range rs {
			out = append(out, evKinds(r.GetEvents())...)
		}
		return out
	}
	if k := kindsOf(evKeep(got, filters["cell"].pred)); !slices.Equal(k, []string{"ActualLrpChanged", "ActualLrpChanged", "ActualLrpChanged", "ActualLrpCrashed",
		"TaskChanged", "TaskChanged", "TaskChanged", "TaskRemoved", "CellAppeared", "CellDisappeared"}) {
		t.Fatalf("cell filter kinds %v", k)
	}
}

// evChurn makes changes to the LRP guid, one revision each: desire, claim, start, update, crash,
// remove (six evRevisions).
func evChurn(t *testing.T, env *bbstest.Env, guid string) {
	t.Helper()
	ctx := ctxT(t)
	key := evIk("ig-"+guid, "cell-1")
	note := "churned"
	calls := []func() error{
		func() error {
			_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp(guid, 1)})
			return err
		},
		func() error {
			_, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, InstanceKey: key})
			return err
		},
		func() error {
			_, err := env.Client.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: guid, InstanceKey: key, NetInfo: evNetInfo()})
			return err
		},
		func() error {
			_, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: guid, Update: &modelsv1.DesiredLRPUpdate{Annotation: &note}})
			return err
		},
		func() error {
			_, err := env.Client.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{ProcessGuid: guid, InstanceKey: key, ErrorMessage: "oom"})
			return err
		},
		func() error {
			_, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: guid})
			return err
		},
	}
	for i, c := range calls {
		if err := c(); err != nil {
			t.Fatalf("churn %s step %d: %v", guid, i, err)
		}
	}
}

func TestSubscribeToEventsResume(t *testing.T) {
	for _, tc := range []struct {
		name string
		ring int
	}{{"within the ring", 0}, {"etcd fallback", 5}} {
		t.Run(tc.name, func(t *testing.T) {
			env := bbstest.Start(t, func(c *bbs.Config) {
				if tc.ring > 0 {
					c.EventRing = tc.ring
				}
			})
			start := evCurrentRev(t, env)
			witness := evSubscribe(t, env, start, nil)
			first := evSubscribe(t, env, start, nil)
			evChurn(t, env, "a")
			evChurn(t, env, "b")
			seen := first.until(evCurrentRev(t, env))
			if len(seen) != 12 {
				t.Fatalf("first subscriber saw %d responses, want 12", len(seen))
			}
			r := seen[2].GetRevision() // mid-way through a desired LRP's life
			first.cancel()
			for i := range 4 {
				evChurn(t, env, fmt.Sprintf("c%d", i)) // 24 revisions: far beyond a ring of 5
			}
			// "a" again, running something else: replaying the first "a"'s update must not
			// borrow the new incarnation's run info.
			again := lrp("a", 1)
			again.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/other"}}}
			if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: again}); err != nil {
				t.Fatal(err)
			}
			final := evCurrentRev(t, env)
			resumed := evSubscribe(t, env, r, nil).until(final)
			everything := witness.until(final)
			var want []*bbsv1.SubscribeToEventsResponse
			for _, x := range everything {
				if x.GetRevision() > r {
					want = append(want, x)
				}
			}
			if len(want) != 12-3+24+1 {
				t.Fatalf("witness saw %d responses after %d, want %d", len(want), r, 12-3+24+1)
			}
			evSameResponses(t, "resumed", resumed, want)
		})
	}
}

func TestSubscribeToEventsBookmarks(t *testing.T) {
	env := bbstest.Start(t, func(c *bbs.Config) { c.EventRing = 5 })
	evChurn(t, env, "a")
	evChurn(t, env, "b") // 12 revisions: the first ones have left the ring
	rev := evCurrentRev(t, env)

	check := func(t *testing.T, s *evEventStream, replay int) {
		if got := s.until(rev); len(got) != replay {
			t.Fatalf("replayed %d responses, want %d", len(got), replay)
		}
		for range 2 {
			b := s.waitBookmark()
			if b.GetRevision() != rev {
				t.Fatalf("bookmark at revision %d, want the current revision %d", b.GetRevision(), rev)
			}
		}
	}
	t.Run("ring", func(t *testing.T) {
		s := evSubscribe(t, env, 0, nil)
		check(t, s, 0)
		// A change between bookmarks moves them on.
		evChurn(t, env, "c")
		rev = evCurrentRev(t, env)
		check(t, s, 6)
	})
	t.Run("etcd fallback", func(t *testing.T) {
		s := evSubscribe(t, env, 1, &bbsv1.Filter{ProcessGuids: []string{"b"}})
		check(t, s, 6)
	})
}

func TestSubscribeToEventsSinceFutureRevision(t *testing.T) {
	env := bbstest.Start(t)
	evChurn(t, env, "a")
	cur := evCurrentRev(t, env)
	for _, since := range []int64{cur + 1, cur + 1000} {
		s := evSubscribe(t, env, since, nil)
		_, err := s.stream.Recv()
		wantCode(t, err, codes.OutOfRange)
	}
	// The current revision itself is fine.
	s := evSubscribe(t, env, cur, nil)
	if b := s.waitBookmark(); b.GetRevision() != cur {
		t.Fatalf("bookmark at %d, want %d", b.GetRevision(), cur)
	}
}

// evActualKey names an instance record.
func evActualKey(a *modelsv1.ActualLRP) string {
	return fmt.Sprintf("%s/%d/%v", a.GetKey().GetProcessGuid(), a.GetKey().GetIndex(), a.GetPresence())
}

// evRebuilt is a client's copy of the actual LRPs, kept up to date by events.
type evRebuilt map[string]*modelsv1.ActualLRP

func evRebuild(list []*modelsv1.ActualLRP) evRebuilt {
	m := evRebuilt{}
	for _, a := range list {
		m[evActualKey(a)] = a
	}
	return m
}

// apply applies one event, failing on any event that does not follow from the copy: a creation
// of a known record, a change or removal whose before is not the record held (a lost, repeated
// or reordered event shows up here).
func (m evRebuilt) apply(t *testing.T, e *bbsv1.Event) {
	t.Helper()
	same := func(what string, held, before *modelsv1.ActualLRP) {
		if held == nil {
			t.Fatalf("rev %d: %s of unknown record %s", e.GetRevision(), what, evActualKey(before))
		}
		if !proto.Equal(held, before) {
			t.Fatalf("rev %d: %s of %s: before is tag %v, held copy is tag %v", e.GetRevision(), what, evActualKey(before), before.GetModificationTag(), held.GetModificationTag())
		}
	}
	switch k := e.GetKind().(type) {
	case *bbsv1.Event_ActualLrpCreated:
		a := k.ActualLrpCreated.GetActualLrp()
		if held := m[evActualKey(a)]; held != nil {
			t.Fatalf("rev %d: created %s which is already held (tag %v)", e.GetRevision(), evActualKey(a), held.GetModificationTag())
		}
		m[evActualKey(a)] = a
	case *bbsv1.Event_ActualLrpChanged:
		b, a := k.ActualLrpChanged.GetBefore(), k.ActualLrpChanged.GetAfter()
		same("change", m[evActualKey(b)], b)
		if a.GetModificationTag().GetEpoch() != b.GetModificationTag().GetEpoch() || a.GetModificationTag().GetIndex() <= b.GetModificationTag().GetIndex() {
			t.Fatalf("rev %d: change of %s moves the tag from %v to %v", e.GetRevision(), evActualKey(b), b.GetModificationTag(), a.GetModificationTag())
		}
		m[evActualKey(a)] = a
	case *bbsv1.Event_ActualLrpRemoved:
		b := k.ActualLrpRemoved.GetActualLrp()
		same("removal", m[evActualKey(b)], b)
		delete(m, evActualKey(b))
	}
}

func TestSubscribeToEventsListThenWatchAcrossCompaction(t *testing.T) {
	env := bbstest.Start(t, func(c *bbs.Config) { c.EventRing = 5 })
	ctx := ctxT(t)
	guids := []string{"w0", "w1", "w2", "w3"}
	for _, g := range guids {
		if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp(g, 2)}); err != nil {
			t.Fatal(err)
		}
	}
	list := func() *bbsv1.ActualLRPsResponse {
		resp, err := env.Client.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := list()
	evChurn(t, env, "x")
	evChurn(t, env, "y")
	cur := evCurrentRev(t, env)
	if _, err := env.Etcd.Compact(ctx, cur, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	_, err := evSubscribe(t, env, first.GetRevision(), nil).stream.Recv()
	wantCode(t, err, codes.OutOfRange)

	// A writer keeps changing instances while the client lists again and subscribes.
	const changes = 200
	var wg sync.WaitGroup
	wg.Add(1)
	errs := make(chan error, 1)
	early, listed := make(chan struct{}), make(chan struct{})
	go func() {
		defer wg.Done()
		var once sync.Once
		signal := func() { once.Do(func() { close(early) }) }
		defer signal()
		one, two := int32(1), int32(2)
		for i := range changes {
			if i == 20 {
				signal()
				<-listed // some changes before the list, most after it
			}
			g := guids[i%len(guids)]
			key := evIk("ig-"+g, "cell-1")
			var err error
			switch (i / len(guids)) % 8 {
			case 0, 3:
				_, err = env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: g, InstanceKey: key})
			case 1, 4:
				_, err = env.Client.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: g, InstanceKey: key, NetInfo: evNetInfo()})
			case 2:
				_, err = env.Client.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{ProcessGuid: g, InstanceKey: key, ErrorMessage: "crash"})
			case 5:
				_, err = env.Client.RemoveActualLRP(ctx, &bbsv1.RemoveActualLRPRequest{ProcessGuid: g, InstanceKey: key})
			case 6: // removes index 1
				_, err = env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: g, Update: &modelsv1.DesiredLRPUpdate{Instances: &one}})
			case 7: // creates indices 0 and 1
				_, err = env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: g, Update: &modelsv1.DesiredLRPUpdate{Instances: &two}})
			}
			if err != nil {
				errs <- fmt.Errorf("change %d on %s: %w", i, g, err)
				return
			}
		}
	}()
	<-early
	second := list()
	close(listed)
	stream := evSubscribe(t, env, second.GetRevision(), nil)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	final := list()
	if final.GetRevision() < second.GetRevision()+changes-20 {
		t.Fatalf("final list at %d, second list at %d: the writer made too few changes", final.GetRevision(), second.GetRevision())
	}
	want := evRebuild(final.GetActualLrps())
	// The subscriber that kept up, and one that subscribes from the same list only now (its
	// revision has left the ring of 5, so etcd serves it), both rebuild the fresh list.
	late := evSubscribe(t, env, second.GetRevision(), nil)
	for name, s := range map[string]*evEventStream{"concurrent": stream, "late": late} {
		state := evRebuild(second.GetActualLrps())
		n := 0
		for _, r := range s.until(final.GetRevision()) {
			if r.GetRevision() > final.GetRevision() {
				break
			}
			if r.GetRevision() <= second.GetRevision() {
				t.Fatalf("%s: event at %d, not after the list's revision %d", name, r.GetRevision(), second.GetRevision())
			}
			for _, e := range r.GetEvents() {
				state.apply(t, e)
				n++
			}
		}
		if len(state) != len(want) {
			t.Fatalf("%s: rebuilt %d records, fresh list has %d", name, len(state), len(want))
		}
		for k, a := range want {
			if !proto.Equal(state[k], a) {
				t.Fatalf("%s: %s: rebuilt %v\nfresh list %v", name, k, state[k], a)
			}
		}
		t.Logf("%s: applied %d events between revisions %d and %d", name, n, second.GetRevision(), final.GetRevision())
	}
}

// TestSubscribeToEventsLabelSelector: a subscription's label_selector keeps the events a list
// with the same selector would show: a desired LRP's own events and its instances' by the
// desired LRP's labels as of each event's revision (a change by either side), tasks by their
// definition's labels, and no presence events; served from the ring and from etcd alike.
func TestSubscribeToEventsLabelSelector(t *testing.T) {
	for _, tc := range []struct {
		name string
		ring int
	}{{"within the ring", 0}, {"etcd fallback", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			env := bbstest.Start(t, func(c *bbs.Config) {
				if tc.ring > 0 {
					c.EventRing = tc.ring
				}
			})
			ctx := ctxT(t)
			r0 := evCurrentRev(t, env)
			var live *evEventStream
			if tc.ring == 0 {
				live = evSubscribe(t, env, r0, &bbsv1.Filter{LabelSelector: "app=web"})
			}
			relabel := func(guid, app string) func() error {
				return func() error {
					_, err := env.Client.UpdateDesiredLRP(ctx, labelsUpdate(guid, map[string]string{"app": app}))
					return err
				}
			}
			task := func(guid, app string) func() error {
				return func() error {
					def := taskDefinition()
					def.Labels = map[string]string{"app": app}
					_, err := env.Client.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: guid, Domain: "apps", Definition: def})
					return err
				}
			}
			web0 := evIk("ig-web-0", "cell-1")
			steps := []struct {
				name string
				do   func() error
				want []string // the kinds app=web keeps
			}{
				{"desire web", func() error {
					_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 1)})
					return err
				}, []string{"DesiredLrpCreated", "ActualLrpCreated"}},
				{"desire worker", func() error {
					_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("worker", 1)})
					return err
				}, nil},
				{"claim web/0: web's instance", func() error {
					_, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: web0})
					return err
				}, []string{"ActualLrpChanged"}},
				{"claim worker/0", func() error {
					_, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "worker", Index: 0, InstanceKey: evIk("ig-worker-0", "cell-2")})
					return err
				}, nil},
				{"task labelled web", task("t-web", "web"), []string{"TaskCreated"}},
				{"task labelled other", task("t-other", "other"), nil},
				{"a cell appears", func() error { evPutCell(t, env, evCellPresence("cell-1")); return nil }, nil},
				{"web relabelled api: its before side matches", relabel("web", "api"), []string{"DesiredLrpChanged"}},
				{"crash web/0: web is api now", func() error {
					_, err := env.Client.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: web0, ErrorMessage: "boom"})
					return err
				}, nil},
				{"worker relabelled web: its after side matches", relabel("worker", "web"), []string{"DesiredLrpChanged"}},
				{"desire db, unclaimed", func() error {
					d := lrp("db", 1)
					d.Labels = map[string]string{"app": "web"}
					_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
					return err
				}, []string{"DesiredLrpCreated", "ActualLrpCreated"}},
				{"remove db: its instance goes in the same revision", func() error {
					_, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "db"})
					return err
				}, []string{"DesiredLrpRemoved", "ActualLrpRemoved"}},
			}
			type expect struct {
				step  string
				rev   int64
				kinds []string
			}
			var want []expect
			for _, s := range steps {
				if err := s.do(); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if s.want != nil {
					want = append(want, expect{s.name, evCurrentRev(t, env), s.want})
				}
			}
			final := evCurrentRev(t, env)
			if live == nil { // every revision has left a ring of 3: served by an etcd watch
				live = evSubscribe(t, env, r0, &bbsv1.Filter{LabelSelector: "app=web"})
			}
			got := live.until(final)
			var gotSteps []string
			for _, r := range got {
				gotSteps = append(gotSteps, fmt.Sprint(r.GetRevision(), evKinds(r.GetEvents())))
			}
			var wantSteps []string
			for _, w := range want {
				wantSteps = append(wantSteps, fmt.Sprint(w.rev, w.kinds))
			}
			if !slices.Equal(gotSteps, wantSteps) {
				t.Fatalf("app=web kept\n%v\nwant\n%v", gotSteps, wantSteps)
			}
		})
	}
}

// TestSubscribeToEventsKinds: a subscriber that names kinds gets only events of those kinds
// (a rep follows links and log drains, not its own instances' changes); an unknown kind is
// InvalidArgument naming it.
func TestSubscribeToEventsKinds(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	since := evCurrentRev(t, env)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := env.Client.SubscribeToEvents(sctx, &bbsv1.SubscribeToEventsRequest{SinceRevision: since,
		Kinds: []string{"desired_lrp_changed", "actual_lrp_crashed"}})
	if err != nil {
		t.Fatal(err)
	}
	s := &evEventStream{t: t, stream: stream, cancel: cancel}
	web0 := evIk("ig-web-0", "cell-1")
	three := int32(3)
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: web0}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: web0, ErrorMessage: "boom"}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Instances: &three}}); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range s.until(evCurrentRev(t, env)) {
		kinds = append(kinds, evKinds(r.GetEvents())...)
	}
	if !slices.Equal(kinds, []string{"ActualLrpCrashed", "DesiredLrpChanged"}) {
		t.Fatalf("events %v, want only the crash and the desired change", kinds)
	}

	bad, err := env.Client.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{Kinds: []string{"links_changed", "everything"}})
	if err == nil {
		_, err = bad.Recv()
	}
	wantBadRequestField(t, err, "kinds[1]")
}
