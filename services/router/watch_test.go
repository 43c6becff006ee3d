package router

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

func TestRouteEmitterRestartResyncs(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("a.example.com", false, a.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)
	fake.upsert(httpRoute("a2.example.com", false, a.addr()))
	waitVersion(t, r, "t1", 2)

	fake.stop()
	// While the route-emitter is down the last table keeps serving.
	for i := 0; i < 3; i++ {
		if code, body := get(t, http.DefaultClient, httpBase(r), "a.example.com", "/"); code != 200 || body != "a" {
			t.Fatalf("during outage: %d %q", code, body)
		}
	}

	// It comes back on the same address with a new table (ids differ, versions restart).
	fake2 := startFake(t, fake.addr, "t2", httpRoute("b.example.com", false, b.addr()))
	waitVersion(t, r, "t2", 1)
	if code, _ := get(t, http.DefaultClient, httpBase(r), "a.example.com", "/"); code != http.StatusNotFound {
		t.Fatalf("route of the old table: %d, want 404", code)
	}
	if code, body := get(t, http.DefaultClient, httpBase(r), "b.example.com", "/"); code != 200 || body != "b" {
		t.Fatalf("route of the new table: %d %q", code, body)
	}
	reqs, snapshots := fake2.watchCalls()
	if len(reqs) == 0 || reqs[0].GetTableId() != "t1" || reqs[0].GetSinceVersion() != 2 || !snapshots[0] {
		t.Fatalf("first watch on the new route-emitter: %v (snapshot %v); want a resume attempt from t1@2 answered by a snapshot", reqs, snapshots)
	}
}

func TestWatchResumesFromVersion(t *testing.T) {
	a := newBackend(t, "a")
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("a.example.com", false, a.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)

	fake.breakStreams()
	v := fake.upsert(httpRoute("late.example.com", false, a.addr()))
	waitVersion(t, r, "t1", v)
	if code, body := get(t, http.DefaultClient, httpBase(r), "late.example.com", "/"); code != 200 || body != "a" {
		t.Fatalf("route added during the break: %d %q", code, body)
	}
	reqs, snapshots := fake.watchCalls()
	if len(reqs) < 2 {
		t.Fatalf("watch calls %v, want a reconnect", reqs)
	}
	last := reqs[len(reqs)-1]
	if last.GetTableId() != "t1" || last.GetSinceVersion() != 1 || snapshots[len(snapshots)-1] {
		t.Fatalf("reconnect asked %v and got snapshot=%v; want a resume from t1@1 with deltas only", last, snapshots[len(snapshots)-1])
	}
}

func TestWatchResyncsOnForeignDelta(t *testing.T) {
	a := newBackend(t, "a")
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("a.example.com", false, a.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)

	// A delta of another table must not be applied; the router asks for a snapshot instead.
	fake.mu.Lock()
	for s := range fake.subs {
		s.ch <- &routeemitterv1.WatchRoutesResponse{TableId: "other", Version: 9,
			Upserts: []*routeemitterv1.Route{httpRoute("bogus.example.com", false, a.addr())}}
	}
	fake.mu.Unlock()
	testkit.Eventually(t, 10*time.Second, func() bool {
		reqs, snapshots := fake.watchCalls()
		last := len(reqs) - 1
		return last > 0 && reqs[last].GetTableId() == "" && snapshots[last]
	}, "snapshot re-request")
	if code, _ := get(t, http.DefaultClient, httpBase(r), "bogus.example.com", "/"); code != http.StatusNotFound {
		t.Fatalf("foreign delta applied: %d", code)
	}
	if code, _ := get(t, http.DefaultClient, httpBase(r), "a.example.com", "/"); code != http.StatusOK {
		t.Fatalf("table after resync: %d", code)
	}
}

func TestHealthz(t *testing.T) {
	// The route-emitter is not up yet: the router serves but is not healthy.
	addr := deadAddr(t)
	r := startRouter(t, testConfig(addr))
	health := func() (int, string) {
		resp, err := http.Get("http://" + r.AdminAddr().String() + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := health(); code != http.StatusServiceUnavailable || !strings.Contains(body, "not loaded") {
		t.Fatalf("healthz before the first table: %d %q", code, body)
	}
	if code, body := get(t, http.DefaultClient, httpBase(r), "a.example.com", "/"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not loaded") {
		t.Fatalf("request before the first table: %d %q", code, body)
	}

	startFake(t, addr, "t1", httpRoute("a.example.com", false, newBackend(t, "a").addr()))
	waitSynced(t, r)
	if code, body := health(); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("healthz after the first table: %d %q", code, body)
	}

	body := testkit.Scrape(t, r.AdminAddr())
	for _, want := range []string{"gavel_router_table_version 1", `gavel_router_routes{protocol="http"} 1`, "gavel_router_http_table_not_loaded_total 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	t.Run("promtool", func(t *testing.T) { testkit.Promtool(t, body) })
}
