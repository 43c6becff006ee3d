package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// LogSource opens a cell's log stream (the rep's StreamLogs, with the BBS's identity).
type LogSource interface {
	StreamLogs(ctx context.Context, cell *modelsv1.CellPresence, req *repv1.StreamLogsRequest) (grpc.ServerStreamingClient[repv1.StreamLogsResponse], error)
}

// Option configures the API.
type Option func(*Server)

// WithLogs proxies StreamLogs to the cells through l; without it StreamLogs is Unimplemented.
func WithLogs(l LogSource) Option { return func(s *Server) { s.logs = l } }

// followRecheck is how often a following StreamLogs looks for cells that came to hold a
// selected container (an instance placed or moved there) and opens their streams too.
const followRecheck = time.Second

// StreamLogs implements bbsv1.BBSServiceServer (the request is validated by the validate
// package's interceptor, as every request is): it finds the cells that hold the selected
// containers, opens each one's log stream, and forwards their batches as they come. While
// following it also opens, every followRecheck, the stream of any cell that has come to hold a
// selected container since (an instance that moved there), from the start of the follow; it
// ends once every stream it opened has ended. The BBS keeps no lines: a slow client slows only
// its own streams.
func (s *Server) StreamLogs(r *bbsv1.StreamLogsRequest, stream grpc.ServerStreamingServer[bbsv1.StreamLogsResponse]) error {
	if s.logs == nil {
		return rpcerr.FailedPrecondition("this BBS does not proxy logs")
	}
	cellIDs := s.selectedCells(r.GetProcessGuid(), r.Index, r.GetTaskGuid())
	if len(cellIDs) == 0 {
		return rpcerr.NotFound("%s is on no cell", selectionName(r.GetProcessGuid(), r.Index, r.GetTaskGuid()))
	}
	started := time.Now()
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	req := &repv1.StreamLogsRequest{ProcessGuid: r.GetProcessGuid(), Index: r.Index, TaskGuid: r.GetTaskGuid(),
		Tail: r.Tail, Since: r.GetSince(), Follow: r.GetFollow()}
	// A cell found later sends what it captured since the follow started (or since, if later).
	later := &repv1.StreamLogsRequest{ProcessGuid: r.GetProcessGuid(), Index: r.Index, TaskGuid: r.GetTaskGuid(),
		Since: timestamppb.New(started), Follow: true}
	if r.GetSince() != nil && r.GetSince().AsTime().After(started) {
		later.Since = r.GetSince()
	}
	type batch struct {
		resp *bbsv1.StreamLogsResponse
		err  error
		done bool
	}
	out := make(chan batch)
	opened := map[string]bool{}
	open := 0
	openCell := func(id string, cell *modelsv1.CellPresence, req *repv1.StreamLogsRequest) {
		opened[id] = true
		open++
		go func() {
			send := func(b batch) bool {
				select {
				case out <- b:
					return true
				case <-ctx.Done():
					return false
				}
			}
			rs, err := s.logs.StreamLogs(ctx, cell, req)
			if err != nil {
				send(batch{err: fmt.Errorf("logs of cell %s: %w", id, err), done: true})
				return
			}
			for {
				m, err := rs.Recv()
				if err != nil {
					if errors.Is(err, io.EOF) {
						err = nil
					}
					send(batch{err: err, done: true})
					return
				}
				if !send(batch{resp: &bbsv1.StreamLogsResponse{Lines: m.GetLines(), CellId: id}}) {
					return
				}
			}
		}()
	}
	byID := s.presentCells()
	for _, id := range cellIDs {
		if cell := byID[id]; cell != nil {
			openCell(id, cell, req) // a cell that is gone took its containers' lines with it
		}
	}
	if open == 0 {
		return rpcerr.Unavailable("no cell holding the selected containers is present")
	}
	var recheck <-chan time.Time
	if r.GetFollow() {
		t := time.NewTicker(followRecheck)
		defer t.Stop()
		recheck = t.C
	}
	var errs []error
	for open > 0 {
		var b batch
		select {
		case b = <-out:
		case <-recheck:
			byID := s.presentCells()
			for _, id := range s.selectedCells(r.GetProcessGuid(), r.Index, r.GetTaskGuid()) {
				if cell := byID[id]; cell != nil && !opened[id] {
					openCell(id, cell, later)
				}
			}
			continue
		case <-ctx.Done():
			return ctx.Err() // the client went (the cells' streams end with it)
		}
		if b.done {
			open--
			if b.err != nil {
				errs = append(errs, b.err)
			}
			continue
		}
		if err := stream.Send(b.resp); err != nil {
			return err
		}
	}
	if len(errs) == len(opened) {
		return errors.Join(errs...) // no cell answered
	}
	return nil
}
