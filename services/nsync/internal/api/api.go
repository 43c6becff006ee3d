// Package api is nsync's gRPC handler: it maps each NsyncService call onto core.Core and the
// store. Errors become gRPC statuses in one place (rpcerr's interceptor).
package api

import (
	"context"
	"maps"
	"slices"

	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
	"github.com/gavel-sched/gavel/services/nsync/internal/core"
	"github.com/gavel-sched/gavel/services/nsync/internal/store"
)

// Server implements nsyncv1.NsyncServiceServer.
type Server struct {
	nsyncv1.UnimplementedNsyncServiceServer
	core  *core.Core
	store *store.Store
}

var _ nsyncv1.NsyncServiceServer = (*Server)(nil)

// New returns the handler.
func New(c *core.Core, st *store.Store) *Server { return &Server{core: c, store: st} }

// DesireApp implements nsyncv1.NsyncServiceServer.
func (s *Server) DesireApp(ctx context.Context, req *nsyncv1.DesireAppRequest) (*nsyncv1.DesireAppResponse, error) {
	app, pg, err := s.core.DesireApp(ctx, req.GetApp())
	if err != nil {
		return nil, err
	}
	return &nsyncv1.DesireAppResponse{App: appFor(ctx, app), ProcessGuid: pg}, nil
}

// UpdateApp implements nsyncv1.NsyncServiceServer.
func (s *Server) UpdateApp(ctx context.Context, req *nsyncv1.UpdateAppRequest) (*nsyncv1.UpdateAppResponse, error) {
	app, err := s.core.UpdateApp(ctx, req)
	if err != nil {
		return nil, err
	}
	return &nsyncv1.UpdateAppResponse{App: appFor(ctx, app)}, nil
}

// RestartApp implements nsyncv1.NsyncServiceServer.
func (s *Server) RestartApp(ctx context.Context, req *nsyncv1.RestartAppRequest) (*nsyncv1.RestartAppResponse, error) {
	app, pg, err := s.core.RestartApp(ctx, req.GetGuid())
	if err != nil {
		return nil, err
	}
	return &nsyncv1.RestartAppResponse{App: appFor(ctx, app), ProcessGuid: pg}, nil
}

// StopApp implements nsyncv1.NsyncServiceServer.
func (s *Server) StopApp(ctx context.Context, req *nsyncv1.StopAppRequest) (*nsyncv1.StopAppResponse, error) {
	if err := s.core.StopApp(ctx, req.GetGuid(), req.GetDelete()); err != nil {
		return nil, err
	}
	return &nsyncv1.StopAppResponse{}, nil
}

// Apps implements nsyncv1.NsyncServiceServer.
func (s *Server) Apps(ctx context.Context, req *nsyncv1.AppsRequest) (*nsyncv1.AppsResponse, error) {
	apps, err := s.core.Apps(ctx, req)
	if err != nil {
		return nil, err
	}
	return &nsyncv1.AppsResponse{Apps: appInfosFor(ctx, apps)}, nil
}

// RunTask implements nsyncv1.NsyncServiceServer.
func (s *Server) RunTask(ctx context.Context, req *nsyncv1.RunTaskRequest) (*nsyncv1.RunTaskResponse, error) {
	guid, err := s.core.RunTask(ctx, req)
	if err != nil {
		return nil, err
	}
	return &nsyncv1.RunTaskResponse{TaskGuid: guid}, nil
}

// CreatePlacementPool implements nsyncv1.NsyncServiceServer.
func (s *Server) CreatePlacementPool(ctx context.Context, req *nsyncv1.CreatePlacementPoolRequest) (*nsyncv1.CreatePlacementPoolResponse, error) {
	if err := build.ValidatePool("pool", req.GetPool()); err != nil {
		return nil, err
	}
	if err := s.store.CreatePool(ctx, req.GetPool()); err != nil {
		return nil, err
	}
	return &nsyncv1.CreatePlacementPoolResponse{}, nil
}

// UpdatePlacementPool implements nsyncv1.NsyncServiceServer.
func (s *Server) UpdatePlacementPool(ctx context.Context, req *nsyncv1.UpdatePlacementPoolRequest) (*nsyncv1.UpdatePlacementPoolResponse, error) {
	if err := build.ValidatePool("pool", req.GetPool()); err != nil {
		return nil, err
	}
	if err := s.store.UpdatePool(ctx, req.GetPool()); err != nil {
		return nil, err
	}
	return &nsyncv1.UpdatePlacementPoolResponse{}, nil
}

// DeletePlacementPool implements nsyncv1.NsyncServiceServer.
func (s *Server) DeletePlacementPool(ctx context.Context, req *nsyncv1.DeletePlacementPoolRequest) (*nsyncv1.DeletePlacementPoolResponse, error) {
	if err := build.ValidatePoolName("name", req.GetName()); err != nil {
		return nil, err
	}
	if err := s.store.DeletePool(ctx, req.GetName(), req.GetForce()); err != nil {
		return nil, err
	}
	return &nsyncv1.DeletePlacementPoolResponse{}, nil
}

// PlacementPools implements nsyncv1.NsyncServiceServer.
func (s *Server) PlacementPools(ctx context.Context, _ *nsyncv1.PlacementPoolsRequest) (*nsyncv1.PlacementPoolsResponse, error) {
	all, err := s.store.AllPools(ctx)
	if err != nil {
		return nil, err
	}
	resp := &nsyncv1.PlacementPoolsResponse{DefaultPool: all.Default}
	for _, name := range slices.Sorted(maps.Keys(all.Pools)) {
		resp.Pools = append(resp.Pools, &nsyncv1.PlacementPoolInfo{Pool: all.Pools[name], SpaceGuids: all.SpacesOf(name), IsDefault: name == all.Default})
	}
	return resp, nil
}

// BindPlacementPool implements nsyncv1.NsyncServiceServer.
func (s *Server) BindPlacementPool(ctx context.Context, req *nsyncv1.BindPlacementPoolRequest) (*nsyncv1.BindPlacementPoolResponse, error) {
	e := &rpcerr.InvalidError{}
	e.Merge("space_guid", models.ValidateGuid("space_guid", req.GetSpaceGuid()))
	e.Merge("pool", build.ValidatePoolName("pool", req.GetPool()))
	if err := e.Err(); err != nil {
		return nil, err
	}
	if err := s.store.Bind(ctx, req.GetSpaceGuid(), req.GetPool()); err != nil {
		return nil, err
	}
	return &nsyncv1.BindPlacementPoolResponse{}, nil
}

// UnbindPlacementPool implements nsyncv1.NsyncServiceServer.
func (s *Server) UnbindPlacementPool(ctx context.Context, req *nsyncv1.UnbindPlacementPoolRequest) (*nsyncv1.UnbindPlacementPoolResponse, error) {
	if err := models.ValidateGuid("space_guid", req.GetSpaceGuid()); err != nil {
		return nil, err
	}
	if err := s.store.Unbind(ctx, req.GetSpaceGuid()); err != nil {
		return nil, err
	}
	return &nsyncv1.UnbindPlacementPoolResponse{}, nil
}

// SetDefaultPlacementPool implements nsyncv1.NsyncServiceServer.
func (s *Server) SetDefaultPlacementPool(ctx context.Context, req *nsyncv1.SetDefaultPlacementPoolRequest) (*nsyncv1.SetDefaultPlacementPoolResponse, error) {
	if req.GetPool() != "" {
		if err := build.ValidatePoolName("pool", req.GetPool()); err != nil {
			return nil, err
		}
	}
	if err := s.store.SetDefault(ctx, req.GetPool()); err != nil {
		return nil, err
	}
	return &nsyncv1.SetDefaultPlacementPoolResponse{}, nil
}

// DeployApp implements nsyncv1.NsyncServiceServer.
func (s *Server) DeployApp(ctx context.Context, req *nsyncv1.DeployAppRequest) (*nsyncv1.DeployAppResponse, error) {
	app, d, outcome, err := s.core.DeployApp(ctx, req)
	if err != nil {
		return nil, err
	}
	return &nsyncv1.DeployAppResponse{App: appFor(ctx, app), Deployment: d, Outcome: outcome}, nil
}

// GetDeployment implements nsyncv1.NsyncServiceServer.
func (s *Server) GetDeployment(ctx context.Context, req *nsyncv1.GetDeploymentRequest) (*nsyncv1.GetDeploymentResponse, error) {
	ds, err := s.core.Deployments(ctx, req.GetAppGuid())
	if err != nil {
		return nil, err
	}
	resp := &nsyncv1.GetDeploymentResponse{}
	for _, d := range ds {
		switch {
		case d.GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_QUEUED:
			resp.Queued = d
		case resp.Deployment == nil:
			resp.Deployment = d
		}
	}
	if resp.Deployment == nil && resp.Queued == nil {
		return nil, rpcerr.NotFound("app %q has no deployment", req.GetAppGuid())
	}
	return resp, nil
}

// ListDeployments implements nsyncv1.NsyncServiceServer.
func (s *Server) ListDeployments(ctx context.Context, req *nsyncv1.ListDeploymentsRequest) (*nsyncv1.ListDeploymentsResponse, error) {
	ds, err := s.core.Deployments(ctx, req.GetAppGuid())
	if err != nil {
		return nil, err
	}
	return &nsyncv1.ListDeploymentsResponse{Deployments: ds}, nil
}

// PromoteDeployment implements nsyncv1.NsyncServiceServer.
func (s *Server) PromoteDeployment(ctx context.Context, req *nsyncv1.PromoteDeploymentRequest) (*nsyncv1.PromoteDeploymentResponse, error) {
	d, err := s.core.PromoteDeployment(ctx, req.GetAppGuid())
	if err != nil {
		return nil, err
	}
	return &nsyncv1.PromoteDeploymentResponse{Deployment: d}, nil
}

// CancelDeployment implements nsyncv1.NsyncServiceServer.
func (s *Server) CancelDeployment(ctx context.Context, req *nsyncv1.CancelDeploymentRequest) (*nsyncv1.CancelDeploymentResponse, error) {
	d, err := s.core.CancelDeployment(ctx, req.GetAppGuid())
	if err != nil {
		return nil, err
	}
	return &nsyncv1.CancelDeploymentResponse{Deployment: d}, nil
}

// RollbackApp implements nsyncv1.NsyncServiceServer.
func (s *Server) RollbackApp(ctx context.Context, req *nsyncv1.RollbackAppRequest) (*nsyncv1.RollbackAppResponse, error) {
	d, err := s.core.RollbackApp(ctx, req)
	if err != nil {
		return nil, err
	}
	return &nsyncv1.RollbackAppResponse{Deployment: d}, nil
}

// AppVersions implements nsyncv1.NsyncServiceServer.
func (s *Server) AppVersions(ctx context.Context, req *nsyncv1.AppVersionsRequest) (*nsyncv1.AppVersionsResponse, error) {
	vs, err := s.core.AppVersions(ctx, req.GetAppGuid())
	if err != nil {
		return nil, err
	}
	return &nsyncv1.AppVersionsResponse{Versions: versionsFor(ctx, vs)}, nil
}
