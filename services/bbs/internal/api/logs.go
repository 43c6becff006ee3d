package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
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
	present := map[string]*modelsv1.CellPresence{}
	for _, id := range cellIDs {
		if cell := byID[id]; cell != nil {
			present[id] = cell // a cell that is gone took its containers' lines with it
		}
	}
	if len(present) == 0 {
		return rpcerr.Unavailable("no cell holding the selected containers is present")
	}
	follows := map[string]*repv1.StreamLogsRequest{}
	for id := range present {
		follows[id] = req
	}
	if r.Tail != nil && r.GetTail() > 0 && len(present) > 1 {
		// Each cell keeps its own lines: the last tail lines of the selection are read from
		// every cell, merged by time and cut to tail; a follow then goes on in each cell after
		// the last line it sent.
		var err error
		if follows, err = s.sendTail(ctx, stream, r, present); err != nil || !r.GetFollow() {
			return err
		}
	}
	for id, cell := range present {
		openCell(id, cell, follows[id])
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

// cellLine is a log line and the cell it came from.
type cellLine struct {
	line *repv1.LogLine
	cell string
}

// sendTail sends the last r.tail lines of the selection over the cells present (each cell
// sends at most that many, so the BBS holds at most tail lines per cell), in time order, and
// returns each cell's request to follow on from there: after the latest line it sent, or, for a
// cell that sent none, every line it captures from now on. A cell that does not answer is
// left out (followed from the start of the call); when none answers, that is the error.
func (s *Server) sendTail(ctx context.Context, stream grpc.ServerStreamingServer[bbsv1.StreamLogsResponse], r *bbsv1.StreamLogsRequest, present map[string]*modelsv1.CellPresence) (map[string]*repv1.StreamLogsRequest, error) {
	started := timestamppb.Now()
	type read struct {
		cell  string
		lines []*repv1.LogLine
		err   error
	}
	reads := make(chan read, len(present))
	for id, cell := range present {
		go func() {
			rs, err := s.logs.StreamLogs(ctx, cell, &repv1.StreamLogsRequest{ProcessGuid: r.GetProcessGuid(), Index: r.Index,
				TaskGuid: r.GetTaskGuid(), Tail: r.Tail, Since: r.GetSince()})
			var lines []*repv1.LogLine
			for err == nil {
				var m *repv1.StreamLogsResponse
				if m, err = rs.Recv(); err == nil {
					lines = append(lines, m.GetLines()...)
				}
			}
			if errors.Is(err, io.EOF) {
				err = nil
			}
			reads <- read{id, lines, err}
		}()
	}
	var (
		all  []cellLine
		errs []error
	)
	follows := make(map[string]*repv1.StreamLogsRequest, len(present))
	for range present {
		rd := <-reads
		follow := &repv1.StreamLogsRequest{ProcessGuid: r.GetProcessGuid(), Index: r.Index, TaskGuid: r.GetTaskGuid(), Follow: true}
		switch {
		case rd.err != nil:
			errs = append(errs, fmt.Errorf("logs of cell %s: %w", rd.cell, rd.err))
			follow.Since = started
		case len(rd.lines) > 0:
			// After the latest line sent (a cell's lines of several containers, or of one
			// container's stdout and stderr, are only nearly in time order: the latest is not
			// always the last, and resuming after the last could send a line twice).
			latest := rd.lines[0].GetTimestamp().AsTime()
			for _, l := range rd.lines[1:] {
				if t := l.GetTimestamp().AsTime(); t.After(latest) {
					latest = t
				}
			}
			follow.Since = timestamppb.New(latest.Add(time.Nanosecond))
		default:
			follow.Since = r.GetSince() // it had none: all it keeps from now on are new
		}
		follows[rd.cell] = follow
		for _, l := range rd.lines {
			all = append(all, cellLine{l, rd.cell})
		}
	}
	if len(errs) == len(present) {
		return nil, errors.Join(errs...)
	}
	slices.SortStableFunc(all, func(a, b cellLine) int {
		return a.line.GetTimestamp().AsTime().Compare(b.line.GetTimestamp().AsTime())
	})
	all = all[max(0, len(all)-int(r.GetTail())):]
	for len(all) > 0 {
		n := 1
		for n < len(all) && n < tailBatch && all[n].cell == all[0].cell {
			n++
		}
		resp := &bbsv1.StreamLogsResponse{CellId: all[0].cell, Lines: make([]*repv1.LogLine, n)}
		for i := range n {
			resp.Lines[i] = all[i].line
		}
		if err := stream.Send(resp); err != nil {
			return nil, err
		}
		all = all[n:]
	}
	return follows, nil
}

// tailBatch is the most lines of a merged tail sent in one message.
const tailBatch = 256
