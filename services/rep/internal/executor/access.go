package executor

import (
	"context"
	"io"
	"io/fs"
	"path/filepath"
	"syscall"
	"time"
)

// Usage is a container's resource use at one moment, as its backend measures it.
type Usage struct {
	// CPU is the CPU time the container's processes have used since it started (user and
	// system, every process, the exited ones included where the backend can count them).
	CPU time.Duration
	// MemoryBytes is the memory in use: the cgroup's usage, or the resident set of the
	// container's processes.
	MemoryBytes uint64
	// DiskBytes is what the container has written: its directory or writable layer.
	DiskBytes uint64
}

// Measurable is a Container that reports its resource use; the cell samples it every sample
// interval. A container that does not implement it is reported without samples.
type Measurable interface {
	// Usage measures the container now.
	Usage(ctx context.Context) (Usage, error)
}

// TerminalSize is a pseudo-terminal's size in characters.
type TerminalSize struct {
	// Rows is the number of lines; Cols the number of columns.
	Rows, Cols uint16
}

// ExecSpec is a command to run in a running container.
type ExecSpec struct {
	// Command is the program and its arguments; the program is looked up in the container's
	// PATH.
	Command []string
	// TTY runs the command on a pseudo-terminal; Stderr is then unused.
	TTY bool
	// Size is the terminal's initial size (with TTY).
	Size TerminalSize
	// Stdin is the command's input; nil gives it none. Stdin must return when it is closed.
	Stdin io.Reader
	// Stdout and Stderr receive its output.
	Stdout, Stderr io.Writer
	// Resize carries the terminal's new sizes (with TTY); nil when it never changes.
	Resize <-chan TerminalSize
	// ResizeApplied, when not nil, is called once each size from Resize is set, so that the
	// caller can keep the order of a stream: input sent after a resize meets the new size.
	ResizeApplied func()
}

// Execer is a Container that can run further commands in itself, with its root filesystem,
// user, environment and limits: `gavel exec`.
type Execer interface {
	// Exec runs spec to its end and returns its exit code (128+n when killed by signal n). It
	// fails when the command cannot be started (e.g. not found in PATH); when ctx ends the
	// command is killed.
	Exec(ctx context.Context, spec ExecSpec) (int, error)
}

// DirSize is the disk the regular files under dir take (their allocated blocks), stopping
// early when ctx ends: a container's disk use for the backends that measure a directory.
func DirSize(ctx context.Context, dir string) uint64 {
	var total uint64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // vanished or unreadable: count what can be read
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				total += uint64(st.Blocks) * 512
			} else {
				total += uint64(info.Size())
			}
		}
		return nil
	})
	return total
}

// FollowResize applies every size spec.Resize carries until it is closed or stop is closed,
// in a goroutine of its own; it does nothing without a TTY or a resize channel.
func (spec ExecSpec) FollowResize(stop <-chan struct{}, apply func(TerminalSize)) {
	if !spec.TTY || spec.Resize == nil {
		return
	}
	go func() {
		for {
			select {
			case sz, ok := <-spec.Resize:
				if !ok {
					return
				}
				apply(sz)
				if spec.ResizeApplied != nil {
					spec.ResizeApplied()
				}
			case <-stop:
				return
			}
		}
	}()
}
