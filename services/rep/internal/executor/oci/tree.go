package oci

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/actions"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/download"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/procout"
)

// errStopped is the cause of a tree's context once the container is being stopped: its
// processes are then signalled by the stop itself, not by their run action.
var errStopped = errors.New("container stopped")

// errInitExited is the cause of a tree's context when the container's init program is gone
// (killed): every process of the container went with it.
var errInitExited = errors.New("the container's init process exited")

// interpreter is the action interpreter (package actions) with the container's leaf steps.
func (c *container) interpreter() actions.Interpreter {
	return actions.Interpreter{Steps: treeSteps{c}, Log: c.log}
}

// treeSteps are a tree container's leaf steps: a process exec'd in the container, a download
// into its root filesystem.
type treeSteps struct{ c *container }

// Run implements actions.Steps (execRun).
func (s treeSteps) Run(ctx context.Context, ra *modelsv1.RunAction) error {
	return s.c.execRun(ctx, ra)
}

// Download implements actions.Steps: d is fetched into the container's root filesystem through
// an os.Root of it (download.Into), owned by d's user, else by the user a run action without
// one runs as.
func (s treeSteps) Download(ctx context.Context, d *modelsv1.DownloadAction) error {
	c := s.c
	ids, err := processUser(c.spec, &modelsv1.RunAction{User: d.GetUser()}, c.procCfg)
	if err != nil {
		return fmt.Errorf("download %s: %w", d.GetFrom(), err)
	}
	return download.Into(ctx, d, c.ov.root, c.dir, int(ids.UID), int(ids.GID))
}

// runTree is the life of a tree container: its setup, then its action with the health monitor
// beside it (the checks, else the monitor action), every run action a process exec'd in the
// container, while its init program runs; then the clean-up. The result is the tree's: the
// failure of its run actions (exit status and stderr tail, or out of memory), as with a
// simple container's init.
func (c *container) runTree() {
	waited := make(chan bool, 1)
	go func() {
		_, ok := c.wait()
		if ok {
			c.cancel(errInitExited)
		}
		waited <- ok
	}()
	diskCtx, stopDisk := context.WithCancel(context.Background())
	diskDone := make(chan struct{})
	go func() {
		defer close(diskDone)
		c.watchDisk(diskCtx)
	}()
	treeDone := make(chan error, 1)
	go func() { treeDone <- c.runActions() }()
	var actionErr error
	select {
	case actionErr = <-treeDone:
	case ok := <-waited:
		if !ok {
			stopDisk()
			<-diskDone
			c.log.Debug("backend closed, leaving the container running")
			return
		}
		actionErr = <-treeDone
	}
	stopDisk()
	<-diskDone

	c.mu.Lock()
	c.stopping = true
	stopReason := c.stopReason
	c.mu.Unlock()
	var res executor.Result
	switch {
	case stopReason != "":
		res = executor.Result{Failed: true, Reason: stopReason}
	case errors.Is(context.Cause(c.treeCtx), errInitExited) && c.oomKilled():
		res = executor.Result{Failed: true, Reason: ReasonOutOfMemory}
	case actionErr != nil:
		res = executor.Result{Failed: true, Reason: actionErr.Error()}
	default:
		res = executor.Completed(c.spec, c.readResultFile)
	}
	c.cancel(context.Canceled)
	c.cleanup(res)
}

// runActions runs the setup, then the action with the monitor beside it.
func (c *container) runActions() error {
	in := c.interpreter()
	if c.spec.Setup != nil {
		if err := in.Run(c.treeCtx, c.spec.Setup); err != nil {
			return err
		}
	}
	actionStart := time.Now()
	c.inMain.Store(true)
	monitorCtx, stopMonitor := context.WithCancel(context.Background())
	monitorDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		select {
		case <-c.started:
		case <-monitorCtx.Done():
			return
		}
		c.monitor(monitorCtx, actionStart)
	}()
	err := in.Run(c.treeCtx, c.spec.Action)
	stopMonitor()
	<-monitorDone
	return err
}

// execRun runs ra's process in the container (a containerd exec process, as ProcessSpec says)
// to its end, its output to the spec's log sink with its log source. When ctx ends for another
// reason than a stop (which signals every process itself), the process gets SIGTERM, then
// SIGKILL after the kill grace. Its failure reads as a simple container's: "exit status N" or
// "signal: NAME" with its stderr's tail, or "out of memory".
func (c *container) execRun(ctx context.Context, ra *modelsv1.RunAction) error {
	proc, err := ProcessSpec(c.spec, ra, c.procCfg)
	if err != nil {
		return err
	}
	source := ra.GetLogSource()
	tail := procout.NewTailBuffer(1 << 10)
	stdout := procout.Writer(c.log.With("source", source, "stream", "stdout"), ra.GetSuppressLogOutput(), nil, c.spec.Log, source, "stdout")
	stderr := procout.Writer(c.log.With("source", source, "stream", "stderr"), ra.GetSuppressLogOutput(), tail, c.spec.Log, source, "stderr")
	cctx := c.b.ctx(context.WithoutCancel(ctx))
	id := fmt.Sprintf("run-%d", execSeq.Add(1))

	// Started under the lock, so a stop either comes first (and nothing starts) or signals it.
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return errStopped
	}
	p, err := c.task.Exec(cctx, id, proc, cio.NewCreator(cio.WithStreams(nil, stdout, stderr), cio.WithFIFODir(filepath.Join(c.dir, "fifo"))))
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("run %s: %w", ra.GetPath(), err)
	}
	defer func() { _, _ = p.Delete(c.b.ctx(context.Background()), containerd.WithProcessKill) }()
	exited, err := p.Wait(cctx)
	if err == nil {
		err = p.Start(cctx)
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("run %s: %w", ra.GetPath(), err)
	}
	if c.inMain.Load() {
		c.startOne.Do(func() { close(c.started) })
	}

	var st containerd.ExitStatus
	select {
	case st = <-exited:
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), errStopped) && !errors.Is(context.Cause(ctx), errInitExited) {
			_ = p.Kill(cctx, syscall.SIGTERM)
			t := time.NewTimer(c.b.cfg.KillGrace)
			select {
			case st = <-exited:
			case <-t.C:
				_ = p.Kill(cctx, syscall.SIGKILL)
				st = <-exited
			}
			t.Stop()
		} else {
			st = <-exited
		}
	}
	drainIO(p.IO())

	code, _, err := st.Result()
	switch {
	case err != nil:
		return fmt.Errorf("run %s: %w", ra.GetPath(), err)
	case code == 0:
		return nil
	case c.oomKilled():
		return errors.New(ReasonOutOfMemory)
	}
	reason := exitReason(code)
	if t := tail.LastLines(maxReasonTail); t != "" {
		reason += ": " + t
	}
	return errors.New(reason)
}
