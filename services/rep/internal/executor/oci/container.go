package oci

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/hashicorp/go-hclog"
	"github.com/moby/sys/user"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/checks"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/download"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/oci/cni"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/procout"
)

// Reasons a container ends with, besides its process's own exit.
const (
	// ReasonStopped is the reason of a container ended by Stop.
	ReasonStopped = "stopped"
	// ReasonExitedCleanly is the reason of an LRP whose process exited with status 0.
	ReasonExitedCleanly = executor.ReasonExitedCleanly
	// ReasonOutOfMemory is the reason of a container whose processes the kernel killed for
	// going over memory_mb.
	ReasonOutOfMemory = "out of memory"
)

// initFile is the name of a tree container's init program in its directory.
const initFile = "init"

// Timings of the clean-up.
const (
	// cleanupTimeout bounds the containerd calls of a container's clean-up.
	cleanupTimeout = 30 * time.Second
	// outputDrain is how long the output is read after the process exited.
	outputDrain = time.Second
	// maxReasonTail bounds the stderr tail added to a failed process's reason.
	maxReasonTail = 200
)

// container is one OCI container. It implements executor.Container.
type container struct {
	b         *Backend
	spec      executor.Spec
	dir       string // the container directory on the host
	ov        overlay
	snapshot  bool   // the rootfs is the image snapshot keyed by the guid (imageRootfs)
	image     string // the image reference the container counts as a user of (useImage)
	cgroup    string // the cgroup path of the OCI spec
	ctr       containerd.Container
	task      containerd.Task
	exitCh    <-chan containerd.ExitStatus
	netnsPath string
	attached  bool // the Network attached the namespace
	ports     []uint32
	netInfo   *modelsv1.ActualLRPNetInfo
	filesHost string
	tail      *procout.TailBuffer
	log       hclog.Logger

	// An action tree (IsTree): its processes are exec'd in the container, as procCfg says.
	tree     bool
	procCfg  SpecConfig
	treeCtx  context.Context         // the tree's context, ended by a stop (errStopped)
	cancel   context.CancelCauseFunc // ends treeCtx
	inMain   atomic.Bool             // the main action (not setup) is running
	started  chan struct{}           // closed when a process of the main action started
	startOne sync.Once

	healthy    chan struct{}
	healthyOne sync.Once
	routable   chan bool
	done       chan struct{}

	mu         sync.Mutex
	stopping   bool
	stopReason string
	finished   bool
	result     executor.Result
}

var _ executor.Container = (*container)(nil)

// create lays out, mounts, creates and starts the container; on error nothing is left.
func (b *Backend) create(ctx context.Context, spec executor.Spec) (_ *container, err error) {
	var cleanups []func()
	defer func() {
		if err != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()
	// The container outlives the request that starts it.
	dir := b.containerDir(spec.Guid)
	ov := newOverlay(dir, spec.RootfsPath)
	sctx, scancel := context.WithTimeout(b.ctx(context.WithoutCancel(ctx)), cleanupTimeout)
	err = b.removeStale(sctx, spec.Guid, ov)
	scancel()
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create container directory: %w", err)
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	image := isImage(spec)
	var imageName string
	if image {
		ref, _, err := imageRef(spec.Rootfs, b.cfg.InsecureRegistries)
		if err != nil {
			return nil, fmt.Errorf("pull image: %w", err)
		}
		// Counted before the pull, so the image garbage collection leaves it alone from now.
		b.useImage(ref)
		imageName = ref
		cleanups = append(cleanups, func() { b.releaseImage(ref) })
		// The pull and unpack share the downloads' time: both fetch what the start needs.
		pctx, pcancel := context.WithTimeout(b.ctx(context.WithoutCancel(ctx)), DownloadTimeout)
		img, err := b.pull(pctx, spec.Rootfs, spec.ImageUsername, spec.ImagePassword)
		if err == nil {
			err = b.imageRootfs(pctx, spec.Guid, img, &ov)
		}
		pcancel()
		if err != nil {
			return nil, err
		}
		cleanups = append(cleanups, func() { _ = b.removeSnapshot(b.ctx(context.Background()), spec.Guid) })
	} else if err := ov.mount(); err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { _ = ov.unmount() })

	users, err := rootfsUsers(ov.root)
	if err != nil {
		return nil, err
	}
	tree := IsTree(spec)
	if !tree {
		if err := b.downloads(ctx, spec, ov.root, dir, users); err != nil {
			return nil, err
		}
	}
	// The rest of the start has its own time, whatever the downloads took.
	cctx, cancel := context.WithTimeout(b.ctx(context.WithoutCancel(ctx)), cleanupTimeout)
	defer cancel()
	c := b.newContainer(spec, dir)
	c.ov, c.snapshot, c.tree, c.image = ov, image, tree, imageName
	env := cellEnv(spec, b.cfg.CellAddress, c.ports)
	ports := c.ports
	c.netInfo = &modelsv1.ActualLRPNetInfo{Address: b.cfg.CellAddress, InstanceAddress: b.cfg.CellAddress}
	internalIP := "127.0.0.1" // without a network, the container has loopback only
	if spec.FilesDir != "" {
		inside, err := c.makeFiles()
		if err != nil {
			return nil, err
		}
		if spec.FilesDirEnv != "" {
			env = append(env, spec.FilesDirEnv+"="+inside)
		}
	}
	if b.cfg.Network != nil {
		// A pinned namespace outlives the container's processes, so the network's plugins
		// can still undo what they did (addresses, masquerade rules) after it has exited.
		if c.netnsPath, err = cni.NewNetns(b.netnsDir(), spec.Guid); err != nil {
			return nil, fmt.Errorf("network namespace: %w", err)
		}
		pinned := c.netnsPath
		cleanups = append(cleanups, func() { _ = cni.RemoveNetns(pinned) })
		// Attached before the container exists (as containerd's CRI attaches a pod's
		// sandbox), so its address is in its environment: CF_INSTANCE_INTERNAL_IP.
		att, err := b.cfg.Network.Attach(cctx, spec.Guid, c.netnsPath, ports, spec.Properties)
		if err != nil {
			return nil, fmt.Errorf("attach network: %w", err)
		}
		c.attached = true
		cleanups = append(cleanups, func() { c.detach() })
		c.netInfo.InstanceAddress, internalIP = att.Address, att.Address
		for _, cp := range ports {
			if hp, ok := att.Ports[cp]; ok {
				c.netInfo.Ports = append(c.netInfo.Ports, &modelsv1.PortMapping{ContainerPort: cp, HostPort: hp})
			}
		}
	}
	env = append(env, "CF_INSTANCE_INTERNAL_IP="+internalIP)
	c.procCfg = SpecConfig{
		NetnsPath:    c.netnsPath,
		RootPath:     ov.root,
		CgroupParent: b.cfg.CgroupParent,
		Users:        users,
		DefaultUser:  b.cfg.User,
		LimitSwap:    b.limitSwap,
		Env:          env,
		Hooks:        b.cfg.Hooks,
	}
	if tree {
		// The init program goes with the container's directory.
		c.procCfg.InitPath = filepath.Join(dir, initFile)
		if err := os.WriteFile(c.procCfg.InitPath, pauseProgram, 0o755); err != nil {
			return nil, fmt.Errorf("write the init program: %w", err)
		}
	}
	ociSpec, err := BuildSpec(spec, c.procCfg)
	if err != nil {
		return nil, err
	}
	if tree {
		// Every run action's process is checked now (its user, its path), not when it runs.
		for _, ra := range runActions(spec) {
			if _, err := ProcessSpec(spec, ra, c.procCfg); err != nil {
				return nil, err
			}
		}
	}
	c.cgroup = ociSpec.Linux.CgroupsPath
	// The record comes before the containerd container: a container of the namespace without
	// one is a leftover of a rep that died creating it, and the next rep removes it.
	if err := c.writeRecord(); err != nil {
		return nil, err
	}

	c.ctr, err = b.client.NewContainer(cctx, spec.Guid, containerd.WithSpec(ociSpec), containerd.WithRuntime(b.cfg.Runtime, nil))
	if err != nil {
		return nil, fmt.Errorf("create containerd container: %w", err)
	}
	cleanups = append(cleanups, func() { _ = c.ctr.Delete(b.ctx(context.Background())) })

	stdout, stderr := c.streams()
	c.task, err = c.ctr.NewTask(cctx, cio.NewCreator(cio.WithStreams(nil, stdout, stderr), cio.WithFIFODir(filepath.Join(dir, "fifo"))))
	if err != nil {
		return nil, fmt.Errorf("create task: %w", namedHook(err, b.cfg.Hooks.OnCreate))
	}
	cleanups = append(cleanups, func() { _, _ = c.task.Delete(b.ctx(context.Background()), containerd.WithProcessKill) })
	c.exitCh, err = c.task.Wait(b.ctx(context.Background()))
	if err != nil {
		return nil, fmt.Errorf("wait for task: %w", err)
	}
	if c.netnsPath == "" {
		c.netnsPath = fmt.Sprintf("/proc/%d/ns/net", c.task.Pid())
	}

	if err := c.task.Start(cctx); err != nil {
		return nil, fmt.Errorf("start task: %w", err)
	}
	c.log.Debug("container started", "pid", c.task.Pid())
	return c, nil
}

// newContainer is the backend's container of spec in dir, not created yet.
func (b *Backend) newContainer(spec executor.Spec, dir string) *container {
	c := &container{
		b:        b,
		spec:     spec,
		dir:      dir,
		ov:       newOverlay(dir, spec.RootfsPath),
		ports:    uniquePorts(spec.Ports),
		tail:     procout.NewTailBuffer(1 << 10),
		log:      b.log.With("guid", spec.Guid),
		healthy:  make(chan struct{}),
		routable: make(chan bool, 1),
		done:     make(chan struct{}),
		started:  make(chan struct{}),
	}
	c.treeCtx, c.cancel = context.WithCancelCause(context.Background())
	return c
}

// streams are the writers of the run action's stdout and stderr: the spec's log sink (with
// the action's log source), and stderr's tail for a failure's reason.
func (c *container) streams() (stdout, stderr io.Writer) {
	ra := c.spec.Action.GetRun()
	source := ra.GetLogSource() // empty: the container's default source
	stdout = procout.Writer(c.log.With("source", source, "stream", "stdout"), ra.GetSuppressLogOutput(), nil, c.spec.Log, source, "stdout")
	stderr = procout.Writer(c.log.With("source", source, "stream", "stderr"), ra.GetSuppressLogOutput(), c.tail, c.spec.Log, source, "stderr")
	return stdout, stderr
}

// removeStale removes what an earlier run of the rep may have left of container guid: its
// containerd container and task, its overlay mount and its directory.
func (b *Backend) removeStale(ctx context.Context, guid string, ov overlay) error {
	if ctr, err := b.client.LoadContainer(ctx, guid); err == nil {
		if task, err := ctr.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("remove stale task: %w", err)
			}
		}
		if err := ctr.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove stale container: %w", err)
		}
	}
	if b.cfg.Network != nil {
		// The network of a container an earlier run left: undone through its pinned namespace,
		// or, when that is gone too (the machine rebooted), from what the network cached (its
		// address and host port rules).
		pinned := filepath.Join(b.netnsDir(), guid)
		_, cached, err := b.cfg.Network.Adopt(ctx, guid, pinned)
		if err != nil {
			b.log.Warn("stale container's network attachment unreadable, deleting it anyway", "guid", guid, "error", err)
			cached = true
		}
		if cached || fileExists(pinned) {
			if err := b.cfg.Network.Detach(ctx, guid, pinned, nil, nil); err != nil {
				return fmt.Errorf("remove stale container's network: %w", err)
			}
		}
		if err := cni.RemoveNetns(pinned); err != nil {
			return fmt.Errorf("remove stale network namespace: %w", err)
		}
	}
	if err := ov.unmount(); err != nil {
		return fmt.Errorf("remove stale container: %w", err)
	}
	// The snapshot of an image's container (a start that died before its record was written
	// leaves one too). Without the snapshotter loaded there is none.
	if err := b.removeSnapshot(ctx, guid); err != nil && !errdefs.IsInvalidArgument(err) {
		return fmt.Errorf("remove stale container: %w", err)
	}
	if err := os.RemoveAll(filepath.Dir(ov.root)); err != nil {
		return fmt.Errorf("remove stale container directory: %w", err)
	}
	return nil
}

// rootfsUsers reads the users of the rootfs's /etc/passwd (none when it has no such file).
func rootfsUsers(root string) (map[string]IDs, error) {
	// Through an os.Root: an image's /etc/passwd may be a link out of it.
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("read the rootfs's users: %w", err)
	}
	defer r.Close()
	f, err := r.Open("etc/passwd")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the rootfs's users: %w", err)
	}
	defer f.Close()
	list, err := user.ParsePasswd(f)
	if err != nil {
		return nil, fmt.Errorf("parse the rootfs's /etc/passwd: %w", err)
	}
	users := make(map[string]IDs, len(list))
	for _, u := range list {
		users[u.Name] = IDs{UID: uint32(u.Uid), GID: uint32(u.Gid), Home: u.Home}
	}
	return users, nil
}

// uniquePorts is ports without duplicates, in order.
func uniquePorts(ports []uint32) []uint32 {
	var out []uint32
	for _, p := range ports {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// cellEnv are the variables the cell sets: the process listens on its container ports in its
// own network namespace, so PORT is the first container port and PORT_<n> is n.
func cellEnv(spec executor.Spec, cellAddress string, ports []uint32) []string {
	env := []string{"CF_INSTANCE_IP=" + cellAddress}
	if len(ports) > 0 {
		type portPair struct {
			External uint32 `json:"external"`
			Internal uint32 `json:"internal"`
		}
		pairs := make([]portPair, 0, len(ports))
		for _, p := range ports {
			env = append(env, fmt.Sprintf("PORT_%d=%d", p, p))
			pairs = append(pairs, portPair{External: p, Internal: p})
		}
		b, _ := json.Marshal(pairs) // cannot fail on these types
		env = append(env, "PORT="+strconv.Itoa(int(ports[0])), "CF_INSTANCE_PORTS="+string(b))
	}
	if spec.Kind == executor.KindLRP {
		idx := strconv.Itoa(int(spec.Index))
		env = append(env,
			"INSTANCE_INDEX="+idx, "CF_INSTANCE_INDEX="+idx,
			"INSTANCE_GUID="+spec.Guid, "CF_INSTANCE_GUID="+spec.Guid,
		)
	}
	return env
}

// makeFiles creates the spec's files directory in the container's root with its files and
// returns its path as the processes see it.
func (c *container) makeFiles() (string, error) {
	rel := filepath.Clean("/" + c.spec.FilesDir)
	// Through an os.Root: the rootfs (an image's) may hold links out of it on the way.
	root, err := os.OpenRoot(c.ov.root)
	if err != nil {
		return "", fmt.Errorf("create files directory: %w", err)
	}
	defer root.Close()
	in := strings.TrimPrefix(rel, "/")
	if in == "" {
		in = "."
	}
	if err := root.MkdirAll(in, 0o755); err != nil {
		return "", fmt.Errorf("create files directory: %w", err)
	}
	for name, data := range c.spec.Files {
		if name != filepath.Base(name) || name == "." || name == ".." {
			return "", fmt.Errorf("file name %q is not a plain name", name)
		}
		if err := root.WriteFile(filepath.Join(in, name), data, 0o644); err != nil {
			return "", fmt.Errorf("write file %s: %w", name, err)
		}
	}
	c.filesHost = filepath.Join(c.ov.root, rel)
	return rel, nil
}

// Guid is the container's guid.
func (c *container) Guid() string { return c.spec.Guid }

// NetInfo is the cell address, the instance address and the host ports (only with a Network).
func (c *container) NetInfo() *modelsv1.ActualLRPNetInfo {
	return c.netInfo.CloneVT()
}

// Healthy is closed when the health checks first pass.
func (c *container) Healthy() <-chan struct{} { return c.healthy }

// Routable carries the latest readiness state.
func (c *container) Routable() <-chan bool { return c.routable }

// Done is closed when the container is over and cleaned up.
func (c *container) Done() <-chan struct{} { return c.done }

// FilesPath is the host path of Spec.FilesDir, inside the container's root.
func (c *container) FilesPath() (root, dir string) {
	if c.filesHost == "" {
		return "", ""
	}
	return c.ov.root, download.InRoot(c.spec.FilesDir)
}

// Result is how the container ended (valid once Done is closed).
func (c *container) Result() executor.Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.result
}

// Signal sends sig to every process of the container.
func (c *container) Signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(c.b.ctx(context.Background()), cleanupTimeout)
	defer cancel()
	err := c.whileUnavailable(ctx, func(ctx context.Context) error { return c.task.Kill(ctx, sig, containerd.WithKillAll) })
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("signal %s: %w", c.spec.Guid, err)
	}
	return nil
}

// whileUnavailable calls f until containerd answers it (a restarting containerd is
// unavailable for a moment; its shims keep the container), the container is done or ctx ends.
func (c *container) whileUnavailable(ctx context.Context, f func(ctx context.Context) error) error {
	for {
		err := f(ctx)
		if err == nil || !errdefs.IsUnavailable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-c.done:
			return err
		case <-time.After(rewaitInterval):
		}
	}
}

// Stop sends SIGTERM to the container's init process, SIGKILL to all its processes after
// grace, and returns once the container is done.
func (c *container) Stop(grace time.Duration) {
	c.beginStop(ReasonStopped, grace)
	<-c.done
}

// beginStop stops the container without waiting: the first call sets the reason and sends
// SIGTERM; every call schedules a SIGKILL after its grace.
func (c *container) beginStop(reason string, grace time.Duration) {
	c.mu.Lock()
	if c.finished {
		c.mu.Unlock()
		return
	}
	first := !c.stopping
	if first {
		c.stopping = true
		c.stopReason = reason
	}
	c.mu.Unlock()
	if first {
		c.log.Debug("stopping", "reason", reason, "grace", grace)
		c.cancel(errStopped) // no process of a tree starts any more
		c.kill(syscall.SIGTERM)
	}
	go func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.done:
		case <-t.C:
			c.kill(syscall.SIGKILL)
		}
	}()
}

// kill signals the init process (SIGTERM) or every process (SIGKILL). A tree's SIGTERM goes
// to every process: its init program ignores it, its run actions' processes get it.
func (c *container) kill(sig syscall.Signal) {
	ctx, cancel := context.WithTimeout(c.b.ctx(context.Background()), cleanupTimeout)
	defer cancel()
	var opts []containerd.KillOpts
	if sig == syscall.SIGKILL || c.tree {
		opts = append(opts, containerd.WithKillAll)
	}
	err := c.whileUnavailable(ctx, func(ctx context.Context) error { return c.task.Kill(ctx, sig, opts...) })
	if err != nil && !errdefs.IsNotFound(err) {
		c.log.Warn("signal container", "signal", sig, "error", err)
	}
}

// run waits for the init process with the health monitor beside it, then cleans up. A tree
// runs its actions instead (runTree).
func (c *container) run() {
	if c.tree {
		c.runTree()
		return
	}
	monitorCtx, stopMonitor := context.WithCancel(context.Background())
	monitorDone := make(chan struct{})
	diskDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		c.monitor(monitorCtx, time.Now())
	}()
	go func() {
		defer close(diskDone)
		c.watchDisk(monitorCtx)
	}()
	st, ok := c.wait()
	stopMonitor()
	<-monitorDone
	<-diskDone
	if !ok {
		c.log.Debug("backend closed, leaving the container running")
		return
	}
	c.finish(st)
}

// rewaitInterval is how often a container whose wait broke asks containerd again.
const rewaitInterval = 200 * time.Millisecond

// wait returns the init process's exit status. A wait that breaks because containerd went
// away (restarted) is made again once it answers: the shim kept the container running. ok is
// false when the backend was closed first (the container is left running for the next rep).
func (c *container) wait() (_ containerd.ExitStatus, ok bool) {
	for {
		select {
		case st := <-c.exitCh:
			_, _, err := st.Result()
			if err == nil || errdefs.IsNotFound(err) {
				return st, true
			}
			c.log.Warn("lost containerd while waiting for the container, waiting again", "error", err)
			for {
				select {
				case <-c.b.closed:
					return st, false
				case <-time.After(rewaitInterval):
				}
				// Wait answers at once and reports a failed call on its channel: containerd is
				// back only once it answers a question about the task.
				_, err := c.task.Status(c.b.ctx(context.Background()))
				var ch <-chan containerd.ExitStatus
				if err == nil {
					ch, err = c.task.Wait(c.b.ctx(context.Background()))
				}
				if err == nil {
					c.exitCh = ch
					c.log.Info("containerd is back, container still there")
					break
				}
				if errdefs.IsNotFound(err) {
					return *containerd.NewExitStatus(containerd.UnknownExitStatus, time.Now(), err), true
				}
			}
		case <-c.b.closed:
			return containerd.ExitStatus{}, false
		}
	}
}

// monitor runs the spec's checks: against the container's address when a Network attached
// it, otherwise on 127.0.0.1 from inside its network namespace.
func (c *container) monitor(ctx context.Context, actionStart time.Time) {
	addr := func(port uint32) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))) }
	dial := dialInNetns(c.netnsPath)
	if c.attached {
		addr = func(port uint32) string {
			return net.JoinHostPort(c.netInfo.GetInstanceAddress(), strconv.Itoa(int(port)))
		}
		dial = nil
	}
	def := c.spec.Checks
	health := checks.ForChecks(def.GetChecks(), addr, dial)
	if len(health) == 0 && c.spec.Monitor != nil { // only a tree has one
		health = append(health, c.interpreter().Probe(c.spec.Monitor))
	}
	readiness := checks.ForChecks(def.GetReadinessChecks(), addr, dial)
	checks.Monitor{
		Health:       health,
		Readiness:    readiness,
		Interval:     checks.Interval(def),
		StartTimeout: c.spec.StartTimeout,
		ActionStart:  actionStart,
		Log:          checks.LogTo(c.spec.Log, def),
		Healthy:      func() { c.healthyOne.Do(func() { close(c.healthy) }) },
		SetRoutable:  c.setRoutable,
		Fail:         func(reason string) { c.beginStop(reason, c.b.cfg.KillGrace) },
	}.Run(ctx)
}

// setRoutable replaces any unread readiness state with v (only the monitor calls it).
func (c *container) setRoutable(v bool) {
	select {
	case <-c.routable:
	default:
	}
	c.routable <- v
}

// finish decides the result from the init process's exit status, then cleans up.
func (c *container) finish(st containerd.ExitStatus) {
	c.mu.Lock()
	c.stopping = true
	stopReason := c.stopReason
	c.mu.Unlock()

	code, _, waitErr := st.Result()
	oom := c.oomKilled()
	c.drainOutput()

	var res executor.Result
	switch {
	case stopReason != "":
		res = executor.Result{Failed: true, Reason: stopReason}
	case waitErr != nil:
		res = executor.Result{Failed: true, Reason: fmt.Sprintf("wait for container: %v", waitErr)}
	case oom && code != 0:
		res = executor.Result{Failed: true, Reason: ReasonOutOfMemory}
	case code != 0:
		reason := exitReason(code)
		if tail := c.tail.LastLines(maxReasonTail); tail != "" {
			reason += ": " + tail
		}
		res = executor.Result{Failed: true, Reason: reason}
	default:
		res = executor.Completed(c.spec, c.readResultFile)
	}
	c.cleanup(res)
}

// cleanup removes everything of the container (task, container, network attachment, overlay
// mount and directory), then ends it with res.
func (c *container) cleanup(res executor.Result) {
	ctx, cancel := context.WithTimeout(c.b.ctx(context.Background()), cleanupTimeout)
	defer cancel()
	if _, err := c.task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
		c.log.Warn("delete task", "error", err)
	}
	if err := c.ctr.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		c.log.Warn("delete container", "error", err)
	}
	c.detach()
	if c.b.cfg.Network != nil {
		if err := cni.RemoveNetns(c.netnsPath); err != nil {
			c.log.Warn("remove network namespace", "error", err)
		}
	}
	if err := c.ov.unmount(); err != nil {
		c.log.Warn("unmount rootfs", "error", err)
	} else if c.snapshot {
		if err := c.b.removeSnapshot(ctx, c.spec.Guid); err != nil {
			c.log.Warn("remove rootfs snapshot", "error", err)
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		c.log.Warn("remove container directory", "error", err)
	}
	if c.image != "" {
		c.b.releaseImage(c.image)
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

// detach detaches the network, if attached.
func (c *container) detach() {
	if !c.attached {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := c.b.cfg.Network.Detach(ctx, c.spec.Guid, c.netnsPath, c.ports, c.spec.Properties); err != nil {
		c.log.Warn("detach network", "error", err)
	}
	c.attached = false
}

// drainOutput waits a moment for the init's output still in the pipes, then closes them.
func (c *container) drainOutput() { drainIO(c.task.IO()) }

// drainIO waits a moment (outputDrain) for a process's output still in the pipes, then
// closes them. Closing is what ends a copier still reading (a terminal held open by another
// process, a shim that never closes its end): Cancel only stops FIFOs still opening.
func drainIO(pio cio.IO) {
	if pio == nil {
		return
	}
	drained := make(chan struct{})
	go func() { pio.Wait(); close(drained) }()
	t := time.NewTimer(outputDrain)
	defer t.Stop()
	select {
	case <-drained:
		_ = pio.Close()
	case <-t.C:
		pio.Cancel()
		_ = pio.Close()
		<-drained
	}
}

// oomKilled reports whether the kernel OOM-killed a process of the container's cgroup (read
// before the cgroup goes with the task): oom_kill in memory.oom_control (cgroup v1) or
// memory.events (v2).
func (c *container) oomKilled() bool {
	file := filepath.Join("/sys/fs/cgroup/memory", c.cgroup, "memory.oom_control")
	if c.b.cgroupV2 {
		file = filepath.Join("/sys/fs/cgroup", c.cgroup, "memory.events")
	}
	f, err := os.Open(file)
	if err != nil {
		c.log.Debug("read oom events", "error", err)
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if n, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			v, _ := strconv.Atoi(strings.TrimSpace(n))
			return v > 0
		}
	}
	return false
}

// exitReason is "exit status N", or "signal: NAME" for 128+signal (as the shell reports a
// process killed by a signal).
func exitReason(code uint32) string {
	if code > 128 && code < 128+65 {
		return "signal: " + syscall.Signal(code-128).String()
	}
	return fmt.Sprintf("exit status %d", code)
}

// readResultFile reads the task's result file from the container's root (at most
// MaxResultFileSize bytes).
func (c *container) readResultFile() (string, error) {
	// Through an os.Root: the container's process may have made the file a link to a host
	// file, which the rep, as root, must not read into the result.
	root, err := os.OpenRoot(c.ov.root)
	if err != nil {
		return "", fmt.Errorf("read result file: %w", err)
	}
	defer root.Close()
	f, err := root.Open(strings.TrimPrefix(filepath.Clean("/"+c.spec.ResultFile), "/"))
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

// namedHook names the on_create hook that runc's error "error running hook #N" is about.
func namedHook(err error, onCreate []string) error {
	msg := err.Error()
	i := strings.Index(msg, "error running hook #")
	if i < 0 {
		return err
	}
	var n int
	if _, serr := fmt.Sscanf(msg[i:], "error running hook #%d", &n); serr != nil || n < 0 || n >= len(onCreate) {
		return err
	}
	return fmt.Errorf("on_create hook %s failed: %w", onCreate[n], err)
}
