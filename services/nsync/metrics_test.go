package nsync_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/services/nsync"
)

// TestMetrics: the bulk loop's and the restarts' series move as nsync works, and its API's calls
// are counted and timed per RPC.
func TestMetrics(t *testing.T) {
	e := startEnv(t, func(c *nsync.Config) { c.MetricsAddress = "127.0.0.1:0" }, nil)
	ctx := ctxT(t)
	if _, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("m", "space", 1)}); err != nil {
		t.Fatal(err)
	}
	e.waitRunning(t, "m-v1", 1)
	if _, err := e.nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "m-v2"}); err != nil {
		t.Fatal(err)
	}
	scrape := func() string { return testkit.Scrape(t, e.svc.MetricsAddr()) }
	for _, want := range []string{
		`gavel_nsync_restarts_total{outcome="completed"} 1`,
		`gavel_nsync_bulk_lrps_total{action="desired"} 1`,
		`gavel_nsync_bulk_pass_duration_seconds_count`,
		`grpc_server_handling_seconds_count{grpc_method="DesireApp",grpc_service="gavel.nsync.v1.NsyncService",grpc_type="unary"} 1`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="RestartApp",grpc_service="gavel.nsync.v1.NsyncService",grpc_type="unary"} 1`,
	} {
		waitFor(t, 10*time.Second, want, func() (bool, string) {
			s := scrape()
			return strings.Contains(s, want), "not in the scrape"
		})
	}
	s := scrape()
	if !strings.Contains(s, `gavel_nsync_bulk_passes_total{result="complete"}`) {
		t.Errorf("no complete passes in:\n%s", s)
	}
	t.Run("promtool", func(t *testing.T) { testkit.Promtool(t, s) })
}
