// Package api is the BBS's gRPC surface: each handler unpacks its request (already validated by
// the server's validator), calls the core and packs the answer, with secret env values redacted
// for a caller whose role may not read them (secrets.go). Errors are mapped to gRPC
// statuses in one place, by rpcerr's interceptors.
package api

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// Cache is what the API answers straight from the store's cache: lists, with the revision they
// were read at, and the event stream.
type Cache interface {
	Domains() ([]*modelsv1.Domain, int64)
	DesiredLRPs(f store.ListFilter) ([]*modelsv1.DesiredLRP, int64)
	SchedulingInfos(f store.ListFilter) ([]*modelsv1.DesiredLRPSchedulingInfo, int64)
	ActualLRPs(f store.ListFilter) ([]*modelsv1.ActualLRP, int64)
	ActualLRPsEncoded(f store.ListFilter) ([][]byte, int64)
	Tasks(f store.ListFilter) ([]*modelsv1.Task, int64)
	Cells() ([]*modelsv1.CellPresence, int64)
	CellsSince(known int64) ([]*modelsv1.CellPresence, int64, bool)
	Subscribe(ctx context.Context, since int64, f store.EventFilter, bookmarkEvery time.Duration, send func(*bbsv1.SubscribeToEventsResponse) error) error
}

var _ Cache = (*store.Store)(nil)

// Server implements bbsv1.BBSServiceServer over the core.
type Server struct {
	bbsv1.UnimplementedBBSServiceServer
	desired       *core.DesiredLRPs
	actual        *core.ActualLRPs
	tasks         *core.Tasks
	domains       *core.Domains
	cells         *core.Cells
	routing       *core.Routing
	cache         Cache
	bookmarkEvery time.Duration
	logs          LogSource
	access        InstanceAccess
	audit         hclog.Logger
}

var _ bbsv1.BBSServiceServer = (*Server)(nil)

// New returns the API over c, answering lists and event subscriptions from cache; idle event
// subscribers get a bookmark every bookmarkEvery.
func New(c *core.Core, cache Cache, bookmarkEvery time.Duration, opts ...Option) *Server {
	s := &Server{
		desired:       c.DesiredLRPs,
		actual:        c.ActualLRPs,
		tasks:         c.Tasks,
		domains:       c.Domains,
		cells:         c.Cells,
		routing:       c.Routing,
		cache:         cache,
		bookmarkEvery: bookmarkEvery,
		audit:         hclog.NewNullLogger(),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// UpsertDomain implements bbsv1.BBSServiceServer.
func (s *Server) UpsertDomain(ctx context.Context, r *bbsv1.UpsertDomainRequest) (*bbsv1.UpsertDomainResponse, error) {
	return &bbsv1.UpsertDomainResponse{}, s.domains.UpsertDomain(ctx, r.GetDomain(), r.GetTtlSeconds())
}

// Domains implements bbsv1.BBSServiceServer.
func (s *Server) Domains(context.Context, *bbsv1.DomainsRequest) (*bbsv1.DomainsResponse, error) {
	domains, rev := s.cache.Domains()
	return &bbsv1.DomainsResponse{Domains: domains, Revision: rev}, nil
}

// DesireLRP implements bbsv1.BBSServiceServer.
func (s *Server) DesireLRP(ctx context.Context, r *bbsv1.DesireLRPRequest) (*bbsv1.DesireLRPResponse, error) {
	rev, err := s.desired.DesireLRP(ctx, r.GetDesiredLrp())
	if err != nil {
		return nil, err
	}
	return &bbsv1.DesireLRPResponse{Revision: rev}, nil
}

// UpdateDesiredLRP implements bbsv1.BBSServiceServer.
func (s *Server) UpdateDesiredLRP(ctx context.Context, r *bbsv1.UpdateDesiredLRPRequest) (*bbsv1.UpdateDesiredLRPResponse, error) {
	d, rev, err := s.desired.UpdateDesiredLRP(ctx, r.GetProcessGuid(), r.GetUpdate(), r.GetExpectedModificationTag())
	if err != nil {
		return nil, err
	}
	return &bbsv1.UpdateDesiredLRPResponse{DesiredLrp: secretsFor(ctx).desiredLRP(s.cache, d), Revision: rev}, nil
}

// RemoveDesiredLRP implements bbsv1.BBSServiceServer.
func (s *Server) RemoveDesiredLRP(ctx context.Context, r *bbsv1.RemoveDesiredLRPRequest) (*bbsv1.RemoveDesiredLRPResponse, error) {
	rev, err := s.desired.RemoveDesiredLRP(ctx, r.GetProcessGuid(), r.GetForce())
	if err != nil {
		return nil, err
	}
	return &bbsv1.RemoveDesiredLRPResponse{Revision: rev}, nil
}

// DesiredLRPs implements bbsv1.BBSServiceServer.
func (s *Server) DesiredLRPs(ctx context.Context, r *bbsv1.DesiredLRPsRequest) (*bbsv1.DesiredLRPsResponse, error) {
	f, err := core.ListFilter(r.GetFilter())
	if err != nil {
		return nil, err
	}
	lrps, rev := s.cache.DesiredLRPs(f)
	return &bbsv1.DesiredLRPsResponse{DesiredLrps: secretsFor(ctx).desiredLRPs(s.cache, lrps), Revision: rev}, nil
}

// DesiredLRPByProcessGuid implements bbsv1.BBSServiceServer.
func (s *Server) DesiredLRPByProcessGuid(ctx context.Context, r *bbsv1.DesiredLRPByProcessGuidRequest) (*bbsv1.DesiredLRPByProcessGuidResponse, error) {
	d, rev, err := s.desired.DesiredLRP(r.GetProcessGuid())
	if err != nil {
		return nil, err
	}
	return &bbsv1.DesiredLRPByProcessGuidResponse{DesiredLrp: secretsFor(ctx).desiredLRP(s.cache, d), Revision: rev}, nil
}

// DesiredLRPSchedulingInfos implements bbsv1.BBSServiceServer.
func (s *Server) DesiredLRPSchedulingInfos(_ context.Context, r *bbsv1.DesiredLRPSchedulingInfosRequest) (*bbsv1.DesiredLRPSchedulingInfosResponse, error) {
	f, err := core.ListFilter(r.GetFilter())
	if err != nil {
		return nil, err
	}
	infos, rev := s.cache.SchedulingInfos(f)
	return &bbsv1.DesiredLRPSchedulingInfosResponse{SchedulingInfos: infos, Revision: rev}, nil
}

// ActualLRPs implements bbsv1.BBSServiceServer.
func (s *Server) ActualLRPs(_ context.Context, r *bbsv1.ActualLRPsRequest) (*bbsv1.ActualLRPsResponse, error) {
	f, err := core.ListFilter(r.GetFilter())
	if err != nil {
		return nil, err
	}
	if r.Index != nil {
		idx := r.GetIndex()
		f.Index = &idx
	}
	return actualLRPsResponse(s.cache.ActualLRPsEncoded(f)), nil
}

// ClaimActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) ClaimActualLRP(ctx context.Context, r *bbsv1.ClaimActualLRPRequest) (*bbsv1.ClaimActualLRPResponse, error) {
	a, err := s.actual.ClaimActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey())
	if err != nil {
		return nil, err
	}
	resp := &bbsv1.ClaimActualLRPResponse{ActualLrp: a}
	if r.GetIncludeDesiredLrp() {
		resp.DesiredLrp = s.claimedDesired(ctx, r.GetProcessGuid())
	}
	return resp, nil
}

// claimedDesired is the desired LRP a claim brings back (include_desired_lrp), read after the
// claim committed. It is read from the cache: a removed LRP leaves it nil, and the rep then asks
// and finds the LRP gone, as it would have without the flag. The claim is for an instance on the
// caller's cell (the policy checked), so a rep with the read-secrets capability gets the secrets
// it must start the container with.
func (s *Server) claimedDesired(ctx context.Context, guid string) *modelsv1.DesiredLRP {
	d, _, err := s.desired.DesiredLRP(guid)
	if err != nil {
		return nil
	}
	if sc := secretsFor(ctx); !sc.all && sc.cell == "" {
		return models.RedactSecrets(d)
	}
	return d
}

// StartActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) StartActualLRP(ctx context.Context, r *bbsv1.StartActualLRPRequest) (*bbsv1.StartActualLRPResponse, error) {
	a, err := s.actual.StartActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey(), r.GetNetInfo(), r.GetRoutable(), r.GetDomain())
	if err != nil {
		return nil, err
	}
	return &bbsv1.StartActualLRPResponse{ActualLrp: a}, nil
}

// CrashActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) CrashActualLRP(ctx context.Context, r *bbsv1.CrashActualLRPRequest) (*bbsv1.CrashActualLRPResponse, error) {
	a, err := s.actual.CrashActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey(), r.GetErrorMessage())
	if err != nil {
		return nil, err
	}
	return &bbsv1.CrashActualLRPResponse{ActualLrp: a}, nil
}

// FailActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) FailActualLRP(ctx context.Context, r *bbsv1.FailActualLRPRequest) (*bbsv1.FailActualLRPResponse, error) {
	return &bbsv1.FailActualLRPResponse{}, s.actual.FailActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetPlacementError())
}

// RemoveActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) RemoveActualLRP(ctx context.Context, r *bbsv1.RemoveActualLRPRequest) (*bbsv1.RemoveActualLRPResponse, error) {
	return &bbsv1.RemoveActualLRPResponse{}, s.actual.RemoveActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey())
}

// RetireActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) RetireActualLRP(ctx context.Context, r *bbsv1.RetireActualLRPRequest) (*bbsv1.RetireActualLRPResponse, error) {
	return &bbsv1.RetireActualLRPResponse{}, s.actual.RetireActualLRP(ctx, r.GetProcessGuid(), r.GetIndex())
}

// ReportRoutesPublished implements bbsv1.BBSServiceServer.
func (s *Server) ReportRoutesPublished(ctx context.Context, r *bbsv1.ReportRoutesPublishedRequest) (*bbsv1.ReportRoutesPublishedResponse, error) {
	return &bbsv1.ReportRoutesPublishedResponse{}, s.routing.ReportRoutesPublished(ctx, r.GetEmitterId(), r.GetRevision())
}

// EvacuateClaimedActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) EvacuateClaimedActualLRP(ctx context.Context, r *bbsv1.EvacuateClaimedActualLRPRequest) (*bbsv1.EvacuateClaimedActualLRPResponse, error) {
	keep, err := s.actual.EvacuateClaimedActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey())
	if err != nil {
		return nil, err
	}
	return &bbsv1.EvacuateClaimedActualLRPResponse{KeepContainer: keep}, nil
}

// EvacuateRunningActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) EvacuateRunningActualLRP(ctx context.Context, r *bbsv1.EvacuateRunningActualLRPRequest) (*bbsv1.EvacuateRunningActualLRPResponse, error) {
	keep, err := s.actual.EvacuateRunningActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey(), r.GetNetInfo())
	if err != nil {
		return nil, err
	}
	return &bbsv1.EvacuateRunningActualLRPResponse{KeepContainer: keep}, nil
}

// EvacuateStoppedActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) EvacuateStoppedActualLRP(ctx context.Context, r *bbsv1.EvacuateStoppedActualLRPRequest) (*bbsv1.EvacuateStoppedActualLRPResponse, error) {
	keep, err := s.actual.EvacuateStoppedActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey())
	if err != nil {
		return nil, err
	}
	return &bbsv1.EvacuateStoppedActualLRPResponse{KeepContainer: keep}, nil
}

// EvacuateCrashedActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) EvacuateCrashedActualLRP(ctx context.Context, r *bbsv1.EvacuateCrashedActualLRPRequest) (*bbsv1.EvacuateCrashedActualLRPResponse, error) {
	keep, err := s.actual.EvacuateCrashedActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey(), r.GetErrorMessage())
	if err != nil {
		return nil, err
	}
	return &bbsv1.EvacuateCrashedActualLRPResponse{KeepContainer: keep}, nil
}

// RemoveEvacuatingActualLRP implements bbsv1.BBSServiceServer.
func (s *Server) RemoveEvacuatingActualLRP(ctx context.Context, r *bbsv1.RemoveEvacuatingActualLRPRequest) (*bbsv1.RemoveEvacuatingActualLRPResponse, error) {
	return &bbsv1.RemoveEvacuatingActualLRPResponse{}, s.actual.RemoveEvacuatingActualLRP(ctx, r.GetProcessGuid(), r.GetIndex(), r.GetInstanceKey())
}

// DesireTask implements bbsv1.BBSServiceServer.
func (s *Server) DesireTask(ctx context.Context, r *bbsv1.DesireTaskRequest) (*bbsv1.DesireTaskResponse, error) {
	rev, err := s.tasks.DesireTask(ctx, r.GetTaskGuid(), r.GetDomain(), r.GetDefinition())
	if err != nil {
		return nil, err
	}
	return &bbsv1.DesireTaskResponse{Revision: rev}, nil
}

// Tasks implements bbsv1.BBSServiceServer.
func (s *Server) Tasks(ctx context.Context, r *bbsv1.TasksRequest) (*bbsv1.TasksResponse, error) {
	f, err := core.ListFilter(r.GetFilter())
	if err != nil {
		return nil, err
	}
	tasks, rev := s.cache.Tasks(f)
	return &bbsv1.TasksResponse{Tasks: secretsFor(ctx).tasks(tasks), Revision: rev}, nil
}

// TaskByGuid implements bbsv1.BBSServiceServer.
func (s *Server) TaskByGuid(ctx context.Context, r *bbsv1.TaskByGuidRequest) (*bbsv1.TaskByGuidResponse, error) {
	t, rev, err := s.tasks.Task(r.GetTaskGuid())
	if err != nil {
		return nil, err
	}
	return &bbsv1.TaskByGuidResponse{Task: secretsFor(ctx).task(t), Revision: rev}, nil
}

// StartTask implements bbsv1.BBSServiceServer.
func (s *Server) StartTask(ctx context.Context, r *bbsv1.StartTaskRequest) (*bbsv1.StartTaskResponse, error) {
	start, err := s.tasks.StartTask(ctx, r.GetTaskGuid(), r.GetCellId())
	if err != nil {
		return nil, err
	}
	return &bbsv1.StartTaskResponse{ShouldStart: start}, nil
}

// CancelTask implements bbsv1.BBSServiceServer.
func (s *Server) CancelTask(ctx context.Context, r *bbsv1.CancelTaskRequest) (*bbsv1.CancelTaskResponse, error) {
	return &bbsv1.CancelTaskResponse{}, s.tasks.CancelTask(ctx, r.GetTaskGuid())
}

// RejectTask implements bbsv1.BBSServiceServer.
func (s *Server) RejectTask(ctx context.Context, r *bbsv1.RejectTaskRequest) (*bbsv1.RejectTaskResponse, error) {
	return &bbsv1.RejectTaskResponse{}, s.tasks.RejectTask(ctx, r.GetTaskGuid(), r.GetRejectionReason(), r.GetPlacementError())
}

// CompleteTask implements bbsv1.BBSServiceServer.
func (s *Server) CompleteTask(ctx context.Context, r *bbsv1.CompleteTaskRequest) (*bbsv1.CompleteTaskResponse, error) {
	return &bbsv1.CompleteTaskResponse{}, s.tasks.CompleteTask(ctx, r.GetTaskGuid(), r.GetCellId(), r.GetFailed(), r.GetFailureReason(), r.GetResult())
}

// ResolvingTask implements bbsv1.BBSServiceServer.
func (s *Server) ResolvingTask(ctx context.Context, r *bbsv1.ResolvingTaskRequest) (*bbsv1.ResolvingTaskResponse, error) {
	return &bbsv1.ResolvingTaskResponse{}, s.tasks.ResolvingTask(ctx, r.GetTaskGuid())
}

// DeleteTask implements bbsv1.BBSServiceServer.
func (s *Server) DeleteTask(ctx context.Context, r *bbsv1.DeleteTaskRequest) (*bbsv1.DeleteTaskResponse, error) {
	return &bbsv1.DeleteTaskResponse{}, s.tasks.DeleteTask(ctx, r.GetTaskGuid())
}

// Cells implements bbsv1.BBSServiceServer.
func (s *Server) Cells(_ context.Context, r *bbsv1.CellsRequest) (*bbsv1.CellsResponse, error) {
	cells, rev, unchanged := s.cache.CellsSince(r.GetKnownRevision())
	return &bbsv1.CellsResponse{Cells: cells, Revision: rev, Unchanged: unchanged}, nil
}

// Tags implements bbsv1.BBSServiceServer.
func (s *Server) Tags(context.Context, *bbsv1.TagsRequest) (*bbsv1.TagsResponse, error) {
	return &bbsv1.TagsResponse{Tags: s.cells.Tags()}, nil
}

// ResolveLinks implements bbsv1.BBSServiceServer.
func (s *Server) ResolveLinks(_ context.Context, r *bbsv1.ResolveLinksRequest) (*bbsv1.ResolveLinksResponse, error) {
	return s.desired.ResolveLinks(r.GetProcessGuid(), r.GetCellId())
}

// SubscribeToEvents implements bbsv1.BBSServiceServer.
func (s *Server) SubscribeToEvents(r *bbsv1.SubscribeToEventsRequest, stream bbsv1.BBSService_SubscribeToEventsServer) error {
	f, err := store.NewEventFilter(r.GetFilter())
	if err != nil {
		return err
	}
	if f.Kinds, err = store.EventKinds(r.GetKinds()); err != nil {
		return err
	}
	sc := secretsFor(stream.Context())
	return s.cache.Subscribe(stream.Context(), r.GetSinceRevision(), f, s.bookmarkEvery, func(r *bbsv1.SubscribeToEventsResponse) error {
		return stream.Send(sc.event(r))
	})
}
