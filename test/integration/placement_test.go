package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// The cells of the placement pools proposal: cells 1-4 staging, 5-8 production, skynet on
// 1, 2, 5, 6 and 9. Every cell has the preloaded rootfs cflinuxfs4; cells 7 and 8 also lucid64;
// cell 9 fetches docker images.
func proposalCells() []devcluster.Cell {
	zones := []string{"z1", "z2", "z3"}
	var cells []devcluster.Cell
	for i := 1; i <= 9; i++ {
		var tags []string
		switch {
		case i <= 4:
			tags = append(tags, "staging")
		case i <= 8:
			tags = append(tags, "Production") // tags are case-insensitive
		}
		if i == 1 || i == 2 || i == 5 || i == 6 || i == 9 {
			tags = append(tags, "skynet")
		}
		preloaded := map[string]string{"cflinuxfs4": "/var/gavel/cflinuxfs4"}
		if i == 7 || i == 8 {
			preloaded["lucid64"] = "/var/gavel/lucid64"
		}
		var providers []string
		if i == 9 {
			providers = []string{"docker"}
		}
		cells = append(cells, simCell(fmt.Sprintf("cell-%d", i), zones[i%3], tags, preloaded, providers))
	}
	return cells
}

func cellSet(ids ...int) string {
	var out []string
	for _, id := range ids {
		out = append(out, fmt.Sprintf("cell-%d", id))
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func TestPlacementPoolsProposal(t *testing.T) {
	c := startCluster(t, proposalCells())
	ctx := context.Background()

	placed := []struct {
		name       string
		rootfs     string
		constraint *modelsv1.PlacementConstraint
		cells      string
	}{
		{"empty constraint", "preloaded:cflinuxfs4", &modelsv1.PlacementConstraint{}, cellSet(1, 2, 3, 4, 5, 6, 7, 8, 9)},
		{"require staging", "preloaded:cflinuxfs4", &modelsv1.PlacementConstraint{Require: []string{"staging"}}, cellSet(1, 2, 3, 4)},
		{"disallow production", "preloaded://cflinuxfs4", &modelsv1.PlacementConstraint{Disallow: []string{"PRODUCTION"}}, cellSet(1, 2, 3, 4, 9)},
		{"require staging and skynet", "preloaded:cflinuxfs4", &modelsv1.PlacementConstraint{Require: []string{"staging", "skynet"}}, cellSet(1, 2)},
		{"require staging disallow skynet", "preloaded:cflinuxfs4", &modelsv1.PlacementConstraint{Require: []string{"staging"}, Disallow: []string{"skynet"}}, cellSet(3, 4)},
		{"preloaded lucid64", "preloaded:lucid64", nil, cellSet(7, 8)},
		{"docker provider", "docker:///library/redis#7", nil, cellSet(9)},
	}
	for i, tt := range placed {
		t.Run(tt.name, func(t *testing.T) {
			guid := fmt.Sprintf("placed-%d", i)
			want := strings.Split(tt.cells, ",")
			instances := int32(2 * len(want)) // enough for the spread to reach every eligible cell
			if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: desiredLRP(guid, tt.rootfs, instances, tt.constraint)}); err != nil {
				t.Fatal(err)
			}
			var used map[string]int
			testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
				used = map[string]int{}
				running := 0
				for _, a := range actualLRPs(t, c, guid) {
					if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
						running++
						used[a.GetInstanceKey().GetCellId()]++
					}
				}
				return running == int(instances), fmt.Sprintf("%d/%d running on %v", running, instances, used)
			}, "every instance RUNNING")
			// Zones are spread first (cell i is in zone z(i%3)), then cells within a zone.
			perZone := map[int]int{}
			var got []string
			for id, n := range used {
				got = append(got, id)
				var i int
				fmt.Sscanf(id, "cell-%d", &i)
				perZone[i%3] += n
			}
			lo, hi := int(instances), 0
			for _, n := range perZone {
				lo, hi = min(lo, n), max(hi, n)
			}
			if hi-lo > 1 {
				t.Errorf("instances per zone %v are not balanced (cells %v)", perZone, used)
			}
			sort.Strings(got)
			if strings.Join(got, ",") != tt.cells {
				t.Fatalf("placed on %v, want exactly %s", got, tt.cells)
			}
		})
	}

	failed := []struct {
		name       string
		rootfs     string
		memoryMB   int32
		constraint *modelsv1.PlacementConstraint
		code       modelsv1.PlacementError_Code
		message    []string
	}{
		{"require and disallow staging", "preloaded:cflinuxfs4", 64, &modelsv1.PlacementConstraint{Require: []string{"staging"}, Disallow: []string{"staging"}},
			modelsv1.PlacementError_CODE_CELL_MISMATCH, []string{"0/9 cells", `tag "staging"`}},
		{"require alfalfa", "preloaded:cflinuxfs4", 64, &modelsv1.PlacementConstraint{Require: []string{"alfalfa"}},
			modelsv1.PlacementError_CODE_CELL_MISMATCH, []string{"0/9 cells", `9 lack tag "alfalfa"`}},
		{"rootfs no cell has", "preloaded:windows2016", 64, nil,
			modelsv1.PlacementError_CODE_CELL_MISMATCH, []string{"0/9 cells", `rootfs "preloaded:windows2016"`}},
		{"compatible cells full", "preloaded:cflinuxfs4", 1024 * 1024, &modelsv1.PlacementConstraint{Require: []string{"staging"}},
			modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES, []string{"memory", "4 compatible cells"}},
	}
	for i, tt := range failed {
		t.Run(tt.name, func(t *testing.T) {
			guid := fmt.Sprintf("failed-%d", i)
			d := desiredLRP(guid, tt.rootfs, 2, tt.constraint)
			d.MemoryMb = tt.memoryMB
			if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
				t.Fatal(err)
			}
			testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
				as := actualLRPs(t, c, guid)
				for _, a := range as {
					if a.GetPlacementError() == nil {
						return false, fmt.Sprintf("%v", as)
					}
				}
				return len(as) == 2, fmt.Sprintf("%v", as)
			}, "placement errors on every instance")
			for _, a := range actualLRPs(t, c, guid) {
				pe := a.GetPlacementError()
				if a.GetState() != modelsv1.ActualLRP_STATE_UNCLAIMED || pe.GetCode() != tt.code {
					t.Fatalf("instance %d: %v %v, want UNCLAIMED with %v", a.GetKey().GetIndex(), a.GetState(), pe, tt.code)
				}
				for _, part := range tt.message {
					if !strings.Contains(pe.GetMessage(), part) {
						t.Errorf("message %q does not mention %q", pe.GetMessage(), part)
					}
				}
			}
		})
	}

	resp, err := c.BBS.Tags(ctx, &bbsv1.TagsRequest{})
	if err != nil || strings.Join(resp.GetTags(), ",") != "production,skynet,staging" {
		t.Fatalf("Tags: %v %v", resp.GetTags(), err)
	}
}
