package api

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/logs"
)

// InstanceMetrics answers the latest resource sample of the selected containers; NotFound
// when the cell holds none of them.
func (s *Server) InstanceMetrics(_ context.Context, req *repv1.InstanceMetricsRequest) (*repv1.InstanceMetricsResponse, error) {
	f := logs.Filter{ProcessGuid: req.GetProcessGuid(), Index: req.GetIndex(), AnyIndex: req.Index == nil, TaskGuid: req.GetTaskGuid()}
	ms := s.cell.ContainerMetrics(f, false)
	if len(ms) == 0 {
		return nil, rpcerr.NotFound("%s: no container on this cell", f)
	}
	return &repv1.InstanceMetricsResponse{Containers: ms}, nil
}

// MaxExecCommandArgs bounds an exec's command line.
const MaxExecCommandArgs = 256

// CheckExecStart checks the first message of an exec stream (the rep's and the BBS's).
func CheckExecStart(e *rpcerr.InvalidError, st *repv1.ExecStart) {
	if st == nil {
		e.Add("start", "is required in the first message")
		return
	}
	e.Merge("start.process_guid", models.ValidateGuid("start.process_guid", st.GetProcessGuid()))
	if st.GetIndex() < 0 {
		e.Add("start.index", "must not be negative, got %d", st.GetIndex())
	}
	switch n := len(st.GetCommand()); {
	case n == 0 || st.GetCommand()[0] == "":
		e.Add("start.command", "is required: the program and its arguments")
	case n > MaxExecCommandArgs:
		e.Add("start.command", "has %d words, at most %d", n, MaxExecCommandArgs)
	}
}

// Exec runs a command in a running instance: the first message names it (validated), the
// first answer names the container, output follows as it comes, and the last answer carries
// the exit code. The client's end of the stream (or close_stdin) ends the command's input;
// the client going away kills the command.
func (s *Server) Exec(stream repv1.RepService_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	st := first.GetStart()
	guid, target, err := s.cell.ExecTarget(st.GetProcessGuid(), st.GetIndex())
	if err != nil {
		return err
	}
	out := &execSender{stream: stream}
	if err := out.send(&repv1.ExecResponse{InstanceGuid: guid}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	stdin, stdinW := io.Pipe()
	defer stdin.Close()
	resize := make(chan executor.TerminalSize, 1)
	applied := make(chan struct{}, 1)
	go func() {
		// Client messages: stdin, resizes, the end of input. A broken stream kills the command.
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				_ = stdinW.Close()
				return
			}
			if err != nil {
				_ = stdinW.CloseWithError(err)
				cancel()
				return
			}
			if sz := m.GetResize(); sz != nil {
				select {
				case <-resize: // only the latest size matters
				default:
				}
				select {
				case <-applied:
				default:
				}
				resize <- terminalSize(sz)
				if st.GetTty() {
					// The stream's order holds: what is typed after a resize meets the new
					// size (`stty size` answers it), so the next message waits until it is set.
					waitApplied(ctx, applied)
				}
			}
			if len(m.GetStdin()) > 0 {
				if _, err := stdinW.Write(m.GetStdin()); err != nil {
					return // the command's input is closed
				}
			}
			if m.GetCloseStdin() {
				_ = stdinW.Close()
			}
		}
	}()
	code, err := target.Exec(ctx, executor.ExecSpec{
		Command: st.GetCommand(),
		TTY:     st.GetTty(),
		Size:    terminalSize(st.GetSize()),
		Stdin:   stdin,
		Stdout:  out.writer(false),
		Stderr:  out.writer(true),
		Resize:  resize,
		ResizeApplied: func() {
			select {
			case applied <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		return rpcerr.FailedPrecondition("instance %s/%d: %v", st.GetProcessGuid(), st.GetIndex(), err)
	}
	return out.send(&repv1.ExecResponse{ExitCode: proto.Int32(int32(code))})
}

// resizeOrderWait bounds how long an exec stream's next message waits for a resize to be set
// (the command may still be starting, or have ended and set no size any more).
const resizeOrderWait = 5 * time.Second

// waitApplied waits until applied signals, ctx ends or resizeOrderWait passes.
func waitApplied(ctx context.Context, applied <-chan struct{}) {
	t := time.NewTimer(resizeOrderWait)
	defer t.Stop()
	select {
	case <-applied:
	case <-ctx.Done():
	case <-t.C:
	}
}

// terminalSize converts a TerminalSize message (nil: no size).
func terminalSize(sz *repv1.TerminalSize) executor.TerminalSize {
	return executor.TerminalSize{Rows: uint16(min(sz.GetRows(), 0xffff)), Cols: uint16(min(sz.GetCols(), 0xffff))}
}

// execSender serialises an exec stream's sends (stdout and stderr are copied concurrently).
type execSender struct {
	mu     sync.Mutex
	stream repv1.RepService_ExecServer
}

func (s *execSender) send(m *repv1.ExecResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stream.Send(m)
}

// writer is an io.Writer sending what it is given as stdout (or stderr).
func (s *execSender) writer(stderr bool) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		b := append([]byte(nil), p...)
		m := &repv1.ExecResponse{Stdout: b}
		if stderr {
			m = &repv1.ExecResponse{Stderr: b}
		}
		if err := s.send(m); err != nil {
			return 0, err
		}
		return len(p), nil
	})
}

// writerFunc is a function as an io.Writer.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
