package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/authz"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// InstanceAccess reaches a cell's containers (the rep's InstanceMetrics and Exec, with the
// BBS's identity).
type InstanceAccess interface {
	InstanceMetrics(ctx context.Context, cell *modelsv1.CellPresence, req *repv1.InstanceMetricsRequest) (*repv1.InstanceMetricsResponse, error)
	Exec(ctx context.Context, cell *modelsv1.CellPresence) (grpc.BidiStreamingClient[repv1.ExecRequest, repv1.ExecResponse], error)
}

// WithInstanceAccess proxies InstanceMetrics and Exec to the cells through a, writing one
// audit line to audit per exec (who, which instance, what command, and how it ended); without
// it both are FailedPrecondition.
func WithInstanceAccess(a InstanceAccess, audit hclog.Logger) Option {
	return func(s *Server) {
		s.access = a
		s.audit = audit
	}
}

// metricsCallTimeout bounds one cell's answer to InstanceMetrics.
const metricsCallTimeout = 5 * time.Second

// InstanceMetrics implements bbsv1.BBSServiceServer: it asks every cell holding a selected
// container for its latest samples, at once, and answers what they said, naming the cells
// that did not answer. NotFound when no cell holds one; Unavailable when none answered.
func (s *Server) InstanceMetrics(ctx context.Context, r *bbsv1.InstanceMetricsRequest) (*bbsv1.InstanceMetricsResponse, error) {
	if s.access == nil {
		return nil, rpcerr.FailedPrecondition("this BBS does not reach cells")
	}
	cellIDs := s.selectedCells(r.GetProcessGuid(), r.Index, r.GetTaskGuid())
	if len(cellIDs) == 0 {
		return nil, rpcerr.NotFound("%s is on no cell", selectionName(r.GetProcessGuid(), r.Index, r.GetTaskGuid()))
	}
	byID := s.presentCells()
	req := &repv1.InstanceMetricsRequest{ProcessGuid: r.GetProcessGuid(), Index: r.Index, TaskGuid: r.GetTaskGuid()}
	var (
		mu   sync.Mutex
		resp = &bbsv1.InstanceMetricsResponse{}
		errs []error
		wg   sync.WaitGroup
	)
	for _, id := range cellIDs {
		cell := byID[id]
		if cell == nil {
			mu.Lock()
			resp.Unreachable = append(resp.Unreachable, id)
			errs = append(errs, fmt.Errorf("cell %s is not present", id))
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, metricsCallTimeout)
			defer cancel()
			m, err := s.access.InstanceMetrics(cctx, cell, req)
			mu.Lock()
			defer mu.Unlock()
			if status.Code(err) == codes.NotFound {
				return // the cell let the containers go meanwhile
			}
			if err != nil {
				resp.Unreachable = append(resp.Unreachable, id)
				errs = append(errs, fmt.Errorf("cell %s: %w", id, err))
				return
			}
			for _, c := range m.GetContainers() {
				c.CellId = id
			}
			resp.Containers = append(resp.Containers, m.GetContainers()...)
		}()
	}
	wg.Wait()
	if len(resp.Containers) == 0 && len(errs) > 0 {
		return nil, rpcerr.Unavailable("no cell holding %s answered: %v", selectionName(r.GetProcessGuid(), r.Index, r.GetTaskGuid()), errors.Join(errs...))
	}
	if len(resp.Containers) == 0 {
		return nil, rpcerr.NotFound("%s is on no cell", selectionName(r.GetProcessGuid(), r.Index, r.GetTaskGuid()))
	}
	sort.Slice(resp.Containers, func(i, j int) bool {
		a, b := resp.Containers[i], resp.Containers[j]
		if a.GetIndex() != b.GetIndex() {
			return a.GetIndex() < b.GetIndex()
		}
		return a.GetInstanceGuid() < b.GetInstanceGuid()
	})
	sort.Strings(resp.Unreachable)
	return resp, nil
}

// Exec implements bbsv1.BBSServiceServer: it finds the cell running the instance the first
// message names, audits the exec, opens the rep's Exec and forwards messages both ways until
// the command ends (its exit code is the last answer) or either side goes. NotFound for an
// unknown LRP or index, FailedPrecondition for an instance that is not running.
func (s *Server) Exec(stream grpc.BidiStreamingServer[bbsv1.ExecRequest, bbsv1.ExecResponse]) error {
	if s.access == nil {
		return rpcerr.FailedPrecondition("this BBS does not reach cells")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	st := first.GetStart()
	inst, err := s.runningInstance(st.GetProcessGuid(), st.GetIndex())
	if err != nil {
		return err
	}
	cellID := inst.GetInstanceKey().GetCellId()
	cell := s.presentCells()[cellID]
	if cell == nil {
		return rpcerr.Unavailable("instance %s/%d: its cell %s is not present", st.GetProcessGuid(), st.GetIndex(), cellID)
	}
	caller, _ := authz.CallerFrom(stream.Context())
	auditFields := []any{"identity", caller.Identity, "role", caller.Role.String(), "call", "Exec",
		"process_guid", st.GetProcessGuid(), "index", st.GetIndex(), "instance_guid", inst.GetInstanceKey().GetInstanceGuid(),
		"cell_id", cellID, "command", quoteCommand(st.GetCommand()), "tty", st.GetTty()}
	s.audit.Info("exec", auditFields...)

	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	rs, err := s.access.Exec(ctx, cell)
	if err != nil {
		return fmt.Errorf("exec on cell %s: %w", cellID, err)
	}
	if err := rs.Send(&repv1.ExecRequest{Start: st}); err != nil {
		if errors.Is(err, io.EOF) {
			// The rep ended the stream already (a refusal): its status is on Recv.
			if _, rerr := rs.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
				err = rerr
			}
		}
		return fmt.Errorf("exec on cell %s: %w", cellID, err)
	}
	// Client → rep: stdin, resizes, the end of input.
	go func() {
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				_ = rs.CloseSend()
				return
			}
			if err != nil {
				cancel()
				return
			}
			if err := rs.Send(&repv1.ExecRequest{Stdin: m.GetStdin(), Resize: m.GetResize(), CloseStdin: m.GetCloseStdin()}); err != nil {
				return // the rep's stream ended; its Recv below says how
			}
		}
	}()
	// Rep → client: output, then the exit code.
	firstOut := true
	for {
		m, err := rs.Recv()
		if errors.Is(err, io.EOF) {
			s.audit.Info("exec ended", append(auditFields, "outcome", "no exit code")...)
			return rpcerr.Unavailable("exec on cell %s ended without an exit code", cellID)
		}
		if err != nil {
			s.audit.Info("exec ended", append(auditFields, "outcome", status.Code(err).String())...)
			return err
		}
		out := &bbsv1.ExecResponse{Stdout: m.GetStdout(), Stderr: m.GetStderr(), ExitCode: m.ExitCode, InstanceGuid: m.GetInstanceGuid()}
		if firstOut {
			out.CellId, firstOut = cellID, false
		}
		if err := stream.Send(out); err != nil {
			return err
		}
		if m.ExitCode != nil {
			s.audit.Info("exec ended", append(auditFields, "exit_code", m.GetExitCode())...)
			return nil
		}
	}
}

// runningInstance is the RUNNING (ordinary, else evacuating) actual LRP of processGuid/index:
// NotFound when the LRP or the index is unknown, FailedPrecondition when it does not run.
func (s *Server) runningInstance(processGuid string, index int32) (*modelsv1.ActualLRP, error) {
	actual, _ := s.cache.ActualLRPs(store.ListFilter{Guids: map[string]struct{}{processGuid: {}}, Index: &index})
	if len(actual) == 0 {
		if d, _ := s.cache.DesiredLRPs(store.ListFilter{Guids: map[string]struct{}{processGuid: {}}}); len(d) == 0 {
			return nil, rpcerr.NotFound("desired lrp %q not found", processGuid)
		}
		return nil, rpcerr.NotFound("desired lrp %q has no instance at index %d", processGuid, index)
	}
	var best *modelsv1.ActualLRP
	for _, a := range actual {
		if a.GetState() != modelsv1.ActualLRP_STATE_RUNNING {
			continue
		}
		if best == nil || a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
			best = a
		}
	}
	if best == nil {
		return nil, rpcerr.FailedPrecondition("instance %s/%d is not running (it is %s)", processGuid, index,
			strings.ToLower(strings.TrimPrefix(actual[0].GetState().String(), "STATE_")))
	}
	return best, nil
}

// presentCells are the present cells by id.
func (s *Server) presentCells() map[string]*modelsv1.CellPresence {
	present, _ := s.cache.Cells()
	byID := make(map[string]*modelsv1.CellPresence, len(present))
	for _, c := range present {
		byID[c.GetCellId()] = c
	}
	return byID
}

// selectedCells are the cells that hold (or last held) the containers of an LRP's instances
// (all, or one index) or of a task, sorted.
func (s *Server) selectedCells(processGuid string, index *int32, taskGuid string) []string {
	ids := map[string]bool{}
	if taskGuid != "" {
		tasks, _ := s.cache.Tasks(store.ListFilter{Guids: map[string]struct{}{taskGuid: {}}})
		for _, t := range tasks {
			if t.GetCellId() != "" {
				ids[t.GetCellId()] = true
			}
		}
	} else {
		actual, _ := s.cache.ActualLRPs(store.ListFilter{Guids: map[string]struct{}{processGuid: {}}, Index: index})
		for _, a := range actual {
			if id := a.GetInstanceKey().GetCellId(); id != "" {
				ids[id] = true
			}
		}
	}
	out := make([]string, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// selectionName names a selection for errors.
func selectionName(processGuid string, index *int32, taskGuid string) string {
	switch {
	case taskGuid != "":
		return fmt.Sprintf("task %q", taskGuid)
	case index != nil:
		return fmt.Sprintf("instance %s/%d", processGuid, *index)
	default:
		return fmt.Sprintf("desired lrp %q", processGuid)
	}
}

// quoteCommand renders a command line for the audit log, quoting words that need it.
func quoteCommand(words []string) string {
	out := make([]string, len(words))
	for i, w := range words {
		if w == "" || strings.ContainsAny(w, " \t\n\"'\\$`") {
			w = strconv.Quote(w)
		}
		out[i] = w
	}
	return strings.Join(out, " ")
}
