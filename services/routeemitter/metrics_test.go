package routeemitter_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"

	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/routeemitter"
)

// scrape fetches the route-emitter's /metrics.
func scrape(t *testing.T, e *emitter) string {
	t.Helper()
	return testkit.Scrape(t, e.svc.MetricsAddr())
}

// TestMetrics scrapes /metrics after a first sync that found one LRP, a watcher's snapshot and
// events that added another LRP with an HTTP and a TCP route.
func TestMetrics(t *testing.T) {
	env := bbstest.Start(t)
	c := env.Client
	desire(t, c, lrp("pre", 1, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["pre.com"]}]`)))
	run(t, c, "pre", 0, "p0", true, netInfo(8080, 61000))
	e := startEmitter(t, env.Addr, func(c *routeemitter.Config) { c.MetricsAddress = "127.0.0.1:0" })
	w := watch(t, e, "", 0)
	if m := w.next(t); !m.GetSnapshot() {
		t.Fatalf("first message %v is not a snapshot", m)
	}

	desire(t, c, lrp("app", 2, []uint32{8080, 9000}, cfRouter(
		`[{"port": 8080, "routes": ["app.com"]}, {"port": 9000, "protocol": "tcp", "incoming_port": 62312}]`)))
	run(t, c, "app", 0, "a0", true, netInfo(8080, 61001, 9000, 61002))
	run(t, c, "app", 1, "a1", true, netInfo(8080, 61003, 9000, 61004))

	deadline := time.Now().Add(waitTimeout)
	for {
		body := scrape(t, e)
		version := table(t, e).GetVersion()
		want := []string{
			`gavel_routeemitter_routes{protocol="http"} 2`,
			`gavel_routeemitter_routes{protocol="tcp"} 1`,
			`gavel_routeemitter_routes{protocol="udp"} 0`,
			`gavel_routeemitter_endpoints 5`, // pre.com 1, app.com 2, tcp:62312 2
			fmt.Sprintf(`gavel_routeemitter_table_version %d`, version),
			`gavel_routeemitter_watchers 1`,
			`gavel_routeemitter_snapshots_sent_total{reason="watch"} 1`,
			`gavel_routeemitter_snapshots_sent_total{reason="resync"} 0`,
			`gavel_routeemitter_events_applied_total{kind="desired_lrp_created"} 1`,
			`gavel_routeemitter_events_applied_total{kind="actual_lrp_changed"}`,
			`gavel_routeemitter_full_syncs_total 1`,
			`gavel_routeemitter_full_sync_duration_seconds_count 1`,
			`gavel_routeemitter_sync_errors_total{stage="list"} 0`,
			`gavel_routeemitter_sync_errors_total{stage="watch"} 0`,
			`go_goroutines`,
		}
		missing := ""
		for _, s := range want {
			if !strings.Contains(body, s+"\n") && !strings.Contains(body, s+" ") {
				missing = s
				break
			}
		}
		if missing == "" && version > 1 {
			t.Run("promtool", func(t *testing.T) { testkit.Promtool(t, body) })
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("missing %q (table version %d) in:\n%s", missing, version, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
