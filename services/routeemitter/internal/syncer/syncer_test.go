package syncer

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/routing/cfrouter"
	"github.com/gavel-sched/gavel/services/routeemitter/internal/table"
)

// fakeBBS answers lists from scripted responses and serves each subscription from a script of
// stream messages (then an error, or blocking until the call ends).
type fakeBBS struct {
	desired []*bbsv1.DesiredLRPSchedulingInfosResponse // one per list call; the last repeats
	actual  []*bbsv1.ActualLRPsResponse
	streams chan fakeStream
	since   chan int64 // since_revision of each subscription
	dCalls  int
	aCalls  int
	// gate, when set, holds every desired listing after the first until the test sends on it;
	// listing is told first.
	gate, listing chan struct{}
}

type fakeStream struct {
	msgs []*bbsv1.SubscribeToEventsResponse
	err  error // returned after msgs; nil blocks until the call's context ends
	// live, when set, delivers further messages after msgs as the test sends them.
	live chan *bbsv1.SubscribeToEventsResponse
}

func (f *fakeBBS) DesiredLRPSchedulingInfos(ctx context.Context, _ *bbsv1.DesiredLRPSchedulingInfosRequest, _ ...grpc.CallOption) (*bbsv1.DesiredLRPSchedulingInfosResponse, error) {
	if f.gate != nil && f.dCalls > 0 {
		f.listing <- struct{}{}
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	r := f.desired[min(f.dCalls, len(f.desired)-1)]
	f.dCalls++
	return r, nil
}

func (f *fakeBBS) ActualLRPs(context.Context, *bbsv1.ActualLRPsRequest, ...grpc.CallOption) (*bbsv1.ActualLRPsResponse, error) {
	r := f.actual[min(f.aCalls, len(f.actual)-1)]
	f.aCalls++
	return r, nil
}

func (f *fakeBBS) SubscribeToEvents(ctx context.Context, in *bbsv1.SubscribeToEventsRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[bbsv1.SubscribeToEventsResponse], error) {
	f.since <- in.GetSinceRevision()
	select {
	case s := <-f.streams:
		return &fakeClientStream{ctx: ctx, s: s}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

type fakeClientStream struct {
	grpc.ClientStream
	ctx context.Context
	s   fakeStream
}

func (c *fakeClientStream) Recv() (*bbsv1.SubscribeToEventsResponse, error) {
	if len(c.s.msgs) > 0 {
		m := c.s.msgs[0]
		c.s.msgs = c.s.msgs[1:]
		return m, nil
	}
	if c.s.err != nil {
		return nil, c.s.err
	}
	select {
	case m := <-c.s.live:
		return m, nil
	case <-c.ctx.Done():
	}
	return nil, status.FromContextError(c.ctx.Err()).Err()
}

// recorder is a Publisher that hands each non-empty delta to the test.
type recorder struct {
	deltas chan table.Delta
	synced chan struct{}
}

func (r *recorder) Publish(d table.Delta) {
	if !d.Empty() {
		r.deltas <- d
	}
}

func (r *recorder) MarkSynced() {
	select {
	case <-r.synced:
	default:
		close(r.synced)
	}
}

func sched(guid, host string) *modelsv1.DesiredLRPSchedulingInfo {
	return &modelsv1.DesiredLRPSchedulingInfo{ProcessGuid: guid, Routes: map[string][]byte{cfrouter.Provider: []byte(`[{"port": 8080, "routes": ["` + host + `"]}]`)}}
}

func running(guid string, hostPort uint32) *modelsv1.ActualLRP {
	return &modelsv1.ActualLRP{
		Key:         &modelsv1.ActualLRPKey{ProcessGuid: guid},
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: guid + "-0"},
		State:       modelsv1.ActualLRP_STATE_RUNNING, Presence: modelsv1.ActualLRP_PRESENCE_ORDINARY, Routable: true,
		NetInfo: &modelsv1.ActualLRPNetInfo{Address: "127.0.0.1", Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: hostPort}}},
	}
}

func changed(rev int64, a *modelsv1.ActualLRP) *bbsv1.SubscribeToEventsResponse {
	return &bbsv1.SubscribeToEventsResponse{Revision: rev, Events: []*bbsv1.Event{{Revision: rev, Kind: &bbsv1.Event_ActualLrpChanged{ActualLrpChanged: &bbsv1.ActualLRPChanged{After: a}}}}}
}

func created(rev int64, guid, host string) *bbsv1.SubscribeToEventsResponse {
	d := sched(guid, host)
	return &bbsv1.SubscribeToEventsResponse{Revision: rev, Events: []*bbsv1.Event{{Revision: rev, Kind: &bbsv1.Event_DesiredLrpCreated{DesiredLrpCreated: &bbsv1.DesiredLRPCreated{
		DesiredLrp: &modelsv1.DesiredLRP{ProcessGuid: d.ProcessGuid, Routes: d.Routes}}}}}}
}

func hostPorts(d table.Delta) map[string]uint32 {
	out := map[string]uint32{}
	for _, r := range d.Upserts {
		out[r.GetHostname()] = r.GetEndpoints()[0].GetPort()
	}
	for _, r := range d.Removals {
		out[r.GetHostname()] = 0
	}
	return out
}

func expectDelta(t *testing.T, rec *recorder, want map[string]uint32) {
	t.Helper()
	select {
	case d := <-rec.deltas:
		got := hostPorts(d)
		if len(got) != len(want) {
			t.Fatalf("delta %v, want %v", got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("delta %v, want %v", got, want)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no delta, want %v", want)
	}
}

func expectSince(t *testing.T, f *fakeBBS, want int64) {
	t.Helper()
	select {
	case got := <-f.since:
		if got != want {
			t.Fatalf("subscribed after revision %d, want %d", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no subscription after revision %d", want)
	}
}

// runSyncer runs a syncer of tb over f, publishing to rec and listing again every interval,
// until the returned stop, which fails the test if Run failed.
func runSyncer(t *testing.T, f *fakeBBS, tb *table.Table, rec *recorder, interval time.Duration) (*Syncer, func()) {
	t.Helper()
	s, err := New(Config{BBS: f, Table: tb, Publisher: rec, Logger: logtest.New(t),
		SyncInterval: interval, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return s, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// liveStream hands the syncer a stream the test feeds, and waits until the periodic listing
// has started (and is held by f's gate).
func liveStream(f *fakeBBS) chan *bbsv1.SubscribeToEventsResponse {
	live := make(chan *bbsv1.SubscribeToEventsResponse)
	f.streams <- fakeStream{live: live}
	<-f.listing
	return live
}

// TestListsAtDifferentRevisions: the desired list is at revision 10 and the instance list at
// 12. Events are subscribed from 10; instance events up to 12 are skipped (the list has them),
// desired events after 10 are applied, and nothing is published before the stream reaches 12.
// Then a stream error resumes from the cursor, and OUT_OF_RANGE lists again and diffs.
func TestListsAtDifferentRevisions(t *testing.T) {
	f := &fakeBBS{
		desired: []*bbsv1.DesiredLRPSchedulingInfosResponse{
			{Revision: 10, SchedulingInfos: []*modelsv1.DesiredLRPSchedulingInfo{sched("a", "a.com")}},
			{Revision: 10, SchedulingInfos: []*modelsv1.DesiredLRPSchedulingInfo{sched("a", "a.com")}},
			{Revision: 10, SchedulingInfos: []*modelsv1.DesiredLRPSchedulingInfo{sched("a", "a.com")}},
			// The re-list after OUT_OF_RANGE: b is gone.
			{Revision: 30, SchedulingInfos: []*modelsv1.DesiredLRPSchedulingInfo{sched("a", "a.com")}},
		},
		actual: []*bbsv1.ActualLRPsResponse{
			{Revision: 12, ActualLrps: []*modelsv1.ActualLRP{running("a", 2222), running("b", 5555)}},
			{Revision: 12, ActualLrps: []*modelsv1.ActualLRP{running("a", 2222), running("b", 5555)}},
			{Revision: 12, ActualLrps: []*modelsv1.ActualLRP{running("a", 2222), running("b", 5555)}},
			{Revision: 30, ActualLrps: []*modelsv1.ActualLRP{running("a", 4444)}},
		},
		streams: make(chan fakeStream),
		since:   make(chan int64, 10),
	}
	rec := &recorder{deltas: make(chan table.Delta, 10), synced: make(chan struct{})}
	s, stop := runSyncer(t, f, table.New(logtest.New(t)), rec, time.Hour)
	defer stop()

	expectSince(t, f, 10)
	if f.dCalls != listAttempts || f.aCalls != listAttempts {
		t.Fatalf("listed %d/%d times, want %d attempts to meet at one revision", f.dCalls, f.aCalls, listAttempts)
	}
	select {
	case d := <-rec.deltas:
		t.Fatalf("published %v before the stream reached the instance list's revision", hostPorts(d))
	case <-rec.synced:
		t.Fatal("synced before the stream caught up")
	default:
	}
	f.streams <- fakeStream{msgs: []*bbsv1.SubscribeToEventsResponse{
		changed(11, running("a", 1111)), // older than the instance list: skipped
		created(11, "b", "b.com"),       // newer than the desired list: applied
		{Revision: 12, Bookmark: true},
		changed(13, running("a", 3333)),
	}, err: status.Error(codes.Unavailable, "connection reset")}
	expectDelta(t, rec, map[string]uint32{"a.com": 2222, "b.com": 5555})
	<-rec.synced
	expectDelta(t, rec, map[string]uint32{"a.com": 3333})

	// The broken stream resumes from the last revision, without listing.
	expectSince(t, f, 13)
	if f.dCalls != listAttempts {
		t.Fatalf("a stream error re-listed (%d desired lists)", f.dCalls)
	}
	f.streams <- fakeStream{err: status.Error(codes.OutOfRange, "revision 13 has been compacted")}

	// OUT_OF_RANGE: list again (both at 30) and publish only the difference.
	expectSince(t, f, 30)
	expectDelta(t, rec, map[string]uint32{"a.com": 4444, "b.com": 0})
	if st := s.Stats(); st.Lists != 2 || st.OutOfRange != 1 || st.Revision != 30 {
		t.Fatalf("stats %+v", st)
	}
}

// TestPeriodicListingBesideTheStream: a periodic listing runs while the event stream stays open.
// A route change arriving during the (held) listing is published at once; the listing, older
// than that change, repairs what the stream missed (b) without rolling the change back; the
// stream is never closed. A later listing older than the stream's position (a lagging replica)
// falls back to listing with the stream closed.
func TestPeriodicListingBesideTheStream(t *testing.T) {
	list := func(rev int64, a uint32, withB bool) (*bbsv1.DesiredLRPSchedulingInfosResponse, *bbsv1.ActualLRPsResponse) {
		d := &bbsv1.DesiredLRPSchedulingInfosResponse{Revision: rev, SchedulingInfos: []*modelsv1.DesiredLRPSchedulingInfo{sched("a", "a.com")}}
		l := &bbsv1.ActualLRPsResponse{Revision: rev, ActualLrps: []*modelsv1.ActualLRP{running("a", a)}}
		if withB {
			d.SchedulingInfos = append(d.SchedulingInfos, sched("b", "b.com"))
			l.ActualLrps = append(l.ActualLrps, running("b", 5555))
		}
		return d, l
	}
	d1, a1 := list(10, 1111, false)
	d2, a2 := list(10, 1111, true) // b: missed by the stream, repaired by the listing
	d3, a3 := list(5, 1111, true)  // a lagging replica's listing
	d4, a4 := list(20, 2222, true) // the listing with the stream closed
	f := &fakeBBS{
		desired: []*bbsv1.DesiredLRPSchedulingInfosResponse{d1, d2, d3, d4},
		actual:  []*bbsv1.ActualLRPsResponse{a1, a2, a3, a4},
		streams: make(chan fakeStream), since: make(chan int64, 10),
		gate: make(chan struct{}), listing: make(chan struct{}),
	}
	rec := &recorder{deltas: make(chan table.Delta, 10), synced: make(chan struct{})}
	s, stop := runSyncer(t, f, table.New(logtest.New(t)), rec, 20*time.Millisecond)
	defer stop()

	expectSince(t, f, 10)
	expectDelta(t, rec, map[string]uint32{"a.com": 1111})
	live := liveStream(f) // the periodic listing started, and is held
	select {
	case live <- changed(11, running("a", 2222)):
	case <-time.After(5 * time.Second):
		t.Fatal("nobody reads the stream while the periodic listing runs")
	}
	expectDelta(t, rec, map[string]uint32{"a.com": 2222})
	f.gate <- struct{}{}
	expectDelta(t, rec, map[string]uint32{"b.com": 5555})
	if st := s.Stats(); st.Lists != 2 || st.Subscriptions != 1 || st.Revision != 11 {
		t.Fatalf("after the overlapping listing: stats %+v, want 2 lists over 1 subscription at revision 11", st)
	}

	<-f.listing // the next periodic listing: its revision (5) is older than the stream's (11)
	f.gate <- struct{}{}
	<-f.listing // so it lists again, with the stream closed
	f.gate <- struct{}{}
	expectSince(t, f, 20)
	if st := s.Stats(); st.Lists != 3 || st.Subscriptions != 2 {
		t.Fatalf("after the lagging listing: stats %+v, want 3 lists and a second subscription", st)
	}
}

// TestPeriodicListingSwappedInParts: a periodic listing no newer than the stream is swapped
// into the table a process at a time (swapChunk 1 here), each part published on its own, and
// events arriving before or during the swap stay applied on top of the older listing: c's
// change at 11 (during the listing) survives the listing of 10, and d's change at 12 (sent
// while the listing is swapped in) wins over the listing's d, whichever comes first.
func TestPeriodicListingSwappedInParts(t *testing.T) {
	defer func(n int) { swapChunk = n }(swapChunk)
	swapChunk = 1
	infos := func(guids ...string) []*modelsv1.DesiredLRPSchedulingInfo {
		var out []*modelsv1.DesiredLRPSchedulingInfo
		for _, g := range guids {
			out = append(out, sched(g, g+".com"))
		}
		return out
	}
	first := &bbsv1.ActualLRPsResponse{Revision: 10, ActualLrps: []*modelsv1.ActualLRP{running("a", 1111), running("b", 2222), running("c", 3333)}}
	// The periodic listing, also at 10: d and e were missed by the stream.
	second := &bbsv1.ActualLRPsResponse{Revision: 10, ActualLrps: []*modelsv1.ActualLRP{running("a", 1111), running("b", 2222), running("c", 3333), running("d", 5555), running("e", 6666)}}
	f := &fakeBBS{
		desired: []*bbsv1.DesiredLRPSchedulingInfosResponse{{Revision: 10, SchedulingInfos: infos("a", "b", "c")}, {Revision: 10, SchedulingInfos: infos("a", "b", "c", "d", "e")}},
		actual:  []*bbsv1.ActualLRPsResponse{first, second},
		streams: make(chan fakeStream), since: make(chan int64, 10),
		gate: make(chan struct{}), listing: make(chan struct{}, 1),
	}
	rec := &recorder{deltas: make(chan table.Delta, 100), synced: make(chan struct{})}
	tb := table.New(logtest.New(t))
	s, stop := runSyncer(t, f, tb, rec, 20*time.Millisecond)

	expectSince(t, f, 10)
	expectDelta(t, rec, map[string]uint32{"a.com": 1111, "b.com": 2222, "c.com": 3333})
	live := liveStream(f)
	live <- changed(11, running("c", 3334))
	expectDelta(t, rec, map[string]uint32{"c.com": 3334})
	f.gate <- struct{}{}
	live <- changed(12, running("d", 4444))

	// Each part is its own delta; d ends at 4444 and e at 6666, and nothing else moves.
	got := map[string]uint32{}
	for got["d.com"] != 4444 || got["e.com"] != 6666 {
		select {
		case d := <-rec.deltas:
			if n := len(d.Upserts) + len(d.Removals); n != 1 {
				t.Fatalf("a delta of %d routes (%v); a part swaps one process", n, hostPorts(d))
			}
			for k, v := range hostPorts(d) {
				got[k] = v
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("routes %v; want d.com 4444 and e.com 6666", got)
		}
	}
	if _, moved := got["c.com"]; moved || len(got) != 2 {
		t.Fatalf("the swap published %v; want only d.com and e.com", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().Lists != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the listing was never wholly swapped in", s.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	want := map[string]uint32{"a.com": 1111, "b.com": 2222, "c.com": 3334, "d.com": 4444, "e.com": 6666}
	final := hostPorts(table.Delta{Upserts: tb.Routes()})
	for k, v := range want {
		if final[k] != v || len(final) != len(want) {
			t.Fatalf("table %v, want %v", final, want)
		}
	}
}

// TestPeriodicListingAheadOfTheStream: a periodic listing (at 15) newer than the stream (at 11)
// is swapped in a part at a time too, but nothing is published until the stream passes 15;
// events the listing holds (d's at 13) are skipped, newer ones (d's at 16) applied on top.
func TestPeriodicListingAheadOfTheStream(t *testing.T) {
	defer func(n int) { swapChunk = n }(swapChunk)
	swapChunk = 1
	f := &fakeBBS{
		desired: []*bbsv1.DesiredLRPSchedulingInfosResponse{
			{Revision: 10, SchedulingInfos: []*modelsv1.DesiredLRPSchedulingInfo{sched("a", "a.com"), sched("d", "d.com")}},
			{Revision: 15, SchedulingInfos: []*modelsv1.DesiredLRPSchedulingInfo{sched("a", "a.com"), sched("d", "d.com"), sched("e", "e.com")}},
		},
		actual: []*bbsv1.ActualLRPsResponse{
			{Revision: 10, ActualLrps: []*modelsv1.ActualLRP{running("a", 1111)}},
			{Revision: 15, ActualLrps: []*modelsv1.ActualLRP{running("a", 1112), running("d", 4444), running("e", 5555)}},
		},
		streams: make(chan fakeStream), since: make(chan int64, 10),
		gate: make(chan struct{}), listing: make(chan struct{}, 1),
	}
	rec := &recorder{deltas: make(chan table.Delta, 100), synced: make(chan struct{})}
	s, stop := runSyncer(t, f, table.New(logtest.New(t)), rec, 20*time.Millisecond)
	defer stop()

	expectSince(t, f, 10)
	expectDelta(t, rec, map[string]uint32{"a.com": 1111})
	live := liveStream(f)
	live <- changed(11, running("a", 1112))
	expectDelta(t, rec, map[string]uint32{"a.com": 1112})
	f.gate <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().Lists != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the listing was never wholly swapped in", s.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	live <- changed(13, running("d", 3333)) // in the listing already: skipped
	select {
	case d := <-rec.deltas:
		t.Fatalf("published %v before the stream reached the listing's revision", hostPorts(d))
	case <-time.After(20 * time.Millisecond):
	}
	live <- changed(16, running("d", 6666)) // newer: applied, and the stream has passed 15
	expectDelta(t, rec, map[string]uint32{"d.com": 6666, "e.com": 5555})
}
