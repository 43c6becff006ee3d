package router

import (
	"errors"
	"testing"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

// applyAll builds a table from base and msgs.
func applyAll(t *testing.T, base *table, msgs ...*routeemitterv1.WatchRoutesResponse) (*table, error) {
	t.Helper()
	b := newBuilder(base)
	for _, m := range msgs {
		if err := b.apply(m); err != nil {
			return b.result(), err
		}
	}
	return b.result(), nil
}

func TestTableSnapshotAndDeltas(t *testing.T) {
	snap := &routeemitterv1.WatchRoutesResponse{TableId: "t", Version: 3, Snapshot: true, Upserts: []*routeemitterv1.Route{
		httpRoute("Foo.Example.com.", false, "10.0.0.1:61000", "10.0.0.2:61001"),
		httpRoute("", false, "10.0.0.1:61000"), // malformed: skipped
		portRoute(tcpProto, 5000, "10.0.0.1:61002"),
		portRoute(udpProto, 5000, "10.0.0.1:61003"),
		portRoute(tcpProto, 70000, "10.0.0.1:61002"), // out of range: skipped
		{Protocol: routeemitterv1.Route_PROTOCOL_HTTP, Hostname: "bad-ep.example.com",
			Endpoints: []*routeemitterv1.Endpoint{{Address: "", Port: 1}, {Address: "10.0.0.9", Port: 0}, {Address: "::1", Port: 80}}},
	}}
	t1, err := applyAll(t, nil, snap)
	if err != nil {
		t.Fatal(err)
	}
	if t1.http.len() != 2 || len(t1.tcp) != 1 || len(t1.udp) != 1 {
		t.Fatalf("snapshot table: %d http, %d tcp, %d udp", t1.http.len(), len(t1.tcp), len(t1.udp))
	}
	foo := t1.http.get("foo.example.com")
	if foo == nil || len(foo.endpoints) != 2 || foo.endpoints[1].addr != "10.0.0.2:61001" || foo.endpoints[1].index != 1 {
		t.Fatalf("foo route: %+v", foo)
	}
	if eps := t1.http.get("bad-ep.example.com").endpoints; len(eps) != 1 || eps[0].addr != "[::1]:80" {
		t.Fatalf("endpoints without address or port must be dropped: %+v", eps)
	}
	foo.pick()
	foo.pick()
	foo.pick()

	// A delta copies only what it changes and keeps the round-robin position.
	delta := &routeemitterv1.WatchRoutesResponse{TableId: "t", Version: 4,
		Upserts:  []*routeemitterv1.Route{httpRoute("foo.example.com", true, "10.0.0.3:61000")},
		Removals: []*routeemitterv1.Route{{Protocol: udpProto, IncomingPort: 5000}}}
	t2, err := applyAll(t, t1, delta)
	if err != nil {
		t.Fatal(err)
	}
	if t2.version != 4 || !t2.http.get("foo.example.com").tlsOnly || len(t2.udp) != 0 || len(t2.tcp) != 1 {
		t.Fatalf("after delta: %+v", t2)
	}
	if got := t2.http.get("foo.example.com").next.Load(); got != 3 {
		t.Fatalf("round-robin counter %d, want 3 carried over", got)
	}
	if t1.version != 3 || t1.http.get("foo.example.com") != foo || len(t1.udp) != 1 {
		t.Fatal("delta modified the published table")
	}
	if t2.tcp[5000] != t1.tcp[5000] {
		t.Fatal("unchanged TCP map was copied")
	}

	// Duplicates are ignored; deltas of another table or before a snapshot ask for a resync.
	t3, err := applyAll(t, t2, &routeemitterv1.WatchRoutesResponse{TableId: "t", Version: 4,
		Removals: []*routeemitterv1.Route{{Protocol: routeemitterv1.Route_PROTOCOL_HTTP, Hostname: "foo.example.com"}}})
	if err != nil || t3.http.get("foo.example.com") == nil {
		t.Fatalf("duplicate delta applied: %v", err)
	}
	if _, err := applyAll(t, t2, &routeemitterv1.WatchRoutesResponse{TableId: "u", Version: 5}); !errors.Is(err, errResync) {
		t.Fatalf("foreign delta: %v", err)
	}
	if _, err := applyAll(t, nil, &routeemitterv1.WatchRoutesResponse{TableId: "t", Version: 5}); !errors.Is(err, errResync) {
		t.Fatalf("delta before snapshot: %v", err)
	}

	// A new snapshot replaces everything.
	t4, err := applyAll(t, t2, &routeemitterv1.WatchRoutesResponse{TableId: "v", Version: 1, Snapshot: true})
	if err != nil || t4.id != "v" || t4.http.len()+len(t4.tcp)+len(t4.udp) != 0 {
		t.Fatalf("empty snapshot: %+v %v", t4, err)
	}
}

func TestRequestHost(t *testing.T) {
	tests := map[string]string{
		"Foo.Example.com":       "foo.example.com",
		"foo.example.com:8080":  "foo.example.com",
		"foo.example.com.:8080": "foo.example.com",
		"[::1]:8080":            "[::1]",
		"[::1]":                 "[::1]",
		"":                      "",
	}
	for in, want := range tests {
		if got := requestHost(in); got != want {
			t.Errorf("requestHost(%q) = %q, want %q", in, got, want)
		}
	}
}
