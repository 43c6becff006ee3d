// Package api serves gavel.rep.v1.RepService over a cell: thin handlers, request validation in
// Validate (installed as the server's validator), errors mapped by rpcerr's interceptor.
package api

import (
	"context"
	"fmt"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Cell is what the handlers need from the cell.
type Cell interface {
	// State is the cell's state.
	State() *repv1.StateResponse
	// StateSummary is the cell's state with instance counts per process guid instead of lists.
	StateSummary() *repv1.StateResponse
	// Perform takes work and returns what it could not take.
	Perform(lrps []*repv1.LRPInstance, tasks []*repv1.TaskWork) ([]*repv1.LRPInstance, []*repv1.TaskWork)
	// StopLRPInstance stops an instance and removes its record.
	StopLRPInstance(ctx context.Context, key *modelsv1.ActualLRPKey, ik *modelsv1.ActualLRPInstanceKey) error
	// CancelTask stops a task's container.
	CancelTask(ctx context.Context, guid string) error
	// Evacuate drains the cell.
	Evacuate(ctx context.Context) error
}

// Server implements repv1.RepServiceServer.
type Server struct {
	repv1.UnimplementedRepServiceServer
	cell Cell
}

var _ repv1.RepServiceServer = (*Server)(nil)

// New builds the handlers over a cell.
func New(cell Cell) *Server { return &Server{cell: cell} }

// State reports the cell's capacity, what it supports and what it runs (as instance counts per
// process guid when the request asks for a summary).
func (s *Server) State(_ context.Context, req *repv1.StateRequest) (*repv1.StateResponse, error) {
	if req.GetSummary() {
		return s.cell.StateSummary(), nil
	}
	return s.cell.State(), nil
}

// Perform reserves and starts work and answers the work the cell could not take.
func (s *Server) Perform(_ context.Context, req *repv1.PerformRequest) (*repv1.PerformResponse, error) {
	lrps, tasks := s.cell.Perform(req.GetLrps(), req.GetTasks())
	resp := &repv1.PerformResponse{FailedLrps: lrps, FailedTasks: tasks}
	if req.GetIncludeState() {
		resp.State = s.cell.StateSummary()
	}
	return resp, nil
}

// StopLRPInstance stops an instance and removes its record from the BBS.
func (s *Server) StopLRPInstance(ctx context.Context, req *repv1.StopLRPInstanceRequest) (*repv1.StopLRPInstanceResponse, error) {
	if err := s.cell.StopLRPInstance(ctx, req.GetKey(), req.GetInstanceKey()); err != nil {
		return nil, err
	}
	return &repv1.StopLRPInstanceResponse{}, nil
}

// CancelTask stops a task's container.
func (s *Server) CancelTask(ctx context.Context, req *repv1.CancelTaskRequest) (*repv1.CancelTaskResponse, error) {
	if err := s.cell.CancelTask(ctx, req.GetTaskGuid()); err != nil {
		return nil, err
	}
	return &repv1.CancelTaskResponse{}, nil
}

// Evacuate drains the cell and returns when it is done.
func (s *Server) Evacuate(ctx context.Context, _ *repv1.EvacuateRequest) (*repv1.EvacuateResponse, error) {
	if err := s.cell.Evacuate(ctx); err != nil {
		return nil, err
	}
	return &repv1.EvacuateResponse{}, nil
}

// Validate checks a rep request before it reaches a handler; other messages pass. Violations
// are reported together, each naming its field.
func Validate(req any) error {
	e := &rpcerr.InvalidError{}
	switch r := req.(type) {
	case *repv1.PerformRequest:
		for i, l := range r.GetLrps() {
			f := fmt.Sprintf("lrps[%d]", i)
			checkKey(e, f+".key", l.GetKey())
			checkResources(e, f+".resources", l.GetResources())
			e.Merge(f+".rootfs", models.ValidateRootfs(f+".rootfs", l.GetRootfs()))
			e.Merge(f+".placement_constraint", models.ValidatePlacementConstraint(f+".placement_constraint", l.GetPlacementConstraint()))
		}
		for i, t := range r.GetTasks() {
			f := fmt.Sprintf("tasks[%d]", i)
			e.Merge(f+".task_guid", models.ValidateGuid(f+".task_guid", t.GetTaskGuid()))
			checkResources(e, f+".resources", t.GetResources())
			e.Merge(f+".rootfs", models.ValidateRootfs(f+".rootfs", t.GetRootfs()))
			e.Merge(f+".placement_constraint", models.ValidatePlacementConstraint(f+".placement_constraint", t.GetPlacementConstraint()))
		}
	case *repv1.StopLRPInstanceRequest:
		checkKey(e, "key", r.GetKey())
		e.Merge("instance_key", models.ValidateInstanceKey("instance_key", r.GetInstanceKey()))
	case *repv1.CancelTaskRequest:
		e.Merge("task_guid", models.ValidateGuid("task_guid", r.GetTaskGuid()))
	}
	return e.Err()
}

func checkKey(e *rpcerr.InvalidError, field string, k *modelsv1.ActualLRPKey) {
	if k == nil {
		e.Add(field, "is required")
		return
	}
	e.Merge(field+".process_guid", models.ValidateGuid(field+".process_guid", k.GetProcessGuid()))
	if k.GetIndex() < 0 {
		e.Add(field+".index", "must not be negative, got %d", k.GetIndex())
	}
}

func checkResources(e *rpcerr.InvalidError, field string, r *modelsv1.Resources) {
	if r.GetMemoryMb() < 0 {
		e.Add(field+".memory_mb", "must not be negative, got %d", r.GetMemoryMb())
	}
	if r.GetDiskMb() < 0 {
		e.Add(field+".disk_mb", "must not be negative, got %d", r.GetDiskMb())
	}
	if r.GetMaxPids() < 0 {
		e.Add(field+".max_pids", "must not be negative, got %d", r.GetMaxPids())
	}
}
