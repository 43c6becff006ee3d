package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

var _ executor.Execer = (*container)(nil)

// execOutputGrace is how long an exec's output is still read once its process has exited
// (a background child may hold the pipes or the terminal).
const execOutputGrace = time.Second

// Exec implements executor.Execer: the command runs as the container's processes do, with its
// environment, working directory, user, chroot and cgroup, in a process group of its own that
// a stop of the container kills with the rest. With TTY it runs as the leader of a new session
// on a fresh pseudo-terminal.
func (c *container) Exec(ctx context.Context, spec executor.ExecSpec) (int, error) {
	if len(spec.Command) == 0 || spec.Command[0] == "" {
		return 0, errors.New("exec: empty command")
	}
	cmd, err := c.command(&modelsv1.RunAction{Path: spec.Command[0], Args: spec.Command[1:]})
	if err != nil {
		return 0, err
	}
	cmd.WaitDelay = execOutputGrace
	var pty *os.File
	if spec.TTY {
		var tty *os.File
		pty, tty, err = openPTY()
		if err != nil {
			return 0, fmt.Errorf("exec: %w", err)
		}
		defer pty.Close()
		defer tty.Close()
		setSize(pty, spec.Size)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr.Setpgid = false
		cmd.SysProcAttr.Setsid = true
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
	} else {
		cmd.Stdout, cmd.Stderr = spec.Stdout, spec.Stderr
	}
	var stdin io.WriteCloser
	if !spec.TTY && spec.Stdin != nil {
		if stdin, err = cmd.StdinPipe(); err != nil {
			return 0, fmt.Errorf("exec: stdin: %w", err)
		}
	}

	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return 0, errors.New("exec: the container is stopping")
	}
	err = cmd.Start()
	if err == nil {
		c.live[cmd.Process.Pid] = struct{}{}
	}
	c.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("exec %s: %w", spec.Command[0], err)
	}
	pgid := cmd.Process.Pid
	defer func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // nothing of the exec outlives it
		c.mu.Lock()
		delete(c.live, pgid)
		c.mu.Unlock()
	}()

	var output sync.WaitGroup
	switch {
	case spec.TTY:
		// The child has its own copy of the terminal; the master reads EIO once it is gone.
		_ = cmd.Stdin.(*os.File).Close()
		output.Add(1)
		go func() {
			defer output.Done()
			_, _ = io.Copy(spec.Stdout, pty)
		}()
		if spec.Stdin != nil {
			go func() {
				_, _ = io.Copy(pty, spec.Stdin)
				_, _ = pty.Write([]byte{4}) // end of input: the terminal's EOF character
			}()
		}
		spec.FollowResize(ctx.Done(), func(sz executor.TerminalSize) { setSize(pty, sz) })
	case stdin != nil:
		go func() {
			_, _ = io.Copy(stdin, spec.Stdin)
			_ = stdin.Close()
		}()
	}

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-waited:
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		waitErr = <-waited
	}
	if spec.TTY {
		copied := make(chan struct{})
		go func() { output.Wait(); close(copied) }()
		select {
		case <-copied:
		case <-time.After(execOutputGrace):
		}
	}
	return exitCode(cmd, waitErr)
}

// exitCode is the exit status of a waited-for command, 128+n when signal n killed it.
func exitCode(cmd *exec.Cmd, waitErr error) (int, error) {
	st := cmd.ProcessState
	if st == nil {
		return 0, waitErr
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return st.ExitCode(), nil
}

// openPTY opens a new pseudo-terminal pair: the master (for the rep) and the terminal (for
// the command).
func openPTY() (pty, tty *os.File, err error) {
	pty, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open pseudo-terminal: %w", err)
	}
	var n int
	err = control(pty, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock pseudo-terminal: %w", err)
		}
		var err error
		n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN)
		return err
	})
	if err != nil {
		_ = pty.Close()
		return nil, nil, err
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		_ = pty.Close()
		return nil, nil, fmt.Errorf("open terminal: %w", err)
	}
	return pty, tty, nil
}

// setSize sets the terminal's size; a zero size leaves it.
func setSize(pty *os.File, sz executor.TerminalSize) {
	if sz.Rows == 0 || sz.Cols == 0 {
		return
	}
	_ = control(pty, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: sz.Rows, Col: sz.Cols})
	})
}

// control runs f on f's descriptor without taking it out of the runtime's poller.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var inner error
	if err := rc.Control(func(fd uintptr) { inner = fn(int(fd)) }); err != nil {
		return err
	}
	return inner
}
