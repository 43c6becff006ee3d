package api

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// RepIdentityPrefix is the certificate identity of a rep: spiffe://gavel/rep/<cell_id>.
const RepIdentityPrefix = "spiffe://gavel/rep/"

// RepScope confines callers whose client certificate names a rep (RepIdentityPrefix) to their
// own cell (docs/architecture.md §11): they may read anything, and change only instances and tasks on the
// cell their certificate names, through the lifecycle calls a rep makes. Every other caller
// (other identities, or no certificate on a plaintext development server) is not restricted.
func RepScope() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		id, ok := tlsx.PeerIdentity(ctx)
		if !ok || !strings.HasPrefix(id, RepIdentityPrefix) {
			return handler(ctx, req)
		}
		cell := strings.TrimPrefix(id, RepIdentityPrefix)
		if err := repMayCall(cell, req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// repMayCall reports whether the rep of cell may make the request.
func repMayCall(cell string, req any) error {
	ik := func(k *modelsv1.ActualLRPInstanceKey) error {
		if k.GetCellId() != cell {
			return status.Errorf(codes.PermissionDenied, "rep of cell %s may only change instances on its own cell (instance_key.cell_id is %q)", cell, k.GetCellId())
		}
		return nil
	}
	onCell := func(got string) error {
		if got != cell {
			return status.Errorf(codes.PermissionDenied, "rep of cell %s may only change tasks on its own cell (cell_id is %q)", cell, got)
		}
		return nil
	}
	switch r := req.(type) {
	case *bbsv1.DomainsRequest, *bbsv1.DesiredLRPsRequest, *bbsv1.DesiredLRPByProcessGuidRequest,
		*bbsv1.DesiredLRPSchedulingInfosRequest, *bbsv1.ActualLRPsRequest, *bbsv1.TasksRequest,
		*bbsv1.TaskByGuidRequest, *bbsv1.CellsRequest, *bbsv1.TagsRequest, *bbsv1.ResolveLinksRequest:
		return nil
	case *bbsv1.ClaimActualLRPRequest:
		return ik(r.GetInstanceKey())
	case *bbsv1.StartActualLRPRequest:
		return ik(r.GetInstanceKey())
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
	return status.Errorf(codes.PermissionDenied, "rep of cell %s may not call %T", cell, req)
}
