// Package integration runs whole clusters in one process (pkg/devcluster): real embedded etcd,
// real BBS, auctioneer and reps talking gRPC on loopback, with simulated containers.
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
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/rep"
)

// simCell is a simulated cell with room for plenty of small work.
func simCell(id, zone string, tags []string, preloaded map[string]string, providers []string) devcluster.Cell {
	cfg := rep.Default()
	cfg.CellID, cfg.Zone, cfg.Tags = id, zone, tags
	cfg.PreloadedRootfses, cfg.SupportedRootfsProviders = preloaded, providers
	cfg.Backend = rep.BackendSim
	cfg.Capacity = rep.Capacity{MemoryMB: 64 * 1024, DiskMB: 64 * 1024, Containers: 200}
	cfg.Sim.StartLatency = rep.Duration(20 * time.Millisecond)
	return devcluster.Cell{Config: cfg}
}

// startCluster runs a cluster for the test and returns it once every component is ready.
func startCluster(t testing.TB, cells []devcluster.Cell) *devcluster.Cluster {
	t.Helper()
	return startClusterWith(t, devcluster.Config{Cells: cells})
}

// startClusterWith is startCluster with more of the cluster's configuration; the directory,
// addresses, fsync and logger are filled in.
func startClusterWith(t testing.TB, cfg devcluster.Config) *devcluster.Cluster {
	t.Helper()
	cells := cfg.Cells
	cfg.Dir, cfg.BBSAddress, cfg.AuctioneerAddress = t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	cfg.UnsafeNoFsync, cfg.Logger = true, logtest.New(t)
	c := devcluster.New(cfg)
	testkit.Start(t, "cluster", c)
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		resp, err := c.BBS.Cells(context.Background(), &bbsv1.CellsRequest{})
		if err != nil {
			return false, err.Error()
		}
		return len(resp.GetCells()) == len(cells), fmt.Sprintf("%d/%d cells", len(resp.GetCells()), len(cells))
	}, "every cell registered")
	return c
}

func desiredLRP(guid, rootfs string, instances int32, c *modelsv1.PlacementConstraint) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid:         guid,
		Domain:              "it",
		Rootfs:              rootfs,
		Instances:           instances,
		MemoryMb:            64,
		DiskMb:              64,
		PlacementConstraint: c,
		Ports:               []uint32{8080},
		Properties:          map[string]string{"network.app_guid": guid},
		Action:              &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
	}
}

func actualLRPs(t testing.TB, c *devcluster.Cluster, guid string) []*modelsv1.ActualLRP {
	t.Helper()
	resp, err := c.BBS.ActualLRPs(context.Background(), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}})
	if err != nil {
		t.Fatalf("ActualLRPs: %v", err)
	}
	return resp.GetActualLrps()
}
