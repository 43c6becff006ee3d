// Package validate checks BBS requests before they reach the store: everything that can be
// decided from the request alone (guid syntax, indexes, instance keys, net info, placement
// errors, filters, required sub-messages and whole DesiredLRPs and task definitions). Violations
// are reported together as an *rpcerr.InvalidError naming each field by its protobuf path.
package validate

import (
	"errors"
	"strconv"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/labels"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Validator validates BBS requests against size limits.
type Validator struct {
	// Limits bounds instances, annotations, properties and routes; zero fields mean defaults.
	Limits models.Limits
}

// Request validates one BBS request message. It returns nil for a nil request and for types
// that are not BBS requests, so interceptors shared with other services can call it on
// everything.
func (v Validator) Request(req any) error {
	e := &rpcerr.InvalidError{}
	switch r := req.(type) {
	case *bbsv1.UpsertDomainRequest:
		e.Merge("domain", models.ValidateDomain("domain", r.GetDomain()))
		nonNegative(e, "ttl_seconds", r.GetTtlSeconds())
	case *bbsv1.DomainsRequest, *bbsv1.TagsRequest:
		// No fields.
	case *bbsv1.CellsRequest:
		nonNegative(e, "known_revision", r.GetKnownRevision())

	case *bbsv1.DesireLRPRequest:
		e.Merge("desired_lrp", models.ValidateDesiredLRP("desired_lrp", r.GetDesiredLrp(), v.Limits))
	case *bbsv1.UpdateDesiredLRPRequest:
		guid(e, "process_guid", r.GetProcessGuid())
		e.Merge("update", models.ValidateDesiredLRPUpdate("update", r.GetUpdate(), v.Limits))
	case *bbsv1.RemoveDesiredLRPRequest:
		guid(e, "process_guid", r.GetProcessGuid())
	case *bbsv1.DesiredLRPsRequest:
		filter(e, "filter", r.GetFilter())
	case *bbsv1.DesiredLRPByProcessGuidRequest:
		guid(e, "process_guid", r.GetProcessGuid())
	case *bbsv1.DesiredLRPSchedulingInfosRequest:
		filter(e, "filter", r.GetFilter())

	case *bbsv1.ActualLRPsRequest:
		filter(e, "filter", r.GetFilter())
		if r.Index != nil {
			nonNegative(e, "index", int64(r.GetIndex()))
		}
	case *bbsv1.ClaimActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
	case *bbsv1.StartActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
		e.Merge("net_info", models.ValidateNetInfo("net_info", r.GetNetInfo()))
		if r.GetDomain() != "" {
			e.Merge("domain", models.ValidateDomain("domain", r.GetDomain()))
		}
	case *bbsv1.ClaimActualLRPsRequest:
		batch(e, "claims", len(r.GetClaims()), func(i int) error { return v.Request(r.GetClaims()[i]) })
	case *bbsv1.StartActualLRPsRequest:
		batch(e, "starts", len(r.GetStarts()), func(i int) error { return v.Request(r.GetStarts()[i]) })
	case *bbsv1.CrashActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
	case *bbsv1.FailActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("placement_error", models.ValidatePlacementError("placement_error", r.GetPlacementError()))
	case *bbsv1.RemoveActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		if r.GetInstanceKey() != nil {
			e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
		}
	case *bbsv1.RetireActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
	case *bbsv1.ReportRoutesPublishedRequest:
		emitterID(e, r.GetEmitterId())
		nonNegative(e, "revision", r.GetRevision())

	case *bbsv1.EvacuateClaimedActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
	case *bbsv1.EvacuateRunningActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
		e.Merge("net_info", models.ValidateNetInfo("net_info", r.GetNetInfo()))
	case *bbsv1.EvacuateStoppedActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
	case *bbsv1.EvacuateCrashedActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
	case *bbsv1.RemoveEvacuatingActualLRPRequest:
		slot(e, r.GetProcessGuid(), r.GetIndex())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))

	case *bbsv1.DesireTaskRequest:
		guid(e, "task_guid", r.GetTaskGuid())
		e.Merge("domain", models.ValidateDomain("domain", r.GetDomain()))
		e.Merge("definition", models.ValidateTaskDefinition("definition", r.GetDefinition(), v.Limits))
	case *bbsv1.TasksRequest:
		filter(e, "filter", r.GetFilter())
	case *bbsv1.TaskByGuidRequest:
		guid(e, "task_guid", r.GetTaskGuid())
	case *bbsv1.StartTaskRequest:
		guid(e, "task_guid", r.GetTaskGuid())
		e.Merge("cell_id", models.ValidateCellID("cell_id", r.GetCellId()))
	case *bbsv1.CancelTaskRequest:
		guid(e, "task_guid", r.GetTaskGuid())
	case *bbsv1.RejectTaskRequest:
		guid(e, "task_guid", r.GetTaskGuid())
		if r.GetPlacementError() != nil {
			e.Merge("placement_error", models.ValidatePlacementError("placement_error", r.GetPlacementError()))
		}
	case *bbsv1.CompleteTaskRequest:
		guid(e, "task_guid", r.GetTaskGuid())
		e.Merge("cell_id", models.ValidateCellID("cell_id", r.GetCellId()))
	case *bbsv1.ResolvingTaskRequest:
		guid(e, "task_guid", r.GetTaskGuid())
	case *bbsv1.DeleteTaskRequest:
		guid(e, "task_guid", r.GetTaskGuid())

	case *bbsv1.ResolveLinksRequest:
		guid(e, "process_guid", r.GetProcessGuid())
		if r.GetCellId() != "" {
			e.Merge("cell_id", models.ValidateCellID("cell_id", r.GetCellId()))
		}
	case *bbsv1.SubscribeToEventsRequest:
		nonNegative(e, "since_revision", r.GetSinceRevision())
		filter(e, "filter", r.GetFilter())
		for i, k := range r.GetKinds() {
			if eventKinds.ByName(protoreflect.Name(k)) == nil {
				e.Add("kinds["+strconv.Itoa(i)+"]", "unknown event kind %q", k)
			}
		}
	case *bbsv1.StreamLogsRequest:
		selection(e, r.GetProcessGuid(), r.Index, r.GetTaskGuid())
		if r.Tail != nil && r.GetTail() < 0 {
			e.Add("tail", "must not be negative, got %d", r.GetTail())
		}
		if r.GetSince() != nil && r.GetSince().AsTime().After(time.Now()) {
			e.Add("since", "must not be in the future")
		}
	case *bbsv1.InstanceMetricsRequest:
		selection(e, r.GetProcessGuid(), r.Index, r.GetTaskGuid())
	case *bbsv1.ExecRequest:
		st := r.GetStart()
		if st == nil {
			e.Add("start", "is required in the first message")
			break
		}
		guid(e, "start.process_guid", st.GetProcessGuid())
		nonNegative(e, "start.index", int64(st.GetIndex()))
		if len(st.GetCommand()) == 0 || st.GetCommand()[0] == "" {
			e.Add("start.command", "is required: the program and its arguments")
		}
	}
	return e.Err()
}

// selection checks a selection of an LRP's instances (all, or one index) or of a task.
func selection(e *rpcerr.InvalidError, processGuid string, index *int32, taskGuid string) {
	switch {
	case (processGuid == "") == (taskGuid == ""):
		e.Add("process_guid", "exactly one of process_guid and task_guid is required")
	case taskGuid != "":
		guid(e, "task_guid", taskGuid)
		if index != nil {
			e.Add("index", "applies to an LRP (process_guid), not a task")
		}
	default:
		guid(e, "process_guid", processGuid)
	}
	if index != nil && *index < 0 {
		e.Add("index", "must not be negative, got %d", *index)
	}
}

func guid(e *rpcerr.InvalidError, field, s string) {
	e.Merge(field, models.ValidateGuid(field, s))
}

// slot checks the process guid and index naming an instance slot.
// emitterID checks a route-emitter id: 1–128 characters of [A-Za-z0-9._-] (it is an etcd key
// segment).
func emitterID(e *rpcerr.InvalidError, id string) {
	if id == "" || len(id) > 128 {
		e.Add("emitter_id", "must be 1 to 128 characters, got %d", len(id))
		return
	}
	for _, ch := range id {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '_' || ch == '-') {
			e.Add("emitter_id", "may hold only letters, digits, '.', '_' and '-', got %q", id)
			return
		}
	}
}

// eventKinds are the fields of Event's kind oneof, the names SubscribeToEventsRequest.kinds takes.
var eventKinds = (&bbsv1.Event{}).ProtoReflect().Descriptor().Oneofs().ByName("kind").Fields()

// MaxBatch bounds the items of one batch call (ClaimActualLRPs, StartActualLRPs).
const MaxBatch = 1000

// batch checks a batch call's n items: at least one, at most MaxBatch, each valid as the call
// it stands for, its violations named under field[i].
func batch(e *rpcerr.InvalidError, field string, n int, item func(i int) error) {
	if n == 0 {
		e.Add(field, "must hold at least one item")
	}
	if n > MaxBatch {
		e.Add(field, "must hold at most %d items, got %d", MaxBatch, n)
		return
	}
	for i := range n {
		err := item(i)
		var inv *rpcerr.InvalidError
		if !errors.As(err, &inv) {
			e.Merge(field+"["+strconv.Itoa(i)+"]", err)
			continue
		}
		for _, viol := range inv.Violations {
			e.Add(field+"["+strconv.Itoa(i)+"]."+viol.Field, "%s", viol.Reason)
		}
	}
}

func slot(e *rpcerr.InvalidError, processGuid string, index int32) {
	guid(e, "process_guid", processGuid)
	nonNegative(e, "index", int64(index))
}

func nonNegative(e *rpcerr.InvalidError, field string, n int64) {
	if n < 0 {
		e.Add(field, "must not be negative, got %d", n)
	}
}

// filter checks the optional fields of a list filter; a nil filter matches everything.
func filter(e *rpcerr.InvalidError, field string, f *bbsv1.Filter) {
	if f == nil {
		return
	}
	if d := f.GetDomain(); d != "" {
		e.Merge(field+".domain", models.ValidateDomain(field+".domain", d))
	}
	for i, g := range f.GetProcessGuids() {
		p := field + ".process_guids[" + strconv.Itoa(i) + "]"
		e.Merge(p, models.ValidateGuid(p, g))
	}
	if c := f.GetCellId(); c != "" {
		e.Merge(field+".cell_id", models.ValidateCellID(field+".cell_id", c))
	}
	if s := f.GetLabelSelector(); s != "" {
		if _, err := labels.Parse(s); err != nil {
			e.Add(field+".label_selector", "%v", err)
		}
	}
}
