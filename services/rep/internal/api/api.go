// Package api serves gavel.rep.v1.RepService over a cell: thin handlers, request validation in
// Validate (installed as the server's validator), errors mapped by rpcerr's interceptor.
package api

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/logs"
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
	// Holds reports whether the cell holds a container f selects.
	Holds(f logs.Filter) bool
	// ContainerMetrics is the latest resource sample of the containers f selects (all: every
	// container).
	ContainerMetrics(f logs.Filter, all bool) []*repv1.ContainerMetrics
	// ExecTarget is the running container of an instance, to run a command in.
	ExecTarget(processGuid string, index int32) (string, executor.Execer, error)
}

// Server implements repv1.RepServiceServer.
type Server struct {
	repv1.UnimplementedRepServiceServer
	cell Cell
	logs *logs.Store
	// stopping is closed when the rep stops: followers are let go before the gRPC server's
	// graceful stop waits for them.
	stopping     chan struct{}
	stoppingOnce sync.Once
}

var _ repv1.RepServiceServer = (*Server)(nil)

// New builds the handlers over a cell and its log store.
func New(cell Cell, store *logs.Store) *Server {
	return &Server{cell: cell, logs: store, stopping: make(chan struct{})}
}

// EndFollows runs until ctx ends, then ends every StreamLogs follow (cleanly, as when the
// containers end) and makes new ones end after their history. Run it as a member stopped
// before the gRPC server, whose graceful stop would otherwise wait for the followers.
func (s *Server) EndFollows(ctx context.Context, ready func()) error {
	ready()
	<-ctx.Done()
	s.stoppingOnce.Do(func() { close(s.stopping) })
	return nil
}

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

// logBatch is the most lines sent in one StreamLogs message.
const logBatch = 256

// StreamLogs sends the lines kept of the selected containers and, with follow, the new ones
// until the client goes or the cell holds none of them any more. A follower that falls behind
// loses lines; it is told how many by a CELL line.
func (s *Server) StreamLogs(req *repv1.StreamLogsRequest, stream repv1.RepService_StreamLogsServer) error {
	f := logs.Filter{ProcessGuid: req.GetProcessGuid(), Index: req.GetIndex(), AnyIndex: req.Index == nil, TaskGuid: req.GetTaskGuid()}
	if !s.cell.Holds(f) && !s.logs.Known(f) {
		return rpcerr.NotFound("%s: no container and no logs on this cell", f)
	}
	var since time.Time
	if req.GetSince() != nil {
		since = req.GetSince().AsTime()
	}
	tail := -1
	if req.Tail != nil {
		tail = int(req.GetTail())
	}
	if !req.GetFollow() {
		lines, err := s.logs.Read(f, since, tail)
		if err != nil {
			return err
		}
		return sendLines(stream, lines)
	}
	lines, sub, err := s.logs.Follow(f, since, tail)
	if err != nil {
		return err
	}
	defer sub.Close()
	if err := sendLines(stream, lines); err != nil {
		return err
	}
	live := func() bool { return s.cell.Holds(f) || s.logs.OpenFor(f) }
	if !live() {
		return nil
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-s.stopping:
			return nil
		case <-sub.Ended():
			if !live() {
				// The lines written before the close are already queued on the subscription.
				for {
					select {
					case lines := <-sub.Lines():
						if err := sendLines(stream, lines); err != nil {
							return err
						}
					default:
						return nil
					}
				}
			}
		case lines := <-sub.Lines():
			if n := sub.Dropped(); n > 0 {
				lines = append([]logs.Line{{Time: time.Now().UTC(), Source: logs.SourceCell, Stream: logs.Stdout,
					Text: fmt.Sprintf("%d lines dropped: this reader fell behind", n)}}, lines...)
			}
			if err := sendLines(stream, lines); err != nil {
				return err
			}
		}
	}
}

// sendLines sends lines in batches of at most logBatch.
func sendLines(stream repv1.RepService_StreamLogsServer, lines []logs.Line) error {
	for len(lines) > 0 {
		n := min(len(lines), logBatch)
		resp := &repv1.StreamLogsResponse{Lines: make([]*repv1.LogLine, n)}
		for i, l := range lines[:n] {
			st := repv1.LogStream_LOG_STREAM_STDOUT
			if l.Stream == logs.Stderr {
				st = repv1.LogStream_LOG_STREAM_STDERR
			}
			resp.Lines[i] = &repv1.LogLine{Timestamp: timestamppb.New(l.Time), Source: l.Source, Index: l.Index,
				InstanceGuid: l.InstanceGuid, Stream: st, Text: l.Text}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		lines = lines[n:]
	}
	return nil
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
	case *repv1.StreamLogsRequest:
		checkStreamLogs(e, r)
	case *repv1.InstanceMetricsRequest:
		checkSelection(e, r.GetProcessGuid(), r.Index, r.GetTaskGuid())
	case *repv1.ExecRequest:
		CheckExecStart(e, r.GetStart())
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

func checkStreamLogs(e *rpcerr.InvalidError, r *repv1.StreamLogsRequest) {
	checkSelection(e, r.GetProcessGuid(), r.Index, r.GetTaskGuid())
	if r.Tail != nil && r.GetTail() < 0 {
		e.Add("tail", "must not be negative, got %d", r.GetTail())
	}
	if r.Since != nil {
		if err := r.GetSince().CheckValid(); err != nil {
			e.Add("since", "is not a valid timestamp: %v", err)
		} else if t := r.GetSince().AsTime(); t.After(time.Now()) {
			e.Add("since", "must not be in the future, got %s", t.Format(time.RFC3339Nano))
		}
	}
}

// checkSelection checks a selection of an LRP's instances (all, or one index) or of a task.
func checkSelection(e *rpcerr.InvalidError, processGuid string, index *int32, taskGuid string) {
	switch {
	case processGuid != "" && taskGuid != "":
		e.Add("task_guid", "must be empty when process_guid is set")
	case taskGuid != "":
		e.Merge("task_guid", models.ValidateGuid("task_guid", taskGuid))
		if index != nil {
			e.Add("index", "applies to process_guid only")
		}
	default:
		e.Merge("process_guid", models.ValidateGuid("process_guid", processGuid))
	}
	if index != nil && *index < 0 {
		e.Add("index", "must not be negative, got %d", *index)
	}
}
