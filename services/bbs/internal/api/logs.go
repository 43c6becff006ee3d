package api

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

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

// StreamLogs implements bbsv1.BBSServiceServer (the request is validated by the validate
// package's interceptor, as every request is): it finds the cells that hold the selected
// containers, opens each one's log stream, and forwards their batches as they come. The BBS
// keeps no lines: a slow client slows only its own streams.
func (s *Server) StreamLogs(r *bbsv1.StreamLogsRequest, stream grpc.ServerStreamingServer[bbsv1.StreamLogsResponse]) error {
	if s.logs == nil {
		return rpcerr.FailedPrecondition("this BBS does not proxy logs")
	}
	cellIDs := s.selectedCells(r.GetProcessGuid(), r.Index, r.GetTaskGuid())
	if len(cellIDs) == 0 {
		return rpcerr.NotFound("%s is on no cell", selectionName(r.GetProcessGuid(), r.Index, r.GetTaskGuid()))
	}
	byID := s.presentCells()
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	req := &repv1.StreamLogsRequest{ProcessGuid: r.GetProcessGuid(), Index: r.Index, TaskGuid: r.GetTaskGuid(),
		Tail: r.Tail, Since: r.GetSince(), Follow: r.GetFollow()}
	type batch struct {
		resp *bbsv1.StreamLogsResponse
		err  error
		done bool
	}
	out := make(chan batch)
	open := 0
	for _, id := range cellIDs {
		cell := byID[id]
		if cell == nil {
			continue // the cell is gone: its containers' lines went with it
		}
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
	if open == 0 {
		return rpcerr.Unavailable("no cell holding the selected containers is present")
	}
	var errs []error
	for open > 0 {
		var b batch
		select {
		case b = <-out:
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
	if len(errs) == len(cellIDs) {
		return errors.Join(errs...) // no cell answered
	}
	return nil
}
