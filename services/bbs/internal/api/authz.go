package api

import (
	"fmt"
	"strings"

	"github.com/gavel-sched/gavel/pkg/authz"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// RepIdentityPrefix is the certificate identity of a rep: spiffe://gavel/rep/<cell_id>.
const RepIdentityPrefix = "spiffe://gavel/rep/"

// Reads are the BBS calls every role may make.
var Reads = []string{"Domains", "DesiredLRPs", "DesiredLRPByProcessGuid", "DesiredLRPSchedulingInfos",
	"ActualLRPs", "Tasks", "TaskByGuid", "Cells", "Tags", "ResolveLinks", "SubscribeToEvents"}

// repCalls are the lifecycle calls a rep makes; Check confines them to its own cell.
var repCalls = []string{"ClaimActualLRP", "StartActualLRP", "ClaimActualLRPs", "StartActualLRPs", "CrashActualLRP", "RemoveActualLRP",
	"EvacuateClaimedActualLRP", "EvacuateRunningActualLRP", "EvacuateStoppedActualLRP",
	"EvacuateCrashedActualLRP", "RemoveEvacuatingActualLRP", "StartTask", "CompleteTask"}

// repRoutine are the rep's calls made for every instance and task it runs, at the rate of the
// work: audited only when they fail (authz.Methods.Quiet). Evacuations, made when an operator
// drains a cell, are audited as every other change.
var repRoutine = []string{"ClaimActualLRP", "StartActualLRP", "ClaimActualLRPs", "StartActualLRPs", "CrashActualLRP", "RemoveActualLRP",
	"StartTask", "CompleteTask"}

// nsyncCalls are what nsync may do in its domains.
var nsyncCalls = []string{"DesireLRP", "UpdateDesiredLRP", "RemoveDesiredLRP", "DesireTask", "CancelTask",
	"ResolvingTask", "DeleteTask", "UpsertDomain"}

// Lookup finds the stored objects whose domain an nsync call must be checked against.
type Lookup struct {
	// DesiredLRP returns the desired LRP guid.
	DesiredLRP func(guid string) (*modelsv1.DesiredLRP, int64, error)
	// Task returns the task guid.
	Task func(guid string) (*modelsv1.Task, int64, error)
}

// Policy is the BBS's least-privilege rule (docs/architecture.md §11): every role reads; a rep changes only
// instances and tasks on its own cell; the auctioneer reports placement failures; a
// route-emitter reports the revision it has published; nsync
// desires, updates and removes work only in the domains of cfg; admin does anything.
func Policy(cfg authz.Config, lookup Lookup) authz.Policy {
	return authz.Methods{
		Service: bbsv1.BBSService_ServiceDesc.ServiceName,
		Reads:   Reads,
		Grants: map[string][]string{
			authz.Rep:          repCalls,
			authz.Auctioneer:   {"FailActualLRP", "RejectTask"},
			authz.RouteEmitter: {"ReportRoutesPublished"},
			authz.Nsync:        nsyncCalls,
			authz.ReadOnly:     {"StreamLogs", "InstanceMetrics"},
		},
		Quiet: map[string][]string{
			authz.Rep:          repRoutine,
			authz.RouteEmitter: {"ReportRoutesPublished"},
		},
		Check: func(role authz.Role, method string, req any) error {
			switch role.Kind {
			case authz.Rep:
				if contains(Reads, method) {
					return nil
				}
				return repMayCall(role.Param, req)
			case authz.Nsync:
				if contains(Reads, method) {
					return nil
				}
				return nsyncMayCall(cfg.NsyncDomains, lookup, req)
			}
			return nil
		},
	}
}

// nsyncMayCall checks that the work nsync touches is in one of its domains.
func nsyncMayCall(domains []string, lookup Lookup, req any) error {
	var domain string
	switch r := req.(type) {
	case *bbsv1.DesireLRPRequest:
		domain = r.GetDesiredLrp().GetDomain()
	case *bbsv1.DesireTaskRequest:
		domain = r.GetDomain()
	case *bbsv1.UpsertDomainRequest:
		domain = r.GetDomain()
	case *bbsv1.UpdateDesiredLRPRequest:
		return lrpDomain(domains, lookup, r.GetProcessGuid())
	case *bbsv1.RemoveDesiredLRPRequest:
		return lrpDomain(domains, lookup, r.GetProcessGuid())
	case *bbsv1.CancelTaskRequest:
		return taskDomain(domains, lookup, r.GetTaskGuid())
	case *bbsv1.ResolvingTaskRequest:
		return taskDomain(domains, lookup, r.GetTaskGuid())
	case *bbsv1.DeleteTaskRequest:
		return taskDomain(domains, lookup, r.GetTaskGuid())
	default:
		return fmt.Errorf("nsync may not make %T", req)
	}
	return inDomains(domains, domain)
}

func lrpDomain(domains []string, lookup Lookup, guid string) error {
	d, _, err := lookup.DesiredLRP(guid)
	if err != nil {
		return nil // the handler answers NotFound
	}
	return inDomains(domains, d.GetDomain())
}

func taskDomain(domains []string, lookup Lookup, guid string) error {
	t, _, err := lookup.Task(guid)
	if err != nil {
		return nil // the handler answers NotFound
	}
	return inDomains(domains, t.GetDomain())
}

func inDomains(domains []string, domain string) error {
	if !contains(domains, domain) {
		return fmt.Errorf("domain %q is not one of nsync's (%s)", domain, strings.Join(domains, ", "))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// repMayCall reports whether the rep of cell may make the request.
func repMayCall(cell string, req any) error {
	ik := func(k *modelsv1.ActualLRPInstanceKey) error {
		if k.GetCellId() != cell {
			return fmt.Errorf("rep of cell %s may only change instances on its own cell (instance_key.cell_id is %q)", cell, k.GetCellId())
		}
		return nil
	}
	onCell := func(got string) error {
		if got != cell {
			return fmt.Errorf("rep of cell %s may only change tasks on its own cell (cell_id is %q)", cell, got)
		}
		return nil
	}
	switch r := req.(type) {
	case *bbsv1.ClaimActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.StartActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.ClaimActualLRPsRequest:
		for _, c := range r.GetClaims() {
			if err := ik(c.GetInstanceKey()); err != nil {
				return err
			}
		}
		return nil
	case *bbsv1.StartActualLRPsRequest:
		for _, st := range r.GetStarts() {
			if err := ik(st.GetInstanceKey()); err != nil {
				return err
			}
		}
		return nil
	case *bbsv1.CrashActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.RemoveActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.EvacuateClaimedActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.EvacuateRunningActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.EvacuateStoppedActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.EvacuateCrashedActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.RemoveEvacuatingActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.StartTaskRequest:
		return onCell(r.GetCellId())
	case *bbsv1.CompleteTaskRequest:
		return onCell(r.GetCellId())
	}
	return fmt.Errorf("rep of cell %s may not call %T", cell, req)
}
