package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/checks"
)

// Reasons a container ends with, besides an action's own failure.
const (
	// ReasonStopped is the reason of a container ended by Stop.
	ReasonStopped = "stopped"
	// ReasonHealthCheckFailed is the reason of an LRP whose health check failed after passing.
	ReasonHealthCheckFailed = checks.ReasonHealthCheckFailed
	// ReasonNeverHealthy is the reason of an LRP not healthy within its start timeout.
	ReasonNeverHealthy = checks.ReasonNeverHealthy
	// ReasonExitedCleanly is the reason of an LRP whose action ended without an error.
	ReasonExitedCleanly = executor.ReasonExitedCleanly
)

// errStopped is the cancellation cause of a container's context once it is being stopped:
// its processes are then signalled by the stop itself, not by their run action.
var errStopped = errors.New("container stopped")

// container is one running container. It implements executor.Container.
type container struct {
	b        *Backend
	spec     executor.Spec
	dir      string              // the container directory on the host
	root     string              // the chroot, or "" to run on the host's filesystem
	cred     *syscall.Credential // nil keeps the rep's user
	cg       *cgroup             // nil without cgroup limits
	netInfo  *modelsv1.ActualLRPNetInfo
	mapping  map[uint32]int // container port → host port
	env      []string       // the environment every process starts with
	log      hclog.Logger
	inMain   atomic.Bool // the main action (not setup) is running
	started  chan struct{}
	startOne sync.Once

	hostPorts []int
	filesRoot string // the directory Spec.FilesDir lives in (FilesPath), "" without one
	filesDir  string // Spec.FilesDir relative to filesRoot

	ctx    context.Context
	cancel context.CancelCauseFunc

	healthy    chan struct{}
	healthyOne sync.Once
	routable   chan bool
	done       chan struct{}

	mu         sync.Mutex
	live       map[int]struct{} // process groups of running processes
	stopping   bool             // no process may start any more
	stopReason string
	finished   bool
	result     executor.Result
}

var _ executor.Container = (*container)(nil)

func newContainer(b *Backend, spec executor.Spec, dir, root string, cred *syscall.Credential, cg *cgroup,
	netInfo *modelsv1.ActualLRPNetInfo, mapping map[uint32]int, containerPorts []uint32) *container {
	ctx, cancel := context.WithCancelCause(context.Background())
	c := &container{
		b:        b,
		spec:     spec,
		dir:      dir,
		root:     root,
		cred:     cred,
		cg:       cg,
		netInfo:  netInfo,
		mapping:  mapping,
		log:      b.log.With("guid", spec.Guid),
		started:  make(chan struct{}),
		ctx:      ctx,
		cancel:   cancel,
		healthy:  make(chan struct{}),
		routable: make(chan bool, 1),
		done:     make(chan struct{}),
		live:     map[int]struct{}{},
	}
	c.env = c.baseEnv(containerPorts)
	return c
}

// baseEnv is HOME and PATH defaults, then Spec.Env, then the variables the cell sets.
func (c *container) baseEnv(containerPorts []uint32) []string {
	home := c.dir
	if c.root != "" {
		home = "/"
	}
	env := []string{"HOME=" + home, "PATH=" + defaultPath}
	for _, e := range c.spec.Env {
		env = append(env, e.GetName()+"="+e.GetValue())
	}
	addr := c.b.opts.CellAddress
	env = append(env, "CF_INSTANCE_IP="+addr)
	if len(containerPorts) > 0 {
		first := c.mapping[containerPorts[0]]
		type portPair struct {
			External int    `json:"external"`
			Internal uint32 `json:"internal"`
		}
		pairs := make([]portPair, 0, len(containerPorts))
		for _, cp := range containerPorts {
			hp := c.mapping[cp]
			env = append(env, fmt.Sprintf("PORT_%d=%d", cp, hp))
			pairs = append(pairs, portPair{External: hp, Internal: cp})
		}
		ports, _ := json.Marshal(pairs) // cannot fail on these types
		env = append(env,
			"PORT="+strconv.Itoa(first),
			"CF_INSTANCE_PORT="+strconv.Itoa(first),
			"CF_INSTANCE_ADDR="+net.JoinHostPort(addr, strconv.Itoa(first)),
			"CF_INSTANCE_PORTS="+string(ports),
		)
	}
	if c.spec.Kind == executor.KindLRP {
		idx := strconv.Itoa(int(c.spec.Index))
		env = append(env,
			"INSTANCE_INDEX="+idx, "CF_INSTANCE_INDEX="+idx,
			"INSTANCE_GUID="+c.spec.Guid, "CF_INSTANCE_GUID="+c.spec.Guid,
		)
	}
	return env
}

// Guid is the container's guid.
func (c *container) Guid() string { return c.spec.Guid }

// NetInfo is the cell address and the host port of every container port.
func (c *container) NetInfo() *modelsv1.ActualLRPNetInfo {
	return c.netInfo.CloneVT()
}

// Healthy is closed when the health checks first pass.
func (c *container) Healthy() <-chan struct{} { return c.healthy }

// Routable carries the latest readiness state.
func (c *container) Routable() <-chan bool { return c.routable }

// Done is closed when the container is over.
func (c *container) Done() <-chan struct{} { return c.done }

// Result is how the container ended (valid once Done is closed).
func (c *container) Result() executor.Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.result
}

// Stop signals every process group with SIGTERM, kills them after grace and returns once the
// container is done.
func (c *container) Stop(grace time.Duration) {
	c.beginStop(ReasonStopped, grace)
	<-c.done
}

// beginStop stops the container without waiting: the first call sets the reason, forbids new
// processes and sends SIGTERM; every call schedules a SIGKILL after its grace.
func (c *container) beginStop(reason string, grace time.Duration) {
	c.mu.Lock()
	if c.finished {
		c.mu.Unlock()
		return
	}
	first := !c.stopping
	var groups []int
	if first {
		c.stopping = true
		c.stopReason = reason
		for pg := range c.live {
			groups = append(groups, pg)
		}
	}
	c.mu.Unlock()
	if first {
		c.log.Debug("stopping", "reason", reason, "grace", grace)
		c.cancel(errStopped)
		for _, pg := range groups {
			_ = syscall.Kill(-pg, syscall.SIGTERM)
		}
	}
	go func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.done:
		case <-t.C:
			c.killAll()
		}
	}()
}

// killAll sends SIGKILL to every running process group (and the whole cgroup).
func (c *container) killAll() {
	for _, pg := range c.groups() {
		_ = syscall.Kill(-pg, syscall.SIGKILL)
	}
	if c.cg != nil {
		c.cg.kill()
	}
}

// groups returns the process groups of the running processes.
func (c *container) groups() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	groups := make([]int, 0, len(c.live))
	for pg := range c.live {
		groups = append(groups, pg)
	}
	return groups
}

// markStarted records that a process of the main action started.
func (c *container) markStarted() {
	if c.inMain.Load() {
		c.startOne.Do(func() { close(c.started) })
	}
}

// closeHealthy closes Healthy once.
func (c *container) closeHealthy() {
	c.healthyOne.Do(func() { close(c.healthy) })
}

// setRoutable replaces any unread readiness state with v. Only the monitor goroutine calls
// it, so the channel (capacity 1) never blocks it.
func (c *container) setRoutable(v bool) {
	select {
	case <-c.routable:
	default:
	}
	c.routable <- v
}

// run is the container's life: setup, then the action with the health monitor beside it,
// then the clean-up.
func (c *container) run() {
	var actionErr error
	defer func() { c.finish(actionErr) }()
	if c.spec.Setup != nil {
		if actionErr = c.runAction(c.ctx, c.spec.Setup); actionErr != nil {
			return
		}
	}
	actionStart := time.Now()
	c.inMain.Store(true)
	monitorCtx, stopMonitor := context.WithCancel(context.Background())
	monitorDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		c.monitor(monitorCtx, actionStart)
	}()
	actionErr = c.runAction(c.ctx, c.spec.Action)
	stopMonitor()
	<-monitorDone
}

// finish decides the result, releases the container's resources and closes Done.
func (c *container) finish(actionErr error) {
	c.mu.Lock()
	c.stopping = true
	reason := c.stopReason
	c.mu.Unlock()

	var res executor.Result
	switch {
	case reason != "":
		res = executor.Result{Failed: true, Reason: reason}
	case actionErr != nil:
		res = executor.Result{Failed: true, Reason: actionErr.Error()}
	default:
		res = executor.Completed(c.spec, c.readResultFile)
	}
	c.cancel(context.Canceled)

	if c.cg != nil {
		c.cg.destroy()
	}
	c.b.ports.Release(c.hostPorts)
	if c.root != "" && c.filesRoot != "" {
		// Inside a shared rootfs the files directory goes with the container.
		if err := c.removeFiles(); err != nil {
			c.log.Warn("remove files directory", "error", err)
		}
	}
	if !c.b.keep {
		if err := os.RemoveAll(c.dir); err != nil {
			c.log.Warn("remove container directory", "error", err)
		}
	}
	c.b.forget(c.spec.Guid)
	c.log.Debug("container done", "failed", res.Failed, "reason", res.Reason)

	c.mu.Lock()
	c.finished = true
	c.result = res
	c.mu.Unlock()
	close(c.routable)
	close(c.done)
}

// readResultFile reads the task's result file (at most MaxResultFileSize bytes).
//
// It reads through an os.Root (confined): the container's process may have made the file a
// symbolic link to a host file, which the rep, maybe root, must not read into the result.
func (c *container) readResultFile() (string, error) {
	dir, rel := c.confined(c.spec.ResultFile)
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", fmt.Errorf("read result file: %w", err)
	}
	defer root.Close()
	f, err := root.Open(rel)
	if err != nil {
		return "", fmt.Errorf("read result file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxResultFileSize+1))
	if err != nil {
		return "", fmt.Errorf("read result file %s: %w", c.spec.ResultFile, err)
	}
	if len(b) > MaxResultFileSize {
		return "", fmt.Errorf("result file %s is larger than %d bytes", c.spec.ResultFile, MaxResultFileSize)
	}
	return string(b), nil
}

// hostPath maps a path of the container to the host: inside the rootfs when chrooted
// (relative paths start at "/"), otherwise relative to the container directory.
func (c *container) hostPath(p string) string {
	if c.root != "" {
		return filepath.Join(c.root, filepath.Clean("/"+p))
	}
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(c.dir, p)
}
