package store

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/labels"
)

// randomEvent is an event of a random kind naming random cells (or none) and domains.
func randomEvent(r *rand.Rand) *bbsv1.Event {
	cell := func() string { return []string{"", "c0", "c1", "c2", "c3"}[r.IntN(5)] }
	domain := []string{"d0", "d1"}[r.IntN(2)]
	actual := func() *modelsv1.ActualLRP {
		if r.IntN(6) == 0 {
			return nil
		}
		return &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: "p", Domain: domain},
			InstanceKey: &modelsv1.ActualLRPInstanceKey{CellId: cell()}}
	}
	task := func() *modelsv1.Task { return &modelsv1.Task{TaskGuid: "t", Domain: domain, CellId: cell()} }
	presence := func() *modelsv1.CellPresence { return &modelsv1.CellPresence{CellId: cell()} }
	switch r.IntN(14) {
	case 0:
		return &bbsv1.Event{Kind: &bbsv1.Event_ActualLrpCreated{ActualLrpCreated: &bbsv1.ActualLRPCreated{ActualLrp: actual()}}}
	case 1:
		return &bbsv1.Event{Kind: &bbsv1.Event_ActualLrpChanged{ActualLrpChanged: &bbsv1.ActualLRPChanged{Before: actual(), After: actual()}}}
	case 2:
		return &bbsv1.Event{Kind: &bbsv1.Event_ActualLrpRemoved{ActualLrpRemoved: &bbsv1.ActualLRPRemoved{ActualLrp: actual()}}}
	case 3:
		return &bbsv1.Event{Kind: &bbsv1.Event_ActualLrpCrashed{ActualLrpCrashed: &bbsv1.ActualLRPCrashed{
			Key: &modelsv1.ActualLRPKey{ProcessGuid: "p", Domain: domain}, InstanceKey: &modelsv1.ActualLRPInstanceKey{CellId: cell()}}}}
	case 4:
		return &bbsv1.Event{Kind: &bbsv1.Event_TaskCreated{TaskCreated: &bbsv1.TaskCreated{Task: task()}}}
	case 5:
		return &bbsv1.Event{Kind: &bbsv1.Event_TaskChanged{TaskChanged: &bbsv1.TaskChanged{Before: task(), After: task()}}}
	case 6:
		return &bbsv1.Event{Kind: &bbsv1.Event_TaskRemoved{TaskRemoved: &bbsv1.TaskRemoved{Task: task()}}}
	case 7:
		return &bbsv1.Event{Kind: &bbsv1.Event_CellAppeared{CellAppeared: &bbsv1.CellAppeared{Cell: presence()}}}
	case 8:
		return &bbsv1.Event{Kind: &bbsv1.Event_CellDisappeared{CellDisappeared: &bbsv1.CellDisappeared{Cell: presence()}}}
	case 9:
		return &bbsv1.Event{Kind: &bbsv1.Event_LinksChanged{LinksChanged: &bbsv1.LinksChanged{ProcessGuid: "p", Domain: domain}}}
	case 10:
		drains := func() []string {
			if r.IntN(2) == 0 {
				return nil
			}
			return []string{"syslog://127.0.0.1:514"}
		}
		return &bbsv1.Event{Kind: &bbsv1.Event_DesiredLrpChanged{DesiredLrpChanged: &bbsv1.DesiredLRPChanged{
			Before: &modelsv1.DesiredLRP{ProcessGuid: "p", Domain: domain, LogDrains: drains()},
			After:  &modelsv1.DesiredLRP{ProcessGuid: "p", Domain: domain, LogDrains: drains()}}}}
	case 11:
		return &bbsv1.Event{Kind: &bbsv1.Event_DesiredLrpRemoved{DesiredLrpRemoved: &bbsv1.DesiredLRPRemoved{
			DesiredLrp: &modelsv1.DesiredLRP{ProcessGuid: "p", Domain: domain}}}}
	default:
		return &bbsv1.Event{Kind: &bbsv1.Event_DesiredLrpCreated{DesiredLrpCreated: &bbsv1.DesiredLRPCreated{
			DesiredLrp: &modelsv1.DesiredLRP{ProcessGuid: "p", Domain: domain}}}}
	}
}

// readAll reads every message a subscriber with filter f would be sent after rev, through
// read, as "rev:event-index,…" strings (indexes into the revision's batch).
func readAll(t *testing.T, read func(int64, int) ([]batch, int64, <-chan struct{}, bool), f EventFilter, rev, head int64) ([]string, bool) {
	t.Helper()
	var out []string
	for cursor := rev; cursor < head; {
		bs, upTo, _, ok := read(cursor, 3) // small pages exercise the max
		if !ok {
			return out, false
		}
		for _, b := range bs {
			if evs := f.filterEvents(b); len(evs) > 0 {
				out = append(out, fmt.Sprint(b.rev, evs))
			}
		}
		if upTo <= cursor {
			t.Fatalf("no progress from %d", cursor)
		}
		cursor = upTo
	}
	return out, true
}

// TestCellIndexMatchesTheFilter: for random event streams (every kind, events naming no cell,
// several cells, or every cell, some with labels), a cell's subscriber reading through the cell
// index (which hands it only its cell's events of a revision) gets exactly the messages the
// whole ring filtered by its filter gives, from any revision, including after the ring has
// been trimmed and reset. So does one whose kinds pass a cell filter only for every cell (a
// rep's, following links and log drains), reading only the broadcast revisions.
func TestCellIndexMatchesTheFilter(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	kinds, err := EventKinds([]string{"links_changed", "actual_lrp_changed", "cell_appeared"})
	if err != nil {
		t.Fatal(err)
	}
	broadcastKinds, err := EventKinds([]string{"links_changed", "desired_lrp_changed", "desired_lrp_created", "desired_lrp_removed"})
	if err != nil {
		t.Fatal(err)
	}
	selector, err := labels.Parse("team=a")
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 200; round++ {
		h := newHub(4 + r.IntN(8))
		h.reset(int64(r.IntN(5)))
		unfollow := h.follow("c1") // one subscribed cell; the others are indexed unsubscribed
		_, rev := h.window()
		for n := 10 + r.IntN(40); n > 0; n-- {
			rev += 1 + int64(r.IntN(2))
			var evs []*bbsv1.Event
			var sets []labelSets
			for k := r.IntN(6); k > 0; k-- {
				evs = append(evs, randomEvent(r))
				sets = append(sets, labelSets{{"team": []string{"a", "b"}[r.IntN(2)]}})
			}
			if r.IntN(2) == 0 {
				sets = nil
			}
			h.publish(rev, evs, sets)
		}
		start, head := h.window()
		for _, cell := range []string{"c0", "c1", "c2", "c9"} {
			for _, f := range []EventFilter{{CellID: cell}, {CellID: cell, Domain: "d1"}, {CellID: cell, Kinds: kinds},
				{CellID: cell, Selector: selector}, {CellID: cell, Kinds: broadcastKinds}, {CellID: cell, Kinds: broadcastKinds, Domain: "d1"}} {
				read := func(rev int64, max int) ([]batch, int64, <-chan struct{}, bool) {
					return h.sinceCell(cell, rev, max)
				}
				if maps.Equal(f.Kinds, broadcastKinds) {
					if !f.broadcastOnly() {
						t.Fatalf("filter %+v is not broadcast-only", f)
					}
					read = h.sinceBroadcast
				} else if f.broadcastOnly() {
					t.Fatalf("filter %+v is broadcast-only", f)
				}
				for from := start - 1; from <= head; from++ {
					want, wok := readAll(t, h.since, f, from, head)
					got, gok := readAll(t, read, f, from, head)
					if wok != gok || !slices.Equal(want, got) {
						t.Fatalf("round %d, filter %+v from %d: cell index gave %v (ok %v), the ring %v (ok %v)", round, f, from, got, gok, want, wok)
					}
				}
			}
		}
		unfollow()
	}
}

// TestCellIndexedKindsAreCellsOfs: cellIndexedKinds, which decides whether a cell's subscriber
// may read only broadcast revisions, names exactly the kinds cellsOf indexes by cell, over
// random events of every kind.
func TestCellIndexedKindsAreCellsOfs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	indexed := map[protoreflect.FieldNumber]bool{}
	for i := 0; i < 5000; i++ {
		e := randomEvent(r)
		kind := e.ProtoReflect().WhichOneof(eventKinds).Number()
		if cells, _ := cellsOf([]*bbsv1.Event{e}); len(cells) > 0 {
			indexed[kind] = true
		}
	}
	if !maps.Equal(indexed, cellIndexedKinds) {
		t.Fatalf("cellsOf indexed the kinds %v; cellIndexedKinds names %v", indexed, cellIndexedKinds)
	}
}

// TestCellIndexWakesOnlyItsCell: a cell's subscriber is woken by its own cell's events and by
// broadcast ones, not by other cells'.
func TestCellIndexWakesOnlyItsCell(t *testing.T) {
	h := newHub(100)
	h.reset(1)
	defer h.follow("c1")()
	wait := func() <-chan struct{} {
		_, _, n, _ := h.sinceCell("c1", 1, 100)
		return n
	}
	isClosed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	presence := func(id string) *bbsv1.Event {
		return &bbsv1.Event{Kind: &bbsv1.Event_CellAppeared{CellAppeared: &bbsv1.CellAppeared{Cell: &modelsv1.CellPresence{CellId: id}}}}
	}
	n := wait()
	h.publish(2, []*bbsv1.Event{presence("c2")}, nil)
	if isClosed(n) {
		t.Fatal("another cell's event woke the subscriber")
	}
	h.publish(3, []*bbsv1.Event{presence("c1")}, nil)
	if !isClosed(n) {
		t.Fatal("its own cell's event did not wake the subscriber")
	}
	n = wait()
	h.publish(4, []*bbsv1.Event{{Kind: &bbsv1.Event_LinksChanged{LinksChanged: &bbsv1.LinksChanged{ProcessGuid: "p"}}}}, nil)
	if !isClosed(n) {
		t.Fatal("a broadcast event did not wake the subscriber")
	}

	// A subscriber of broadcast revisions only is woken by those, not by any cell's events.
	_, _, b, _ := h.sinceBroadcast(4, 100)
	h.publish(5, []*bbsv1.Event{presence("c1")}, nil)
	if isClosed(b) {
		t.Fatal("a cell's event woke a subscriber of broadcast revisions")
	}
	h.publish(6, []*bbsv1.Event{{Kind: &bbsv1.Event_LinksChanged{LinksChanged: &bbsv1.LinksChanged{ProcessGuid: "p"}}}}, nil)
	if !isClosed(b) {
		t.Fatal("a broadcast event did not wake a subscriber of broadcast revisions")
	}
	if bs, upTo, _, _ := h.sinceBroadcast(4, 100); len(bs) != 1 || bs[0].rev != 6 || upTo != 6 {
		t.Fatalf("broadcast revisions after 4: %d batches up to %d, want revision 6 alone", len(bs), upTo)
	}
}

// ringStore is a Store of an event ring alone (no etcd), synced: its subscribers read what the
// benchmark publishes to the ring.
func ringStore() *Store {
	s := &Store{hub: newHub(100_000)}
	s.hub.reset(1)
	ready := make(chan struct{})
	close(ready)
	s.synced = ready
	return s
}

// instanceChangedOn is an instance's change on cell id.
func instanceChangedOn(id string) *bbsv1.Event {
	return &bbsv1.Event{Kind: &bbsv1.Event_ActualLrpChanged{ActualLrpChanged: &bbsv1.ActualLRPChanged{
		After: &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: "p"}, InstanceKey: &modelsv1.ActualLRPInstanceKey{CellId: id}}}}}
}

// BenchmarkFanOut publishes revisions each concerning one of 1,000 cells while 1,000
// cell-filtered subscribers (one per cell, as reps subscribe) and one unfiltered subscriber
// (the route-emitter) follow them, and reports the cost per published revision.
func BenchmarkFanOut(b *testing.B) {
	const cells = 1000
	s := ringStore()
	ctx := b.Context()
	got := make(chan struct{}, cells+1)
	for i := 0; i <= cells; i++ {
		f := EventFilter{}
		if i < cells {
			f.CellID = fmt.Sprintf("cell-%04d", i)
		}
		go func() {
			_ = s.Subscribe(ctx, 1, f, 1<<40, func(*bbsv1.SubscribeToEventsResponse) error {
				got <- struct{}{}
				return nil
			})
		}()
	}
	rev := int64(1) // every subscriber reads from here on, whenever it starts
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rev++
		id := fmt.Sprintf("cell-%04d", i%cells)
		s.hub.publish(rev, []*bbsv1.Event{instanceChangedOn(id)}, nil)
		<-got // the unfiltered subscriber
		<-got // the cell's
	}
}

// BenchmarkRepSubscriptions publishes revisions each changing an instance on one of 1,000
// cells while subscribers follow them as reps do (their cell, kinds links_changed and
// desired_lrp_changed, so none of these events is theirs) beside one unfiltered subscriber
// (the route-emitter), and reports the process's CPU time per published revision, with no
// reps and with 1,000: the difference is what waking and filtering the reps' subscriptions
// costs the BBS.
func BenchmarkRepSubscriptions(b *testing.B) {
	kinds, err := EventKinds([]string{"links_changed", "desired_lrp_changed"})
	if err != nil {
		b.Fatal(err)
	}
	for _, reps := range []int{0, 1000} {
		b.Run(fmt.Sprintf("reps=%d", reps), func(b *testing.B) {
			s := ringStore()
			ctx, cancel := context.WithCancel(b.Context()) // ends this run's subscribers, not only the last run's
			defer cancel()
			got := make(chan struct{}, 1)
			for i := 0; i < reps; i++ {
				f := EventFilter{CellID: fmt.Sprintf("cell-%04d", i), Kinds: kinds}
				go func() {
					_ = s.Subscribe(ctx, 1, f, 1<<40, func(*bbsv1.SubscribeToEventsResponse) error {
						b.Error("a rep's subscription was sent an instance event")
						return nil
					})
				}()
			}
			go func() {
				_ = s.Subscribe(ctx, 1, EventFilter{}, 1<<40, func(*bbsv1.SubscribeToEventsResponse) error {
					got <- struct{}{}
					return nil
				})
			}()
			rev := int64(1)
			cpu := testkit.SelfCPU(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rev++
				id := fmt.Sprintf("cell-%04d", i%1000)
				s.hub.publish(rev, []*bbsv1.Event{instanceChangedOn(id)}, nil)
				<-got
			}
			time.Sleep(10 * time.Millisecond) // the last wake-ups run
			b.ReportMetric(float64(testkit.SelfCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// TestRingBoundedByEvents: the ring is bounded by events, not revisions. Revisions of 50 events
// each (as the group committer writes them) are trimmed once the ring holds twice the limit, to
// at most the limit; revisions of one event are kept up to twice the limit; a revision larger
// than the limit is kept whole, alone.
func TestRingBoundedByEvents(t *testing.T) {
	events := func(n int) []*bbsv1.Event {
		out := make([]*bbsv1.Event, n)
		for i := range out {
			out[i] = &bbsv1.Event{Kind: &bbsv1.Event_CellAppeared{CellAppeared: &bbsv1.CellAppeared{Cell: &modelsv1.CellPresence{CellId: "c1"}}}}
		}
		return out
	}
	held := func(h *hub) (n int) {
		for _, b := range h.batches {
			n += len(b.events)
		}
		return n
	}

	h := newHub(1000)
	h.reset(0)
	for rev := int64(1); rev <= 100; rev++ {
		h.publish(rev, events(50), nil)
		if n := held(h); n > 2000 || n != h.events {
			t.Fatalf("after revision %d the ring holds %d events (counted %d), want at most 2,000", rev, n, h.events)
		}
	}
	start, head := h.window()
	if n := held(h); head != 100 || n > 2000 || int(head-start)*50 != n {
		t.Fatalf("window %d..%d holding %d events, want the newest revisions up to 100, at most 2,000 events", start, head, n)
	}
	if _, _, _, ok := h.since(start-1, 10); ok {
		t.Fatalf("a resume from %d, before the ring, was served from it", start-1)
	}
	if bs, _, _, ok := h.since(start, 1000); !ok || len(bs) != int(head-start) {
		t.Fatalf("a resume from the ring's start got %d batches (ok %v), want %d", len(bs), ok, head-start)
	}

	h = newHub(1000)
	h.reset(0)
	for rev := int64(1); rev <= 2000; rev++ {
		h.publish(rev, events(1), nil)
	}
	if start, _ := h.window(); start != 0 {
		t.Fatalf("2,000 one-event revisions under a limit of 1,000 trimmed the ring to start at %d, want all kept", start)
	}
	h.publish(2001, events(5000), nil)
	if start, head := h.window(); start != 2000 || head != 2001 || h.events != 5000 {
		t.Fatalf("a 5,000-event revision left the ring at %d..%d with %d events, want it alone (2000..2001)", start, head, h.events)
	}
}

// BenchmarkCellSubscribersRead: 1,000 cells' subscribers each read and filter what concerns
// them of 100 revisions of 64 instance events (the store's group commit), each event on a
// random cell: the work a BBS does per event for the reps' subscriptions.
func BenchmarkCellSubscribersRead(b *testing.B) {
	const cells, revs, perRev = 1000, 100, 64
	r := rand.New(rand.NewPCG(1, 2))
	h := newHub(revs * perRev)
	h.reset(0)
	ids := make([]string, cells)
	for i := range ids {
		ids[i] = fmt.Sprintf("cell-%04d", i)
		defer h.follow(ids[i])()
	}
	for rev := int64(1); rev <= revs; rev++ {
		evs := make([]*bbsv1.Event, perRev)
		for i := range evs {
			lrp := &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: "p", Domain: "d"},
				InstanceKey: &modelsv1.ActualLRPInstanceKey{CellId: ids[r.IntN(cells)]}}
			evs[i] = &bbsv1.Event{Kind: &bbsv1.Event_ActualLrpChanged{ActualLrpChanged: &bbsv1.ActualLRPChanged{Before: lrp, After: lrp}}}
		}
		h.publish(rev, evs, nil)
	}
	kinds, err := EventKinds([]string{"actual_lrp_changed"})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		got := 0
		for _, id := range ids {
			f := EventFilter{CellID: id, Kinds: kinds}
			bs, _, _, _ := h.sinceCell(id, 0, revs)
			for _, bt := range bs {
				got += len(f.filterEvents(bt))
			}
		}
		if got != revs*perRev {
			b.Fatalf("read %d events, want %d", got, revs*perRev)
		}
	}
}
