package api

import (
	"strings"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

func TestValidate(t *testing.T) {
	key := &modelsv1.ActualLRPKey{ProcessGuid: "web", Index: 0, Domain: "apps"}
	ik := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "i", CellId: "c"}
	cases := []struct {
		name string
		req  any
		want []string // fields named in the error; nil means valid
	}{
		{"state", &repv1.StateRequest{}, nil},
		{"good perform", &repv1.PerformRequest{
			Lrps:  []*repv1.LRPInstance{{Key: key, Rootfs: "preloaded:x", Resources: &modelsv1.Resources{MemoryMb: 1}}},
			Tasks: []*repv1.TaskWork{{TaskGuid: "t", Rootfs: "docker:///r"}},
		}, nil},
		{"bad perform", &repv1.PerformRequest{
			Lrps:  []*repv1.LRPInstance{{Rootfs: "x", Resources: &modelsv1.Resources{MemoryMb: -1}}},
			Tasks: []*repv1.TaskWork{{TaskGuid: "bad guid", Rootfs: "preloaded:x", PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{""}}}},
		}, []string{"lrps[0].key", "lrps[0].resources.memory_mb", "lrps[0].rootfs", "tasks[0].task_guid", "tasks[0].placement_constraint.require[0]"}},
		{"good stop", &repv1.StopLRPInstanceRequest{Key: key, InstanceKey: ik}, nil},
		{"bad stop", &repv1.StopLRPInstanceRequest{Key: &modelsv1.ActualLRPKey{Index: -1}}, []string{"key.process_guid", "key.index", "instance_key"}},
		{"bad cancel", &repv1.CancelTaskRequest{}, []string{"task_guid"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.req)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %v", tc.req)
			}
			for _, f := range tc.want {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("error %q does not name %s", err, f)
				}
			}
		})
	}
}
