package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gavel-sched/gavel/pkg/retry"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/actions"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/procout"
)

// maxReasonTail bounds the stderr tail added to a failed run action's reason.
const maxReasonTail = 200

// runAction runs one node of the action tree (package actions) and returns its failure, if
// any. The error's text is the reason reported in the container's Result.
func (c *container) runAction(ctx context.Context, a *modelsv1.Action) error {
	return c.tree().Run(ctx, a)
}

// tree is the action interpreter with the container's leaf steps.
func (c *container) tree() actions.Interpreter {
	return actions.Interpreter{Steps: steps{c}, Log: c.log}
}

// steps are a container's leaf steps: a host process, a download into its filesystem.
type steps struct{ c *container }

// Run implements actions.Steps.
func (s steps) Run(ctx context.Context, ra *modelsv1.RunAction) error { return s.c.runProcess(ctx, ra) }

// Download implements actions.Steps.
func (s steps) Download(ctx context.Context, d *modelsv1.DownloadAction) error {
	return s.c.download(ctx, d)
}

// runProcess runs a run action's process to its end. When ctx ends for another reason than
// a stop (which signals processes itself), the process group gets SIGTERM, then SIGKILL after
// the backend's kill grace.
func (c *container) runProcess(ctx context.Context, ra *modelsv1.RunAction) error {
	cmd, err := c.command(ra)
	if err != nil {
		return err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("run %s: stdout pipe: %w", ra.GetPath(), err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return fmt.Errorf("run %s: stderr pipe: %w", ra.GetPath(), err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW

	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		closeAll(outR, outW, errR, errW)
		return errStopped
	}
	cmd, err = startExec(cmd)
	if err == nil {
		c.live[cmd.Process.Pid] = struct{}{}
	}
	c.mu.Unlock()
	_ = outW.Close()
	_ = errW.Close()
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		return fmt.Errorf("run %s: %w", ra.GetPath(), err)
	}
	pgid := cmd.Process.Pid
	c.markStarted()

	source := ra.GetLogSource() // empty: the container's default source
	stderrTail := procout.NewTailBuffer(1 << 10)
	var copies sync.WaitGroup
	copies.Add(2)
	go func() {
		defer copies.Done()
		_, _ = io.Copy(c.logWriter(source, "stdout", ra.GetSuppressLogOutput(), nil), outR)
	}()
	go func() {
		defer copies.Done()
		_, _ = io.Copy(c.logWriter(source, "stderr", ra.GetSuppressLogOutput(), stderrTail), errR)
	}()

	waitCh := make(chan error, 1)
	go func() { waitCh <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-waitCh:
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), errStopped) {
			waitErr = <-waitCh // the stop signals the process
			break
		}
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(c.b.killGrace)
		select {
		case waitErr = <-waitCh:
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			waitErr = <-waitCh
		}
		t.Stop()
	}
	// Nothing of the process group outlives its leader.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	c.mu.Lock()
	delete(c.live, pgid)
	c.mu.Unlock()

	// Output ends when every writer is gone; a process that left the group may still hold
	// the pipes, so stop reading after a moment.
	copied := make(chan struct{})
	go func() { copies.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(time.Second):
		_ = outR.Close()
		_ = errR.Close()
		<-copied
	}
	_ = outR.Close()
	_ = errR.Close()

	if waitErr == nil {
		return nil
	}
	var exitErr *exec.ExitError
	if !errors.As(waitErr, &exitErr) {
		return fmt.Errorf("run %s: %w", ra.GetPath(), waitErr)
	}
	reason := exitErr.ProcessState.String() // "exit status 3" or "signal: killed"
	if tail := stderrTail.LastLines(maxReasonTail); tail != "" {
		reason += ": " + tail
	}
	return errors.New(reason)
}

// command builds the process of a run action.
func (c *container) command(ra *modelsv1.RunAction) (*exec.Cmd, error) {
	if ra.GetPath() == "" {
		return nil, errors.New("run action: empty path")
	}
	env := append([]string(nil), c.env...)
	for _, e := range ra.GetEnv() {
		env = append(env, e.GetName()+"="+e.GetValue())
	}
	dir := ra.GetDir()
	switch {
	case c.root != "":
		dir = filepath.Join("/", dir)
	case dir == "":
		dir = c.dir
	case !filepath.IsAbs(dir):
		dir = filepath.Join(c.dir, dir)
	}
	path, err := c.lookPath(ra.GetPath(), env)
	if err != nil {
		return nil, err
	}
	attr := &syscall.SysProcAttr{Setpgid: true, Chroot: c.root, Credential: c.cred}
	if c.cg != nil {
		attr.UseCgroupFD = true
		attr.CgroupFD = int(c.cg.fd.Fd())
	}
	return &exec.Cmd{
		Path:        path,
		Args:        append([]string{ra.GetPath()}, ra.GetArgs()...),
		Env:         env,
		Dir:         dir,
		SysProcAttr: attr,
	}, nil
}

// lookPath resolves a bare program name through the process's PATH, inside the rootfs when
// chrooted. Paths with a slash are used as they are (relative ones from the working dir).
func (c *container) lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathVar := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathVar = v // the last one wins, as in the process
		}
	}
	for _, d := range filepath.SplitList(pathVar) {
		if !filepath.IsAbs(d) {
			continue
		}
		candidate := filepath.Join(d, name)
		fi, err := os.Stat(filepath.Join(c.root, candidate))
		if err != nil {
			// In a chroot an absolute symbolic link points into the rootfs, not the host.
			if c.root == "" {
				continue
			}
			if _, lerr := os.Lstat(filepath.Join(c.root, candidate)); lerr != nil {
				continue
			}
			return candidate, nil
		}
		if fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("run %s: executable not found in PATH %q", name, pathVar)
}

// logWriter returns where a process's stream goes: the container's log sink and debug log
// lines (unless suppressed) and, for stderr, the tail kept for the failure reason.
func (c *container) logWriter(source, stream string, suppress bool, tail *procout.TailBuffer) io.Writer {
	return procout.Writer(c.log.With("source", source, "stream", stream), suppress, tail, c.spec.Log, source, stream)
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// busyAttempts bounds the starts of a process whose executable is busy (startExec); waiting
// 1 ms and twice as long before each next one, they span about 127 ms.
const busyAttempts = 8

// startExec starts cmd. When the kernel answers ETXTBSY, the executable was just written (an
// image's layers extracted, a download unpacked) and a process forked meanwhile, by this
// container or another one starting, still holds it open until that child execs: a copy of
// cmd is started again after a short wait, up to busyAttempts in all. It returns the command
// that started, or the last error.
func startExec(cmd *exec.Cmd) (*exec.Cmd, error) {
	err := retry.Do(context.Background(), retry.Policy{Initial: time.Millisecond}, busyAttempts, func() error {
		err := cmd.Start()
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.ETXTBSY) {
			return retry.Permanent(err)
		}
		// A Cmd starts once: the next attempt is a copy.
		cmd = &exec.Cmd{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, Stdin: cmd.Stdin,
			Stdout: cmd.Stdout, Stderr: cmd.Stderr, ExtraFiles: cmd.ExtraFiles, SysProcAttr: cmd.SysProcAttr}
		return err
	}, nil)
	return cmd, err
}
