package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/containerd/containerd/v2/pkg/cio"

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
	ociSpec, err := c.ctr.Spec(cctx)
	if err != nil {
		return 0, fmt.Errorf("exec: container spec: %w", err)
	}
	proc := *ociSpec.Process
	proc.Args = spec.Command
	proc.Terminal = spec.TTY
	proc.ConsoleSize = nil
	var stdin io.Reader = spec.Stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	opts := []cio.Opt{cio.WithStreams(stdin, spec.Stdout, spec.Stderr), cio.WithFIFODir(filepath.Join(c.dir, "fifo"))}
	if spec.TTY {
		opts = append(opts, cio.WithTerminal)
	}
	id := fmt.Sprintf("exec-%d", execSeq.Add(1))
	p, err := c.task.Exec(cctx, id, &proc, cio.NewCreator(opts...))
	if err != nil {
		return 0, fmt.Errorf("exec %s: %w", spec.Command[0], err)
	}
	defer func() { _, _ = p.Delete(c.b.ctx(context.Background())) }()
	exited, err := p.Wait(cctx)
	if err != nil {
		return 0, fmt.Errorf("exec %s: wait: %w", spec.Command[0], err)
	}
	if err := p.Start(cctx); err != nil {
		return 0, fmt.Errorf("exec %s: %w", spec.Command[0], err)
	}
	if spec.TTY && spec.Size.Rows > 0 && spec.Size.Cols > 0 {
		_ = p.Resize(cctx, uint32(spec.Size.Cols), uint32(spec.Size.Rows))
	}
	done := make(chan struct{})
	defer close(done)
	if spec.TTY && spec.Resize != nil {
		go func() {
			for {
				select {
				case sz, ok := <-spec.Resize:
					if !ok {
						return
					}
					_ = p.Resize(cctx, uint32(sz.Cols), uint32(sz.Rows))
				case <-done:
					return
				}
			}
		}()
	}
	select {
	case st := <-exited:
		p.IO().Wait() // the output copied
		code, _, err := st.Result()
		if err != nil {
			return 0, fmt.Errorf("exec %s: %w", spec.Command[0], err)
		}
		return int(code), nil
	case <-ctx.Done():
		_ = p.Kill(c.b.ctx(context.Background()), 9)
		st := <-exited
		code, _, _ := st.Result()
		return int(code), nil
	}
}
