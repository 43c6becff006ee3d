package bbs_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// valDesire is a DesireLRP call of lrp("bad", 1) changed by edit.
func valDesire(edit func(d *modelsv1.DesiredLRP)) func(context.Context, *bbstest.Env) error {
	return func(ctx context.Context, env *bbstest.Env) error {
		d := lrp("bad", 1)
		edit(d)
		_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
		return err
	}
}

// valUpdate is an UpdateDesiredLRP call of the stored LRP "web".
func valUpdate(u *modelsv1.DesiredLRPUpdate) func(context.Context, *bbstest.Env) error {
	return func(ctx context.Context, env *bbstest.Env) error {
		_, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: u})
		return err
	}
}

// valTask is a DesireTask call of a good task changed by edit.
func valTask(edit func(r *bbsv1.DesireTaskRequest)) func(context.Context, *bbstest.Env) error {
	return func(ctx context.Context, env *bbstest.Env) error {
		r := &bbsv1.DesireTaskRequest{TaskGuid: "task-1", Domain: "apps", Definition: &modelsv1.TaskDefinition{
			Rootfs:                "docker:///library/alpine#3",
			Action:                &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/true"}}},
			CompletionCallbackUrl: "https://cc.internal/done",
		}}
		edit(r)
		_, err := env.Client.DesireTask(ctx, r)
		return err
	}
}

// valSubscribe subscribes to events and returns the stream's first error.
func valSubscribe(r *bbsv1.SubscribeToEventsRequest) func(context.Context, *bbstest.Env) error {
	return func(ctx context.Context, env *bbstest.Env) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := env.Client.SubscribeToEvents(ctx, r)
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
}

func TestValidationRejectsBadInput(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 1)}); err != nil {
		t.Fatal(err)
	}
	// The controls: the unchanged requests are accepted (checked last, as they write).
	good := []func(context.Context, *bbstest.Env) error{
		valDesire(func(*modelsv1.DesiredLRP) {}),
		valTask(func(*bbsv1.DesireTaskRequest) {}),
		// Providers other than cf-router stay opaque: any JSON is stored.
		func(ctx context.Context, env *bbstest.Env) error {
			d := lrp("opaque", 1)
			d.Routes["skydns"] = []byte(`{"port":"not checked","whatever":[1,2,3]}`)
			_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
			return err
		},
	}
	key := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-1", CellId: "cell-1"}
	negative := int32(-1)
	tooMany := env.Config.MaxInstances + 1
	otherRootfs := "preloaded:other"

	tests := []struct {
		name  string
		call  func(context.Context, *bbstest.Env) error
		field string
	}{
		{"empty process_guid", valDesire(func(d *modelsv1.DesiredLRP) { d.ProcessGuid = "" }), "desired_lrp.process_guid"},
		{"invalid process_guid", valDesire(func(d *modelsv1.DesiredLRP) { d.ProcessGuid = "web/1" }), "desired_lrp.process_guid"},
		{"negative instances", valDesire(func(d *modelsv1.DesiredLRP) { d.Instances = -1 }), "desired_lrp.instances"},
		{"too many instances", valDesire(func(d *modelsv1.DesiredLRP) { d.Instances = tooMany }), "desired_lrp.instances"},
		{"negative memory_mb", valDesire(func(d *modelsv1.DesiredLRP) { d.MemoryMb = -1 }), "desired_lrp.memory_mb"},
		{"negative disk_mb", valDesire(func(d *modelsv1.DesiredLRP) { d.DiskMb = -1 }), "desired_lrp.disk_mb"},
		{"negative max_pids", valDesire(func(d *modelsv1.DesiredLRP) { d.MaxPids = -1 }), "desired_lrp.max_pids"},
		{"rootfs without scheme", valDesire(func(d *modelsv1.DesiredLRP) { d.Rootfs = "cflinuxfs4" }), "desired_lrp.rootfs"},
		{"placement tag of 64 characters", valDesire(func(d *modelsv1.DesiredLRP) {
			d.PlacementConstraint = &modelsv1.PlacementConstraint{Require: []string{"ok", strings.Repeat("t", 64)}}
		}), "desired_lrp.placement_constraint.require[1]"},
		{"route not JSON", valDesire(func(d *modelsv1.DesiredLRP) { d.Routes["cf-router"] = []byte("{not json") }), `desired_lrp.routes["cf-router"]`},
		{"cf-router entry port out of range", valDesire(func(d *modelsv1.DesiredLRP) {
			d.Routes["cf-router"] = []byte(`[{"port":8080,"routes":["a.example.com"]},{"port":70000,"routes":["b.example.com"]}]`)
		}), `desired_lrp.routes["cf-router"][1].port`},
		{"cf-router entry not an array", valDesire(func(d *modelsv1.DesiredLRP) { d.Routes["cf-router"] = []byte(`{"port":8080}`) }), `desired_lrp.routes["cf-router"]`},
		{"cf-router tcp without incoming_port", valDesire(func(d *modelsv1.DesiredLRP) {
			d.Routes["cf-router"] = []byte(`[{"port":8080,"protocol":"tcp"}]`)
		}), `desired_lrp.routes["cf-router"][0].incoming_port`},
		{"cf-router bad hostname", valDesire(func(d *modelsv1.DesiredLRP) {
			d.Routes["cf-router"] = []byte(`[{"port":8080,"routes":["ok.example.com","bad host"]}]`)
		}), `desired_lrp.routes["cf-router"][0].routes[1]`},
		{"cf-router incoming port outside the allowed range", valDesire(func(d *modelsv1.DesiredLRP) {
			d.Routes["cf-router"] = []byte(`[{"port":8080,"routes":["a.example.com"]},{"port":9000,"protocol":"tcp","incoming_port":80}]`)
		}), `desired_lrp.routes["cf-router"][1].incoming_port`},
		{"update cf-router incoming port outside the allowed range", valUpdate(&modelsv1.DesiredLRPUpdate{Routes: &modelsv1.RoutesUpdate{Routes: map[string][]byte{
			"cf-router": []byte(`[{"port":9000,"protocol":"udp","incoming_port":443}]`),
		}}}), `update.routes.routes["cf-router"][0].incoming_port`},
		{"update cf-router wrong type", valUpdate(&modelsv1.DesiredLRPUpdate{Routes: &modelsv1.RoutesUpdate{Routes: map[string][]byte{
			"cf-router": []byte(`[{"port":"8080","routes":["web.example.com"]}]`),
		}}}), `update.routes.routes["cf-router"][0].port`},
		{"bad label key", valDesire(func(d *modelsv1.DesiredLRP) { d.Labels["-app"] = "web" }), `desired_lrp.labels["-app"]`},
		{"missing action", valDesire(func(d *modelsv1.DesiredLRP) { d.Action = nil }), "desired_lrp.action"},
		{"bad label selector", func(ctx context.Context, env *bbstest.Env) error {
			_, err := env.Client.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{Filter: &bbsv1.Filter{LabelSelector: "app in (web"}})
			return err
		}, "filter.label_selector"},
		{"bad label key in a task list selector", func(ctx context.Context, env *bbstest.Env) error {
			_, err := env.Client.Tasks(ctx, &bbsv1.TasksRequest{Filter: &bbsv1.Filter{LabelSelector: "-app=x"}})
			return err
		}, "filter.label_selector"},
		{"bad cell id in an event filter", valSubscribe(&bbsv1.SubscribeToEventsRequest{Filter: &bbsv1.Filter{CellId: "cell 1"}}), "filter.cell_id"},
		{"negative since_revision", valSubscribe(&bbsv1.SubscribeToEventsRequest{SinceRevision: -1}), "since_revision"},
		{"negative index", func(ctx context.Context, env *bbstest.Env) error {
			_, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: -1, InstanceKey: key})
			return err
		}, "index"},
		{"negative index in list", func(ctx context.Context, env *bbstest.Env) error {
			_, err := env.Client.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Index: &negative})
			return err
		}, "index"},
		{"missing instance key", func(ctx context.Context, env *bbstest.Env) error {
			_, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0})
			return err
		}, "instance_key"},
		{"missing instance key on start", func(ctx context.Context, env *bbstest.Env) error {
			_, err := env.Client.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: "web", Index: 0, NetInfo: evNetInfo()})
			return err
		}, "instance_key"},
		{"spread_with naming the LRP itself", valDesire(func(d *modelsv1.DesiredLRP) {
			d.SpreadWith = &modelsv1.SpreadWith{ProcessGuid: "bad", TotalInstances: 2}
		}), "desired_lrp.spread_with.process_guid"},
		{"spread_with without a process guid", valDesire(func(d *modelsv1.DesiredLRP) {
			d.SpreadWith = &modelsv1.SpreadWith{TotalInstances: 2}
		}), "desired_lrp.spread_with.process_guid"},
		{"spread_with with negative total_instances", valDesire(func(d *modelsv1.DesiredLRP) {
			d.SpreadWith = &modelsv1.SpreadWith{ProcessGuid: "bad-v1", TotalInstances: -1}
		}), "desired_lrp.spread_with.total_instances"},
		{"update spread_with naming the LRP itself", valUpdate(&modelsv1.DesiredLRPUpdate{SpreadWith: &modelsv1.SpreadWithUpdate{
			SpreadWith: &modelsv1.SpreadWith{ProcessGuid: "web", TotalInstances: 2},
		}}), "update.spread_with.spread_with.process_guid"},
		{"update spread_with with too many total_instances", valUpdate(&modelsv1.DesiredLRPUpdate{SpreadWith: &modelsv1.SpreadWithUpdate{
			SpreadWith: &modelsv1.SpreadWith{ProcessGuid: "web-v1", TotalInstances: tooMany},
		}}), "update.spread_with.spread_with.total_instances"},
		{"update spread_with with a bad process guid", valUpdate(&modelsv1.DesiredLRPUpdate{SpreadWith: &modelsv1.SpreadWithUpdate{
			SpreadWith: &modelsv1.SpreadWith{ProcessGuid: "web v1", TotalInstances: 2},
		}}), "update.spread_with.spread_with.process_guid"},
		{"update negative instances", valUpdate(&modelsv1.DesiredLRPUpdate{Instances: &negative}), "update.instances"},
		{"update changes rootfs", valUpdate(&modelsv1.DesiredLRPUpdate{Rootfs: &otherRootfs}), "update.rootfs"},
		{"update changes ports", valUpdate(&modelsv1.DesiredLRPUpdate{Ports: &modelsv1.PortsUpdate{Ports: []uint32{8080, 9090}}}), "update.ports"},
		{"update changes placement_constraint", valUpdate(&modelsv1.DesiredLRPUpdate{
			PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{"gpu"}},
		}), "update.placement_constraint"},
		{"bad task guid", valTask(func(r *bbsv1.DesireTaskRequest) { r.TaskGuid = "task 1" }), "task_guid"},
		{"bad callback URL", valTask(func(r *bbsv1.DesireTaskRequest) { r.Definition.CompletionCallbackUrl = "cc.internal/done" }), "definition.completion_callback_url"},
		{"negative ttl", func(ctx context.Context, env *bbstest.Env) error {
			_, err := env.Client.UpsertDomain(ctx, &bbsv1.UpsertDomainRequest{Domain: "apps", TtlSeconds: -1})
			return err
		}, "ttl_seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := storeRevision(t, env)
			err := tt.call(ctx, env)
			wantCode(t, err, codes.InvalidArgument)
			st := status.Convert(err)
			if !strings.Contains(st.Message(), tt.field) {
				t.Errorf("message %q does not name %s", st.Message(), tt.field)
			}
			var fields []string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.GetFieldViolations() {
						fields = append(fields, v.GetField())
						if v.GetDescription() == "" {
							t.Errorf("violation of %s has no description", v.GetField())
						}
					}
				}
			}
			found := false
			for _, f := range fields {
				found = found || f == tt.field
			}
			if !found {
				t.Errorf("BadRequest field violations %q do not include %s (details %v)", fields, tt.field, st.Details())
			}
			if after := storeRevision(t, env); after != before {
				t.Errorf("refused request changed the store: revision %d -> %d", before, after)
			}
		})
	}
	for i, call := range good {
		if err := call(ctx, env); err != nil {
			t.Fatalf("control %d refused: %v", i, err)
		}
	}
}
