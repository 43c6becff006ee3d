package api

import (
	"context"
	"fmt"
	"testing"
	"time"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/services/routeemitter/internal/table"
)

func route(host string, port uint32) *routeemitterv1.Route {
	return &routeemitterv1.Route{Protocol: routeemitterv1.Route_PROTOCOL_HTTP, Hostname: host,
		Endpoints: []*routeemitterv1.Endpoint{{ProcessGuid: "g", Address: "127.0.0.1", Port: port}}}
}

func upsert(host string, port uint32) table.Delta {
	return table.Delta{Upserts: []*routeemitterv1.Route{route(host, port)}}
}

// versions lists the versions of msgs, marking snapshots with "s".
func versions(msgs []*routeemitterv1.WatchRoutesResponse) string {
	s := ""
	for _, m := range msgs {
		if m.GetSnapshot() {
			s += "s"
		}
		s += fmt.Sprintf("%d ", m.GetVersion())
	}
	return s
}

func TestHubResume(t *testing.T) {
	h := NewHub(HubOptions{TableID: "t1", History: 3})
	h.Publish(table.Delta{}) // empty: no version
	for i := range 5 {
		h.Publish(upsert(fmt.Sprintf("h%d.com", i), uint32(1000+i)))
	}
	if h.Version() != 5 {
		t.Fatalf("version %d, want 5", h.Version())
	}
	tests := []struct {
		name  string
		id    string
		since uint64
		want  string
	}{
		{name: "current", id: "t1", since: 5, want: ""},
		{name: "in history", id: "t1", since: 3, want: "4 5 "},
		{name: "oldest in history", id: "t1", since: 2, want: "3 4 5 "},
		{name: "older than history", id: "t1", since: 1, want: "s5 "},
		{name: "other table", id: "t0", since: 4, want: "s5 "},
		{name: "no table", id: "", since: 0, want: "s5 "},
		{name: "ahead", id: "t1", since: 9, want: "s5 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, first := h.Watch(tt.id, tt.since)
			defer w.Close()
			if got := versions(first); got != tt.want {
				t.Fatalf("first messages %q, want %q", got, tt.want)
			}
		})
	}
	routes, v := h.Table()
	if v != 5 || len(routes) != 5 || routes[0].GetHostname() != "h0.com" || routes[4].GetHostname() != "h4.com" {
		t.Fatalf("table v%d %v", v, routes)
	}
	h.Publish(table.Delta{Removals: []*routeemitterv1.Route{{Protocol: routeemitterv1.Route_PROTOCOL_HTTP, Hostname: "h0.com"}}})
	if routes, v := h.Table(); v != 6 || len(routes) != 4 || routes[0].GetHostname() != "h1.com" {
		t.Fatalf("after removal: v%d %v", v, routes)
	}
}

func TestHubHistoryRouteBound(t *testing.T) {
	h := NewHub(HubOptions{TableID: "t", History: 100, HistoryRoutes: 3})
	for i := range 5 {
		h.Publish(upsert(fmt.Sprintf("h%d.com", i), 1))
	}
	w, first := h.Watch("t", 1)
	defer w.Close()
	if got := versions(first); got != "s5 " {
		t.Fatalf("resume beyond the route bound sent %q", got)
	}
	w2, first := h.Watch("t", 2)
	defer w2.Close()
	if got := versions(first); got != "3 4 5 " {
		t.Fatalf("resume within the route bound sent %q", got)
	}
}

func TestWatcherDeltasAndOverflow(t *testing.T) {
	h := NewHub(HubOptions{TableID: "t", Queue: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w, first := h.Watch("", 0)
	defer w.Close()
	if got := versions(first); got != "s0 " {
		t.Fatalf("first %q", got)
	}
	h.Publish(upsert("a.com", 1))
	h.Publish(upsert("b.com", 1))
	msgs, err := w.Next(ctx)
	if err != nil || versions(msgs) != "1 2 " {
		t.Fatalf("Next = %q, %v", versions(msgs), err)
	}
	// Three deltas for a queue of two: the watcher gets one snapshot, then deltas again.
	for i := range 3 {
		h.Publish(upsert("c.com", uint32(i+2)))
	}
	msgs, err = w.Next(ctx)
	if err != nil || versions(msgs) != "s5 " || len(msgs[0].GetUpserts()) != 3 {
		t.Fatalf("after overflow Next = %q (%v), %v", versions(msgs), msgs, err)
	}
	if w.Resyncs() != 1 {
		t.Fatalf("resyncs %d", w.Resyncs())
	}
	h.Publish(upsert("d.com", 1))
	if msgs, err = w.Next(ctx); err != nil || versions(msgs) != "6 " {
		t.Fatalf("after resync Next = %q, %v", versions(msgs), err)
	}
	// Publishing never blocks on a watcher that does not read.
	done := make(chan struct{})
	go func() {
		for i := range 1000 {
			h.Publish(upsert("e.com", uint32(i+10)))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("Publish blocked on a slow watcher")
	}
	h.Close()
	if _, err := w.Next(ctx); err != nil {
		t.Fatalf("pending overflow after close: %v", err) // the overflow snapshot is still delivered
	}
	if _, err := w.Next(ctx); err != ErrClosed {
		t.Fatalf("Next after Close = %v, want ErrClosed", err)
	}
	w.Close()
	if h.Watchers() != 0 {
		t.Fatalf("%d watchers left", h.Watchers())
	}
}

// TestHubStats: the route and endpoint counts follow upserts, changes and removals, and
// snapshots are counted by reason.
func TestHubStats(t *testing.T) {
	h := NewHub(HubOptions{TableID: "t1", Queue: 1})
	h.Publish(upsert("a.com", 1))
	h.Publish(upsert("b.com", 2))
	two := route("a.com", 3)
	two.Endpoints = append(two.Endpoints, &routeemitterv1.Endpoint{ProcessGuid: "g", Address: "127.0.0.1", Port: 4})
	tcp := &routeemitterv1.Route{Protocol: routeemitterv1.Route_PROTOCOL_TCP, IncomingPort: 62000, Endpoints: two.Endpoints}
	h.Publish(table.Delta{Upserts: []*routeemitterv1.Route{two, tcp}, Removals: []*routeemitterv1.Route{table.KeyOf(route("b.com", 0)).Removal()}})
	w, first := h.Watch("", 0)
	defer w.Close()
	h.Publish(upsert("c.com", 5))
	h.Publish(upsert("d.com", 6)) // overflows the watcher's queue of 1
	if _, err := w.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := h.Stats()
	if len(first) != 1 || s.Routes[routeemitterv1.Route_PROTOCOL_HTTP] != 3 || s.Routes[routeemitterv1.Route_PROTOCOL_TCP] != 1 ||
		s.Endpoints != 6 || s.Version != 5 || s.Watchers != 1 || s.Snapshots != 1 || s.Resyncs != 1 {
		t.Fatalf("stats %+v", s)
	}
}
