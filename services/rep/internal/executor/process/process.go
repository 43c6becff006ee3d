// Package process is the executor backend that runs a container's action tree as real
// processes on the host (docs/architecture.md §7). It is registered as "process".
//
// A container is a directory under Options.WorkDir, a set of host ports from the cell's
// range and, when cgroup v2 is writable, a cgroup under gavel/ limiting memory and pids.
// There are no network namespaces: a process listens on its host port ($PORT, and
// $PORT_<container port> for every mapping) and the instance address is the cell's address.
// Each process runs in its own process group (so signals reach its children), as the cell's
// unprivileged user unless the work is privileged, and chrooted into the resolved rootfs when
// the spec asks for it. When a process exits, whatever is left of its process group is
// killed.
//
// Limits not enforced here: disk quotas, RunAction.nofile_limit and RunAction.user (a
// process always runs as the cell's user, or keeps the rep's user when privileged).
package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/checks"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/hostports"
)

// Name is the name the backend is registered under.
const Name = "process"

// KeepContainersEnv names the environment variable that, set to "1", keeps container
// directories after the containers are done (for debugging).
const KeepContainersEnv = "GAVEL_KEEP_CONTAINERS"

// Defaults of the timings the spec leaves open.
const (
	// DefaultStartTimeout bounds how long an LRP may take to become healthy.
	DefaultStartTimeout = checks.DefaultStartTimeout
	// DefaultCheckInterval is the time between two probes of a check.
	DefaultCheckInterval = checks.DefaultCheckInterval
	// DefaultCheckTimeout bounds one probe.
	DefaultCheckTimeout = checks.DefaultCheckTimeout
	// DefaultKillGrace is how long a process may take to exit after SIGTERM when the backend
	// stops it itself (failed health check, timeout action, codependent sibling exited).
	DefaultKillGrace = 10 * time.Second
	// HealthFailureThreshold is the number of consecutive failed probes that fail a check.
	HealthFailureThreshold = checks.HealthFailureThreshold
	// MaxResultFileSize is the largest task result file read.
	MaxResultFileSize = 10 << 10
)

// defaultPath is PATH when the spec sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func init() {
	executor.Register(Name, func(opts executor.Options) (executor.Backend, error) {
		return New(opts)
	})
}

// Backend runs containers as processes on the host. It implements executor.Backend.
type Backend struct {
	opts      executor.Options
	ports     *hostports.Allocator
	cgroups   *cgroupManager // nil when limits are not enforced
	notes     []string
	cred      *syscall.Credential // nil keeps the rep's user
	keep      bool                // keep container directories
	killGrace time.Duration
	log       hclog.Logger

	mu         sync.Mutex
	containers map[string]*container
}

var _ executor.Backend = (*Backend)(nil)

// New builds a process backend from opts: WorkDir and a port range are required,
// CellAddress defaults to 127.0.0.1 and User, when set, must exist.
func New(opts executor.Options) (*Backend, error) {
	return newBackend(opts, "/sys/fs/cgroup")
}

// newBackend is New with the cgroup v2 mount point as a parameter, for tests.
func newBackend(opts executor.Options, cgroupRoot string) (*Backend, error) {
	if opts.WorkDir == "" {
		return nil, errors.New("process backend: a work directory is required")
	}
	if opts.PortRangeStart <= 0 || opts.PortRangeEnd > 65535 || opts.PortRangeStart > opts.PortRangeEnd {
		return nil, fmt.Errorf("process backend: invalid port range %d-%d", opts.PortRangeStart, opts.PortRangeEnd)
	}
	if opts.CellAddress == "" {
		opts.CellAddress = "127.0.0.1"
	}
	if err := os.MkdirAll(opts.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("process backend: create work directory: %w", err)
	}
	unignoreHangup()
	b := &Backend{
		opts:       opts,
		ports:      hostports.New(opts.PortRangeStart, opts.PortRangeEnd, hostports.Free),
		keep:       os.Getenv(KeepContainersEnv) == "1",
		killGrace:  DefaultKillGrace,
		log:        hclog.L().Named("executor.process"),
		containers: map[string]*container{},
	}
	if opts.User != "" {
		u, err := user.Lookup(opts.User)
		if err != nil {
			return nil, fmt.Errorf("process backend: look up user %q: %w", opts.User, err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("process backend: user %q: %w", opts.User, err)
		}
		switch {
		case int(uid) == os.Getuid() && int(gid) == os.Getgid():
			// Already that user.
		case os.Geteuid() != 0:
			b.notes = append(b.notes, fmt.Sprintf("processes run as the rep's user: switching to %q needs root", opts.User))
		default:
			b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		}
	}
	cg, err := newCgroupManager(cgroupRoot)
	if err != nil {
		b.notes = append(b.notes, "memory and pid limits not enforced: "+err.Error())
	} else {
		b.cgroups = cg
	}
	b.notes = append(b.notes, "disk limits not enforced")
	return b, nil
}

// Isolation is host processes: memory and pid limits where cgroups are writable, an
// unprivileged user when the rep can switch to it, chroot when the work asks for it.
func (b *Backend) Isolation() executor.Isolation {
	var enforced []string
	if b.cgroups != nil {
		enforced = append(enforced, "memory", "pids")
	}
	if b.cred != nil {
		enforced = append(enforced, "unprivileged user")
	}
	return executor.Isolation{Kind: "process", Enforced: append(enforced, "chroot when asked")}
}

// Notes lists the limits this backend does not enforce on this machine.
func (b *Backend) Notes() []string {
	return slices.Clone(b.notes)
}

// Start creates the container's directory, ports and cgroup and starts running its setup
// and action in the background.
func (b *Backend) Start(_ context.Context, spec executor.Spec) (executor.Container, error) {
	if !validGuid(spec.Guid) {
		return nil, fmt.Errorf("start container %q: invalid guid", spec.Guid)
	}
	if spec.Action == nil {
		return nil, fmt.Errorf("start container %s: no action", spec.Guid)
	}
	if spec.Chroot && spec.RootfsPath == "" {
		return nil, fmt.Errorf("start container %s: chroot without a rootfs path", spec.Guid)
	}
	b.mu.Lock()
	if _, dup := b.containers[spec.Guid]; dup {
		b.mu.Unlock()
		return nil, fmt.Errorf("start container %s: already exists", spec.Guid)
	}
	b.containers[spec.Guid] = nil // reserved while it is created
	b.mu.Unlock()

	c, err := b.create(spec)
	b.mu.Lock()
	if err != nil {
		delete(b.containers, spec.Guid)
	} else {
		b.containers[spec.Guid] = c
	}
	b.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("start container %s: %w", spec.Guid, err)
	}
	go c.run()
	return c, nil
}

// create allocates the container's resources; on error nothing is left allocated.
func (b *Backend) create(spec executor.Spec) (_ *container, err error) {
	var cleanups []func()
	defer func() {
		if err != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()

	var containerPorts []uint32
	for _, p := range spec.Ports {
		if !slices.Contains(containerPorts, p) {
			containerPorts = append(containerPorts, p)
		}
	}
	hostPorts, err := b.ports.Acquire(len(containerPorts))
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { b.ports.Release(hostPorts) })

	dir := filepath.Join(b.opts.WorkDir, spec.Guid)
	// A directory left by an earlier run of the rep (or kept for debugging) is stale.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("remove stale container directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create container directory: %w", err)
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	cred := b.cred
	if spec.Privileged {
		cred = nil
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("chown container directory: %w", err)
		}
	}

	var root string
	if spec.Chroot {
		root = spec.RootfsPath
		if err := copyResolvConf(root); err != nil {
			return nil, err
		}
	}

	var cg *cgroup
	if b.cgroups != nil {
		cg, err = b.cgroups.create(spec.Guid, spec.MemoryMB, spec.MaxPids)
		if err != nil {
			return nil, err
		}
	}

	netInfo := &modelsv1.ActualLRPNetInfo{Address: b.opts.CellAddress, InstanceAddress: b.opts.CellAddress}
	mapping := map[uint32]int{}
	for i, cp := range containerPorts {
		mapping[cp] = hostPorts[i]
		netInfo.Ports = append(netInfo.Ports, &modelsv1.PortMapping{ContainerPort: cp, HostPort: uint32(hostPorts[i])})
	}
	c := newContainer(b, spec, dir, root, cred, cg, netInfo, mapping, containerPorts)
	c.hostPorts = hostPorts
	filesRoot, filesDir, inside, err := c.makeFiles()
	if err != nil {
		if cg != nil {
			cg.destroy()
		}
		return nil, err
	}
	if filesRoot != "" {
		c.filesRoot, c.filesDir = filesRoot, filesDir
		if spec.FilesDirEnv != "" {
			c.env = append(c.env, spec.FilesDirEnv+"="+inside)
		}
	}
	return c, nil
}

// forget drops a finished container.
func (b *Backend) forget(guid string) {
	b.mu.Lock()
	delete(b.containers, guid)
	b.mu.Unlock()
}

// copyResolvConf copies the host's /etc/resolv.conf into root when root has none.
func copyResolvConf(root string) error {
	dst := filepath.Join(root, "etc", "resolv.conf")
	if _, err := os.Lstat(dst); err == nil || !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return nil // the host has none either
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("copy resolv.conf into rootfs: %w", err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		return fmt.Errorf("copy resolv.conf into rootfs: %w", err)
	}
	return nil
}

// validGuid reports whether guid can name a directory.
func validGuid(guid string) bool {
	if guid == "" || guid == "." || guid == ".." {
		return false
	}
	for _, r := range guid {
		if r == '/' || r == '\\' || r == 0 {
			return false
		}
	}
	return true
}
