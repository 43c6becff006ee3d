package rep_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
)

// scrape fetches the rep's /metrics.
func scrape(t *testing.T, r *repEnv) string {
	t.Helper()
	return testkit.Scrape(t, r.svc.MetricsAddr())
}

// TestMetrics scrapes /metrics after an LRP ran, one was stopped, one failed its on_create
// hook (a crash), one could not be claimed, a task completed and the bulk loop removed an
// orphaned record.
func TestMetrics(t *testing.T) {
	env := bbstest.Start(t)
	hook := writeHook(t, `grep -q doomed && exit 3; exit 0`)
	r := startRep(t, env, func(c *rep.Config) {
		c.MetricsAddress = "127.0.0.1:0"
		c.Hooks.OnCreate = []string{hook}
		c.BulkInterval = rep.Duration(100 * time.Millisecond)
	})
	web, api, doomed := desiredLRP("web", 2), desiredLRP("api", 1), desiredLRP("doomed", 1)
	for _, d := range []*modelsv1.DesiredLRP{web, api, doomed} {
		desire(t, env, d)
	}
	work := desireTask(t, env, "migrate")
	perform(t, r, []*repv1.LRPInstance{lrpWork(web, 0), lrpWork(api, 0), lrpWork(doomed, 0), lrpWork(desiredLRP("nobody", 1), 0)},
		[]*repv1.TaskWork{work})
	waitRunning(t, env, r, "web", 0)
	a := waitRunning(t, env, r, "api", 0)
	if _, err := r.client.StopLRPInstance(ctxT(t), &repv1.StopLRPInstanceRequest{Key: a.GetKey(), InstanceKey: a.GetInstanceKey()}); err != nil {
		t.Fatalf("StopLRPInstance: %v", err)
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		a := actual(t, env, "doomed", 0, ordinary)
		return a.GetCrashCount() == 1, fmt.Sprint(a)
	}, "doomed crashed")
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		tk := task(t, env, "migrate")
		return tk.GetState() == modelsv1.Task_STATE_COMPLETED, fmt.Sprint(tk)
	}, "task completed")
	ghost := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ghost", CellId: r.cfg.CellID}
	if _, err := env.Client.ClaimActualLRP(ctxT(t), &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 1, InstanceKey: ghost}); err != nil {
		t.Fatalf("claim: %v", err)
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		a := actual(t, env, "web", 1, ordinary)
		return a == nil, fmt.Sprint(a)
	}, "orphaned record removed")

	want := []string{
		`gavel_rep_containers{state="running"} 1`,
		`gavel_rep_containers{state="reserved"} 0`,
		`gavel_rep_containers{state="starting"} 0`,
		`gavel_rep_containers{state="completing"} 0`,
		`gavel_rep_capacity_memory_bytes{kind="total"} 1.073741824e+09`,
		`gavel_rep_capacity_memory_bytes{kind="available"} 9.39524096e+08`,
		`gavel_rep_capacity_disk_bytes{kind="total"} 4.294967296e+09`,
		`gavel_rep_capacity_disk_bytes{kind="available"} 4.02653184e+09`,
		`gavel_rep_capacity_containers{kind="total"} 10`,
		`gavel_rep_capacity_containers{kind="available"} 9`,
		`gavel_rep_container_starts_total{kind="lrp"} 2`,
		`gavel_rep_container_starts_total{kind="task"} 1`,
		`gavel_rep_container_stops_total{kind="lrp"} 1`,
		`gavel_rep_container_crashes_total 1`,
		`gavel_rep_hook_failures_total{event="on_create"} 1`,
		// Per-RPC metrics of grpcx's interceptors: the rep's claims (alone or in a batch,
		// ClaimActualLRPs), its server's calls.
		`grpc_client_handled_total{grpc_code="OK",grpc_method="ClaimActualLRP`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Perform",grpc_service="gavel.rep.v1.RepService",grpc_type="unary"} 1`,
		`grpc_server_handling_seconds_bucket{grpc_method="Perform",grpc_service="gavel.rep.v1.RepService",grpc_type="unary",le="+Inf"} 1`,
		`gavel_rep_bulk_reconcile_fixes_total{fix="remove_record"} 1`,
		`gavel_rep_bulk_reconcile_duration_seconds_count`,
		`gavel_rep_evacuating 0`,
		`go_goroutines`,
	}
	var body string
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		body = scrape(t, r)
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false, "missing " + w + " in:\n" + body
			}
		}
		return true, ""
	}, "the metrics")
	t.Run("promtool", func(t *testing.T) { testkit.Promtool(t, body) })
}
