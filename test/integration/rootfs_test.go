package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep"
)

// TestRootfsSpellings desires LRPs and tasks whose rootfs is an unusual spelling of
// "preloaded:x": the BBS stores the canonical form, the auctioneer places them on the one cell
// that has x, and that cell's process backend (real processes) runs them.
func TestRootfsSpellings(t *testing.T) {
	cfg := rep.Default()
	cfg.CellID, cfg.Zone = "cell-x", "z1"
	cfg.Backend = rep.BackendProcess
	cfg.WorkDir = t.TempDir()
	cfg.PreloadedRootfses = map[string]string{"x": t.TempDir()}
	cfg.Capacity = rep.Capacity{MemoryMB: 4096, DiskMB: 4096, Containers: 20}
	c := startCluster(t, []devcluster.Cell{{Config: cfg}})
	ctx := context.Background()
	sleep := &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/sh", Args: []string{"-c", "exec sleep 600"}}}}
	for i, spelling := range []string{"PRELOADED:x", "preloaded:///x/", "Preloaded://x"} {
		t.Run(spelling, func(t *testing.T) {
			guid := fmt.Sprintf("spelled-%d", i)
			d := desiredLRP(guid, spelling, 1, nil)
			d.Ports = nil
			d.Action = sleep
			if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
				t.Fatal(err)
			}
			got, err := c.BBS.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: guid})
			if err != nil {
				t.Fatal(err)
			}
			if got.GetDesiredLrp().GetRootfs() != "preloaded:x" {
				t.Fatalf("stored rootfs %q, want the canonical %q", got.GetDesiredLrp().GetRootfs(), "preloaded:x")
			}
			testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
				as := actualLRPs(t, c, guid)
				return len(as) == 1 && as[0].GetState() == modelsv1.ActualLRP_STATE_RUNNING && as[0].GetInstanceKey().GetCellId() == "cell-x",
					fmt.Sprintf("%v", as)
			}, "the instance RUNNING on cell-x")

			task := fmt.Sprintf("spelled-task-%d", i)
			def := &modelsv1.TaskDefinition{Rootfs: spelling, MemoryMb: 16, DiskMb: 16,
				Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/true"}}}}
			if _, err := c.BBS.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: task, Domain: "it", Definition: def}); err != nil {
				t.Fatal(err)
			}
			testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
				resp, err := c.BBS.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: task})
				if err != nil {
					return false, err.Error()
				}
				tk := resp.GetTask()
				if tk.GetDefinition().GetRootfs() != "preloaded:x" {
					t.Fatalf("stored task rootfs %q, want the canonical %q", tk.GetDefinition().GetRootfs(), "preloaded:x")
				}
				return tk.GetState() == modelsv1.Task_STATE_COMPLETED && !tk.GetFailed(), fmt.Sprintf("%v", tk)
			}, "the task COMPLETED without failure")
		})
	}
}
