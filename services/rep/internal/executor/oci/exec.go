package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

var _ executor.Execer = (*container)(nil)

// execSeq numbers a rep's execs, for their containerd process ids.
var execSeq atomic.Uint64

// Exec implements executor.Execer with a containerd exec process: it enters the container's
// namespaces and cgroup and runs as the container's process does (its user, environment,
// working directory, capabilities and limits), with the command in place of its arguments and,
// with TTY, on a terminal the shim allocates.
func (c *container) Exec(ctx context.Context, spec executor.ExecSpec) (int, error) {
	if len(spec.Command) == 0 || spec.Command[0] == "" {
		return 0, errors.New("exec: empty command")
	}
	cctx := c.b.ctx(ctx)
	var proc specs.Process
	if c.tree {
		// A tree's init is its init program: the command runs as a run action without a user.
		p, err := ProcessSpec(c.spec, &modelsv1.RunAction{Path: spec.Command[0]}, c.procCfg)
		if err != nil {
			return 0, fmt.Errorf("exec: %w", err)
		}
		proc = *p
	} else {
		ociSpec, err := c.ctr.Spec(cctx)
		if err != nil {
			return 0, fmt.Errorf("exec: container spec: %w", err)
		}
		proc = *ociSpec.Process
	}
	proc.Args = spec.Command
	proc.Terminal = spec.TTY
	proc.ConsoleSize = nil
	var in io.Reader = spec.Stdin
	if in == nil {
		in = strings.NewReader("")
	}
	stdin := &stdinCloser{r: in, started: make(chan struct{})}
	defer stdin.start(nil) // releases a reader at its end when the process did not start
	opts := []cio.Opt{cio.WithStreams(stdin, spec.Stdout, spec.Stderr), cio.WithFIFODir(filepath.Join(c.dir, "fifo"))}
	if spec.TTY {
		opts = append(opts, cio.WithTerminal)
	}
	id := fmt.Sprintf("exec-%d", execSeq.Add(1))
	// Once created, the process is the executor's to end: its containerd calls do not follow
	// the caller's context (a caller leaving during Start would leave a process nobody waits
	// for, and its I/O copiers holding the shim); the caller leaving kills it instead.
	bg := c.b.ctx(context.Background())
	p, err := c.task.Exec(cctx, id, &proc, cio.NewCreator(opts...))
	if err != nil {
		return 0, fmt.Errorf("exec %s: %w", spec.Command[0], err)
	}
	drained := false
	defer func() {
		// Delete waits for the I/O copiers: they are drained and closed first (a process that
		// did not start has nothing to copy).
		if !drained {
			drainIO(p.IO())
		}
		dctx, cancel := context.WithTimeout(bg, execDeleteTimeout)
		defer cancel()
		_, _ = p.Delete(dctx)
	}()
	exited, err := p.Wait(bg)
	if err != nil {
		return 0, fmt.Errorf("exec %s: wait: %w", spec.Command[0], err)
	}
	if err := p.Start(bg); err != nil {
		return 0, fmt.Errorf("exec %s: %w", spec.Command[0], err)
	}
	if !spec.TTY { // with a terminal the end of input is the terminal's EOF character
		stdin.start(func() { _ = p.CloseIO(bg, client.WithStdinCloser) })
	}
	if spec.TTY && spec.Size.Rows > 0 && spec.Size.Cols > 0 {
		_ = p.Resize(bg, uint32(spec.Size.Cols), uint32(spec.Size.Rows))
	}
	done := make(chan struct{})
	defer close(done)
	spec.FollowResize(done, func(sz executor.TerminalSize) { _ = p.Resize(bg, uint32(sz.Cols), uint32(sz.Rows)) })
	var st client.ExitStatus
	select {
	case st = <-exited:
	case <-ctx.Done():
		_ = p.Kill(bg, 9)
		st = <-exited
	}
	drainIO(p.IO()) // the output copied, within a bound
	drained = true
	code, _, err := st.Result()
	if err != nil && ctx.Err() == nil {
		return 0, fmt.Errorf("exec %s: %w", spec.Command[0], err)
	}
	return int(code), nil
}

// execDeleteTimeout bounds containerd's deletion of an exec process.
const execDeleteTimeout = 10 * time.Second

// stdinCloser is an exec's input as the shim's FIFO copier reads it. The shim holds the
// process's stdin open after the FIFO's writer is gone, so the process sees the end of its
// input only once the shim is told (CloseIO): stdinCloser does that when its reader ends,
// once the process has started (the shim refuses CloseIO before).
type stdinCloser struct {
	r       io.Reader
	once    sync.Once
	started chan struct{} // closed by start
	closeIO func()        // set by start; nil when the process did not start
	ended   sync.Once
}

// start records how to close the started process's stdin (nil: it did not start) and
// releases a Read waiting for it; only the first call counts.
func (s *stdinCloser) start(closeIO func()) {
	s.once.Do(func() {
		s.closeIO = closeIO
		close(s.started)
	})
}

// Read implements io.Reader; at the end of the input it closes the process's stdin.
func (s *stdinCloser) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if errors.Is(err, io.EOF) {
		s.ended.Do(func() {
			<-s.started
			if s.closeIO != nil {
				s.closeIO()
			}
		})
	}
	return n, err
}
