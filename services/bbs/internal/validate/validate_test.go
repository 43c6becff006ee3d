package validate

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

func run(path string) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path}}}
}

func goodLRP() *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid:         "web-1",
		Domain:              "cf-apps",
		Rootfs:              "preloaded:cflinuxfs4",
		Instances:           2,
		MemoryMb:            128,
		PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{"staging"}},
		Labels:              map[string]string{"app": "web"},
		Routes:              map[string][]byte{"cf-router": []byte(`[{"port":8080,"routes":["a.example.com"]}]`)},
		Ports:               []uint32{8080},
		Action:              run("/app/start"),
	}
}

func goodTask() *modelsv1.TaskDefinition {
	return &modelsv1.TaskDefinition{
		Rootfs:                "docker:///library/alpine#3",
		Action:                run("/bin/true"),
		CompletionCallbackUrl: "https://cc.internal/done",
	}
}

var (
	goodKey = &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-1", CellId: "cell-1"}
	badKey  = &modelsv1.ActualLRPInstanceKey{InstanceGuid: "", CellId: "cell 1"}
	goodNet = &modelsv1.ActualLRPNetInfo{
		Address: "10.0.0.1", InstanceAddress: "10.255.0.2",
		Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 61001}},
	}
	badNet      = &modelsv1.ActualLRPNetInfo{Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 0}}}
	goodFilter  = &bbsv1.Filter{Domain: "cf-apps", ProcessGuids: []string{"a", "b-c"}, CellId: "cell.1", LabelSelector: "app=web,tier!=db,env in (a,b)"}
	badFilter   = &bbsv1.Filter{Domain: "cf apps", ProcessGuids: []string{"ok", "not/ok"}, CellId: "cell:1", LabelSelector: "app in (a"}
	badFilterAt = []string{"filter.domain", "filter.process_guids[1]", "filter.cell_id", "filter.label_selector"}
	goodPE      = &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES, Message: "insufficient resources: memory (4 compatible cells)"}
)

type requestCase struct {
	name string
	req  any
	want []string
}

func requestCases() []requestCase {
	return []requestCase{
		{"upsert domain", &bbsv1.UpsertDomainRequest{Domain: "cf-apps", TtlSeconds: 120}, nil},
		{"upsert domain forever", &bbsv1.UpsertDomainRequest{Domain: "cf-apps"}, nil},
		{"upsert domain bad", &bbsv1.UpsertDomainRequest{Domain: "", TtlSeconds: -1}, []string{"domain", "ttl_seconds"}},
		{"domains", &bbsv1.DomainsRequest{}, nil},

		{"desire lrp", &bbsv1.DesireLRPRequest{DesiredLrp: goodLRP()}, nil},
		{"desire lrp missing", &bbsv1.DesireLRPRequest{}, []string{"desired_lrp"}},
		{"desire lrp bad", &bbsv1.DesireLRPRequest{DesiredLrp: func() *modelsv1.DesiredLRP {
			d := goodLRP()
			d.ProcessGuid = "bad guid"
			d.Rootfs = "cflinuxfs4"
			d.PlacementConstraint.Require = append(d.PlacementConstraint.Require, "", "a b")
			d.Routes["cf-router"] = []byte("not json")
			d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{
				Actions: []*modelsv1.Action{run("/a"), run("")},
			}}}
			return d
		}()}, []string{
			"desired_lrp.process_guid", "desired_lrp.rootfs",
			"desired_lrp.placement_constraint.require[1]", "desired_lrp.placement_constraint.require[2]",
			`desired_lrp.routes["cf-router"]`, "desired_lrp.action.serial.actions[1].run.path",
		}},
		{"update desired lrp", &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web-1", Update: &modelsv1.DesiredLRPUpdate{
			Instances: proto.Int32(5), Labels: &modelsv1.LabelsUpdate{Labels: map[string]string{"app": "web"}},
		}}, nil},
		{"update desired lrp missing", &bbsv1.UpdateDesiredLRPRequest{}, []string{"process_guid", "update"}},
		{"update desired lrp bad", &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web-1", Update: &modelsv1.DesiredLRPUpdate{
			Instances: proto.Int32(-3),
			Routes:    &modelsv1.RoutesUpdate{Routes: map[string][]byte{"": []byte("{}")}},
		}}, []string{"update.instances", `update.routes.routes[""]`}},
		{"remove desired lrp", &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web-1"}, nil},
		{"remove desired lrp bad", &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web 1"}, []string{"process_guid"}},
		{"desired lrps", &bbsv1.DesiredLRPsRequest{Filter: goodFilter}, nil},
		{"desired lrps no filter", &bbsv1.DesiredLRPsRequest{}, nil},
		{"desired lrps bad", &bbsv1.DesiredLRPsRequest{Filter: badFilter}, badFilterAt},
		{"desired lrp by guid", &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web-1"}, nil},
		{"desired lrp by guid bad", &bbsv1.DesiredLRPByProcessGuidRequest{}, []string{"process_guid"}},
		{"scheduling infos", &bbsv1.DesiredLRPSchedulingInfosRequest{Filter: goodFilter}, nil},
		{"scheduling infos bad", &bbsv1.DesiredLRPSchedulingInfosRequest{Filter: &bbsv1.Filter{LabelSelector: "=x"}}, []string{"filter.label_selector"}},

		{"actual lrps", &bbsv1.ActualLRPsRequest{Filter: goodFilter, Index: proto.Int32(0)}, nil},
		{"actual lrps bad", &bbsv1.ActualLRPsRequest{Filter: badFilter, Index: proto.Int32(-1)}, append(slices.Clone(badFilterAt), "index")},
		{"claim", &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web-1", Index: 0, InstanceKey: goodKey}, nil},
		{"claim missing", &bbsv1.ClaimActualLRPRequest{}, []string{"process_guid", "instance_key"}},
		{"claim bad", &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web-1", Index: -1, InstanceKey: badKey},
			[]string{"index", "instance_key.instance_guid", "instance_key.cell_id"}},
		{"start", &bbsv1.StartActualLRPRequest{ProcessGuid: "web-1", Index: 1, InstanceKey: goodKey, NetInfo: goodNet, Routable: true}, nil},
		{"start missing", &bbsv1.StartActualLRPRequest{ProcessGuid: "web-1"}, []string{"instance_key", "net_info"}},
		{"start bad", &bbsv1.StartActualLRPRequest{ProcessGuid: "web-1", InstanceKey: badKey, NetInfo: badNet},
			[]string{"instance_key.instance_guid", "instance_key.cell_id", "net_info.ports[0].host_port"}},
		{"claims", &bbsv1.ClaimActualLRPsRequest{Claims: []*bbsv1.ClaimActualLRPRequest{
			{ProcessGuid: "web-1", Index: 0, InstanceKey: goodKey}, {ProcessGuid: "web-1", Index: 1, InstanceKey: goodKey}}}, nil},
		{"claims empty", &bbsv1.ClaimActualLRPsRequest{}, []string{"claims"}},
		{"claims bad", &bbsv1.ClaimActualLRPsRequest{Claims: []*bbsv1.ClaimActualLRPRequest{
			{ProcessGuid: "web-1", Index: 0, InstanceKey: goodKey}, {ProcessGuid: "web-1", Index: -1, InstanceKey: badKey}}},
			[]string{"claims[1].index", "claims[1].instance_key.instance_guid", "claims[1].instance_key.cell_id"}},
		{"claims too many", &bbsv1.ClaimActualLRPsRequest{Claims: make([]*bbsv1.ClaimActualLRPRequest, 1001)}, []string{"claims"}},
		{"starts", &bbsv1.StartActualLRPsRequest{Starts: []*bbsv1.StartActualLRPRequest{
			{ProcessGuid: "web-1", Index: 1, InstanceKey: goodKey, NetInfo: goodNet, Routable: true}}}, nil},
		{"starts bad", &bbsv1.StartActualLRPsRequest{Starts: []*bbsv1.StartActualLRPRequest{
			{ProcessGuid: "web-1", Index: 1, InstanceKey: goodKey, NetInfo: goodNet}, {ProcessGuid: "web-1"}}},
			[]string{"starts[1].instance_key", "starts[1].net_info"}},
		{"crash", &bbsv1.CrashActualLRPRequest{ProcessGuid: "web-1", InstanceKey: goodKey, ErrorMessage: "exit 1"}, nil},
		{"crash bad", &bbsv1.CrashActualLRPRequest{ProcessGuid: "web.1", Index: -2}, []string{"process_guid", "index", "instance_key"}},
		{"fail", &bbsv1.FailActualLRPRequest{ProcessGuid: "web-1", PlacementError: goodPE}, nil},
		{"fail missing", &bbsv1.FailActualLRPRequest{ProcessGuid: "web-1"}, []string{"placement_error"}},
		{"fail bad", &bbsv1.FailActualLRPRequest{ProcessGuid: "web-1", PlacementError: &modelsv1.PlacementError{}},
			[]string{"placement_error.code", "placement_error.message"}},
		{"remove actual", &bbsv1.RemoveActualLRPRequest{ProcessGuid: "web-1", Index: 2}, nil},
		{"remove actual with key", &bbsv1.RemoveActualLRPRequest{ProcessGuid: "web-1", Index: 2, InstanceKey: goodKey}, nil},
		{"remove actual bad", &bbsv1.RemoveActualLRPRequest{ProcessGuid: "web-1", Index: -1, InstanceKey: badKey},
			[]string{"index", "instance_key.instance_guid", "instance_key.cell_id"}},
		{"retire", &bbsv1.RetireActualLRPRequest{ProcessGuid: "web-1", Index: 3}, nil},
		{"retire bad", &bbsv1.RetireActualLRPRequest{Index: -1}, []string{"process_guid", "index"}},
		{"report routes", &bbsv1.ReportRoutesPublishedRequest{EmitterId: "0f3a9c-emitter_1.x", Revision: 42}, nil},
		{"report routes bad", &bbsv1.ReportRoutesPublishedRequest{EmitterId: "a/b", Revision: -1}, []string{"emitter_id", "revision"}},
		{"report routes no id", &bbsv1.ReportRoutesPublishedRequest{}, []string{"emitter_id"}},

		{"evacuate claimed", &bbsv1.EvacuateClaimedActualLRPRequest{ProcessGuid: "web-1", InstanceKey: goodKey}, nil},
		{"evacuate claimed bad", &bbsv1.EvacuateClaimedActualLRPRequest{ProcessGuid: "web-1"}, []string{"instance_key"}},
		{"evacuate running", &bbsv1.EvacuateRunningActualLRPRequest{ProcessGuid: "web-1", InstanceKey: goodKey, NetInfo: goodNet}, nil},
		{"evacuate running bad", &bbsv1.EvacuateRunningActualLRPRequest{ProcessGuid: "web-1", InstanceKey: goodKey, NetInfo: badNet},
			[]string{"net_info.ports[0].host_port"}},
		{"evacuate running missing", &bbsv1.EvacuateRunningActualLRPRequest{ProcessGuid: "web-1"}, []string{"instance_key", "net_info"}},
		{"evacuate stopped", &bbsv1.EvacuateStoppedActualLRPRequest{ProcessGuid: "web-1", InstanceKey: goodKey}, nil},
		{"evacuate stopped bad", &bbsv1.EvacuateStoppedActualLRPRequest{ProcessGuid: "web-1", Index: -1, InstanceKey: goodKey}, []string{"index"}},
		{"evacuate crashed", &bbsv1.EvacuateCrashedActualLRPRequest{ProcessGuid: "web-1", InstanceKey: goodKey, ErrorMessage: "oom"}, nil},
		{"evacuate crashed bad", &bbsv1.EvacuateCrashedActualLRPRequest{ProcessGuid: "", InstanceKey: badKey},
			[]string{"process_guid", "instance_key.instance_guid", "instance_key.cell_id"}},
		{"remove evacuating", &bbsv1.RemoveEvacuatingActualLRPRequest{ProcessGuid: "web-1", InstanceKey: goodKey}, nil},
		{"remove evacuating bad", &bbsv1.RemoveEvacuatingActualLRPRequest{ProcessGuid: "web-1"}, []string{"instance_key"}},

		{"desire task", &bbsv1.DesireTaskRequest{TaskGuid: "task-1", Domain: "cf-tasks", Definition: goodTask()}, nil},
		{"desire task missing", &bbsv1.DesireTaskRequest{}, []string{"task_guid", "domain", "definition"}},
		{"desire task bad", &bbsv1.DesireTaskRequest{TaskGuid: "task-1", Domain: "cf-tasks", Definition: func() *modelsv1.TaskDefinition {
			d := goodTask()
			d.Rootfs = "docker://"
			d.Action = &modelsv1.Action{}
			d.CompletionCallbackUrl = "cc/done"
			d.MaxRejections = -1
			return d
		}()}, []string{"definition.rootfs", "definition.action", "definition.completion_callback_url", "definition.max_rejections"}},
		{"tasks", &bbsv1.TasksRequest{Filter: goodFilter}, nil},
		{"tasks bad", &bbsv1.TasksRequest{Filter: badFilter}, badFilterAt},
		{"task by guid", &bbsv1.TaskByGuidRequest{TaskGuid: "task-1"}, nil},
		{"task by guid bad", &bbsv1.TaskByGuidRequest{TaskGuid: "task 1"}, []string{"task_guid"}},
		{"start task", &bbsv1.StartTaskRequest{TaskGuid: "task-1", CellId: "cell-1"}, nil},
		{"start task bad", &bbsv1.StartTaskRequest{TaskGuid: "task-1"}, []string{"cell_id"}},
		{"cancel task", &bbsv1.CancelTaskRequest{TaskGuid: "task-1"}, nil},
		{"cancel task bad", &bbsv1.CancelTaskRequest{}, []string{"task_guid"}},
		{"reject task", &bbsv1.RejectTaskRequest{TaskGuid: "task-1", RejectionReason: "full"}, nil},
		{"reject task with placement error", &bbsv1.RejectTaskRequest{TaskGuid: "task-1", PlacementError: goodPE}, nil},
		{"reject task bad", &bbsv1.RejectTaskRequest{TaskGuid: "task-1", PlacementError: &modelsv1.PlacementError{Message: "m"}},
			[]string{"placement_error.code"}},
		{"complete task", &bbsv1.CompleteTaskRequest{TaskGuid: "task-1", CellId: "cell-1", Failed: true, FailureReason: "exit 2"}, nil},
		{"complete task bad", &bbsv1.CompleteTaskRequest{CellId: "cell/1"}, []string{"task_guid", "cell_id"}},
		{"resolving task", &bbsv1.ResolvingTaskRequest{TaskGuid: "task-1"}, nil},
		{"resolving task bad", &bbsv1.ResolvingTaskRequest{TaskGuid: "task!"}, []string{"task_guid"}},
		{"delete task", &bbsv1.DeleteTaskRequest{TaskGuid: "task-1"}, nil},
		{"delete task bad", &bbsv1.DeleteTaskRequest{}, []string{"task_guid"}},

		{"cells", &bbsv1.CellsRequest{}, nil},
		{"cells since", &bbsv1.CellsRequest{KnownRevision: 42}, nil},
		{"cells since bad", &bbsv1.CellsRequest{KnownRevision: -1}, []string{"known_revision"}},
		{"tags", &bbsv1.TagsRequest{}, nil},
		{"resolve links", &bbsv1.ResolveLinksRequest{ProcessGuid: "web-1"}, nil},
		{"resolve links bad", &bbsv1.ResolveLinksRequest{}, []string{"process_guid"}},
		{"subscribe", &bbsv1.SubscribeToEventsRequest{SinceRevision: 42, Filter: &bbsv1.Filter{Domain: "cf-apps", CellId: "cell-1"}}, nil},
		{"subscribe from now", &bbsv1.SubscribeToEventsRequest{}, nil},
		{"subscribe to kinds", &bbsv1.SubscribeToEventsRequest{Kinds: []string{"links_changed", "desired_lrp_changed"}}, nil},
		{"subscribe to an unknown kind", &bbsv1.SubscribeToEventsRequest{Kinds: []string{"links_changed", "LinksChanged"}}, []string{"kinds[1]"}},
		{"subscribe bad", &bbsv1.SubscribeToEventsRequest{SinceRevision: -1, Filter: badFilter},
			append([]string{"since_revision"}, badFilterAt...)},
		{"logs", &bbsv1.StreamLogsRequest{ProcessGuid: "web", Follow: true}, nil},
		{"logs of a task", &bbsv1.StreamLogsRequest{TaskGuid: "t1"}, nil},
		{"logs of neither", &bbsv1.StreamLogsRequest{}, []string{"process_guid"}},
		{"logs bad", &bbsv1.StreamLogsRequest{ProcessGuid: "web", Index: proto.Int32(-1), Tail: proto.Int32(-2),
			Since: timestamppb.New(time.Now().Add(time.Hour))}, []string{"index", "tail", "since"}},
		{"logs of a task with an index", &bbsv1.StreamLogsRequest{TaskGuid: "t1", Index: proto.Int32(0)}, []string{"index"}},
		{"metrics", &bbsv1.InstanceMetricsRequest{ProcessGuid: "web", Index: proto.Int32(1)}, nil},
		{"metrics of neither", &bbsv1.InstanceMetricsRequest{}, []string{"process_guid"}},
		{"metrics of a task with an index", &bbsv1.InstanceMetricsRequest{TaskGuid: "t1", Index: proto.Int32(-1)}, []string{"index", "index"}},
		{"exec", &bbsv1.ExecRequest{Start: &repv1.ExecStart{ProcessGuid: "web", Index: 2, Command: []string{"/bin/sh"}, Tty: true}}, nil},
		{"exec without start", &bbsv1.ExecRequest{Stdin: []byte("x")}, []string{"start"}},
		{"exec bad", &bbsv1.ExecRequest{Start: &repv1.ExecStart{ProcessGuid: "", Index: -1}}, []string{"start.process_guid", "start.index", "start.command"}},

		{"nil", nil, nil},
		{"foreign type", &modelsv1.DesiredLRP{}, nil},
		{"not a message", "DesireLRPRequest", nil},
		{"typed nil", (*bbsv1.DesireLRPRequest)(nil), []string{"desired_lrp"}},
	}
}

func violationFields(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var inv *rpcerr.InvalidError
	if !errors.As(err, &inv) || !errors.Is(err, rpcerr.ErrInvalid) {
		t.Fatalf("error %v (%T) is not an *rpcerr.InvalidError", err, err)
	}
	out := make([]string, len(inv.Violations))
	for i, v := range inv.Violations {
		out[i] = v.Field
	}
	return out
}

func TestRequest(t *testing.T) {
	v := Validator{Limits: models.DefaultLimits()}
	for _, tt := range requestCases() {
		t.Run(tt.name, func(t *testing.T) {
			err := v.Request(tt.req)
			if got := violationFields(t, err); !slices.Equal(got, tt.want) {
				t.Errorf("violations = %q, want %q (error: %v)", got, tt.want, err)
			}
		})
	}
}

func TestRequestUsesLimits(t *testing.T) {
	d := goodLRP()
	d.Instances = 11
	req := &bbsv1.DesireLRPRequest{DesiredLrp: d}
	if err := (Validator{}).Request(req); err != nil {
		t.Errorf("zero Validator uses default limits, got %v", err)
	}
	err := Validator{Limits: models.Limits{MaxInstances: 10}}.Request(req)
	if got := violationFields(t, err); !slices.Equal(got, []string{"desired_lrp.instances"}) {
		t.Errorf("violations = %q, want desired_lrp.instances", got)
	}
}

// TestEveryRequestIsCovered fails when a request message is added to gavel.bbs.v1 without a
// valid case and, for messages with fields, an invalid case in requestCases.
func TestEveryRequestIsCovered(t *testing.T) {
	good := map[protoreflect.FullName]bool{}
	bad := map[protoreflect.FullName]bool{}
	for _, tt := range requestCases() {
		m, ok := tt.req.(proto.Message)
		if !ok || m == nil {
			continue
		}
		name := m.ProtoReflect().Descriptor().FullName()
		if tt.want == nil {
			good[name] = true
		} else {
			bad[name] = true
		}
	}
	msgs := bbsv1.File_gavel_bbs_v1_bbs_proto.Messages()
	n := 0
	for i := 0; i < msgs.Len(); i++ {
		md := msgs.Get(i)
		if !strings.HasSuffix(string(md.Name()), "Request") {
			continue
		}
		n++
		if !good[md.FullName()] {
			t.Errorf("%s has no valid test case", md.FullName())
		}
		if md.Fields().Len() > 0 && !bad[md.FullName()] {
			t.Errorf("%s has no invalid test case", md.FullName())
		}
	}
	if n < 33 {
		t.Errorf("found only %d request messages", n)
	}
}
