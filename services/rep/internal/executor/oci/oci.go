package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/hostports"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/oci/cni"
)

// Name is the name the backend is registered under.
const Name = "oci"

// Defaults of Config.
const (
	// DefaultSocket is containerd's usual socket.
	DefaultSocket = "/run/containerd/containerd.sock"
	// DefaultNamespace is the containerd namespace of the cell's containers.
	DefaultNamespace = "gavel"
	// DefaultRuntime is containerd's runc shim.
	DefaultRuntime = "io.containerd.runc.v2"
	// DefaultCgroupParent is the cgroup every container's cgroup is created under.
	DefaultCgroupParent = "/gavel"
	// DefaultKillGrace is how long a container may take to exit after SIGTERM when the backend
	// stops it itself (failed health check).
	DefaultKillGrace = 10 * time.Second
	// MaxResultFileSize is the largest task result file read.
	MaxResultFileSize = 10 << 10
	// connectTimeout bounds connecting to containerd when the backend starts.
	connectTimeout = 10 * time.Second
)

func init() {
	executor.Register(Name, func(opts executor.Options) (executor.Backend, error) {
		cfg := Config{
			Socket:      opts.OCI.ContainerdSocket,
			Namespace:   opts.OCI.Namespace,
			Runtime:     opts.OCI.Runtime,
			WorkDir:     opts.WorkDir,
			CellAddress: opts.CellAddress,
			User:        opts.User,
			Hooks:       Hooks{OnCreate: opts.OCI.OnCreateHooks, OnDestroy: opts.OCI.OnDestroyHooks, Timeout: opts.OCI.HookTimeout},
		}
		cfg.Snapshotter, cfg.InsecureRegistries = opts.OCI.Snapshotter, opts.OCI.InsecureRegistries
		cfg.ImageUnusedFor = opts.OCI.ImageUnusedFor
		if opts.OCI.CNIConfDir != "" {
			n, err := NewCNINetwork(opts.OCI.CNIConfDir, opts.OCI.CNIBinDir,
				hostports.New(opts.PortRangeStart, opts.PortRangeEnd, hostports.Free))
			if err != nil {
				return nil, err
			}
			cfg.Network = n
		}
		return New(cfg)
	})
}

// NewCNINetwork is the Network of the CNI configuration in confDir (the bridge + host-local +
// portmap chain of cni.Default when confDir holds none), its plugins in binDir (empty: the
// default directories), host ports taken from ports. It fails naming what is missing.
func NewCNINetwork(confDir, binDir string, ports *hostports.Allocator) (Network, error) {
	cfg := cni.Default()
	cfg.ConfDir = confDir
	if binDir != "" {
		cfg.BinDirs = []string{binDir}
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	n, err := cni.New(ctx, cfg, hostports.Uint32{Allocator: ports})
	if err != nil {
		return nil, fmt.Errorf("oci backend: CNI network: %w", err)
	}
	return cniNetwork{n}, nil
}

// cniNetwork is the CNI package's network as the backend's Network.
type cniNetwork struct{ n *cni.Network }

// Attach attaches the pinned namespace at netnsPath, a host port for each container port.
func (c cniNetwork) Attach(ctx context.Context, id, netnsPath string, ports []uint32, props map[string]string) (Attachment, error) {
	att, err := c.n.Attach(ctx, cni.AttachRequest{ContainerID: id, NetnsPath: netnsPath, Ports: ports, Properties: props})
	if err != nil {
		return Attachment{}, err
	}
	out := Attachment{Address: att.IP, Ports: make(map[uint32]uint32, len(att.Ports))}
	for _, m := range att.Ports {
		out.Ports[m.ContainerPort] = m.HostPort
	}
	return out, nil
}

// Detach undoes Attach with what the plugins were given then (libcni's cache).
func (c cniNetwork) Detach(ctx context.Context, id, netnsPath string, _ []uint32, _ map[string]string) error {
	return c.n.Detach(ctx, id, netnsPath, nil)
}

// Adopt takes over the attachment libcni cached for id, reserving its host ports.
func (c cniNetwork) Adopt(_ context.Context, id, netnsPath string) (Attachment, bool, error) {
	att, ok, err := c.n.Adopt(id, netnsPath)
	if err != nil || !ok {
		return Attachment{}, ok, err
	}
	out := Attachment{Address: att.IP, Ports: make(map[uint32]uint32, len(att.Ports))}
	for _, m := range att.Ports {
		out.Ports[m.ContainerPort] = m.HostPort
	}
	return out, true, nil
}

// Network attaches a container's network namespace to a network (the CNI package implements
// it). Without one, containers have a network namespace with loopback only.
type Network interface {
	// Attach connects the network namespace at netnsPath of container id, mapping ports, with
	// the work's properties handed to the network's plugins.
	Attach(ctx context.Context, id, netnsPath string, ports []uint32, props map[string]string) (Attachment, error)
	// Detach disconnects it again (idempotent).
	Detach(ctx context.Context, id, netnsPath string, ports []uint32, props map[string]string) error
	// Adopt takes over the attachment of container id that an earlier run of the rep made
	// (its host ports are reserved again and Detach gives them back); ok is false when the
	// network has no attachment of id.
	Adopt(ctx context.Context, id, netnsPath string) (att Attachment, ok bool, err error)
}

// Attachment is where an attached container is reached.
type Attachment struct {
	// Address is the container's own address.
	Address string
	// Ports maps container ports to host ports.
	Ports map[uint32]uint32
}

// Config configures the backend.
type Config struct {
	// Socket is containerd's gRPC socket (DefaultSocket when empty).
	Socket string
	// Namespace is the containerd namespace (DefaultNamespace when empty).
	Namespace string
	// Runtime is the containerd runtime (DefaultRuntime when empty).
	Runtime string
	// WorkDir holds per-container directories (overlay upper, work and mount point). Required.
	WorkDir string
	// CellAddress is the cell's address (127.0.0.1 when empty).
	CellAddress string
	// User is who run actions without a user run as (a user of the rootfs, "uid" or
	// "uid:gid"); empty means nobody.
	User string
	// CgroupParent is the cgroup containers are created under (DefaultCgroupParent when empty).
	CgroupParent string
	// Network, when set, networks every container; nil keeps them on loopback.
	Network Network
	// NetnsDir is where network namespaces are pinned for a Network (cni.NetnsDir when empty).
	NetnsDir string
	// KillGrace is DefaultKillGrace when zero.
	KillGrace time.Duration
	// Hooks are the cell's container hooks, run as OCI hooks of every container.
	Hooks Hooks
	// DiskInterval is how often a container's writable layer is measured against its disk_mb
	// (DefaultDiskInterval when zero).
	DiskInterval time.Duration
	// Snapshotter unpacks docker:// images and holds containers' writable layers on them
	// (DefaultSnapshotter when empty).
	Snapshotter string
	// InsecureRegistries lets image pulls talk plain HTTP to any registry (loopback and
	// private addresses get plain HTTP anyway, as in the docker rootfs provider).
	InsecureRegistries bool
	// ImageUnusedFor is how long a pulled docker:// image that no container of the cell uses
	// is kept before it is removed from containerd's store (DefaultImageUnusedFor when zero;
	// negative: kept for ever).
	ImageUnusedFor time.Duration
	// ImageGCInterval is the time between two sweeps for unused images (zero: a fifth of
	// ImageUnusedFor, between 1s and 1m).
	ImageGCInterval time.Duration
	// Logger is hclog.L() when nil.
	Logger hclog.Logger
}

// Backend runs containers through containerd. It implements executor.Backend.
type Backend struct {
	cfg       Config
	client    *containerd.Client
	limitSwap bool
	cgroupV2  bool
	notes     []string
	log       hclog.Logger

	closed    chan struct{} // closed by Close
	closeOnce sync.Once

	mu         sync.Mutex
	containers map[string]*container
	pulls      map[string]*pullLock // image reference → its pull (lockPull)
	// imageUsers counts the containers of each image reference (useImage); imageUnused is
	// since when an image without one has been unused (imagegc.go).
	imageUsers  map[string]int
	imageUnused map[string]time.Time
}

var _ executor.Backend = (*Backend)(nil)

// Check reports what is missing to run the backend with socket: containerd's socket (not
// there, or not a socket) or runc on PATH. It is what a rep checks before starting.
func Check(socket string) error {
	if socket == "" {
		socket = DefaultSocket
	}
	var errs []error
	if st, err := os.Stat(socket); err != nil {
		errs = append(errs, fmt.Errorf("containerd socket: %w (is containerd running? apt-get install containerd)", err))
	} else if st.Mode()&os.ModeSocket == 0 {
		errs = append(errs, fmt.Errorf("containerd socket %s is not a socket", socket))
	}
	if _, err := exec.LookPath("runc"); err != nil {
		errs = append(errs, fmt.Errorf("runc: %w (apt-get install runc)", err))
	}
	return errors.Join(errs...)
}

// New connects to containerd and returns the backend. It fails when the socket or runc is
// missing or containerd does not answer.
func New(cfg Config) (*Backend, error) {
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Runtime == "" {
		cfg.Runtime = DefaultRuntime
	}
	if cfg.CellAddress == "" {
		cfg.CellAddress = "127.0.0.1"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = DefaultSnapshotter
	}
	if cfg.ImageUnusedFor == 0 {
		cfg.ImageUnusedFor = DefaultImageUnusedFor
	}
	if cfg.DiskInterval <= 0 {
		cfg.DiskInterval = DefaultDiskInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.L()
	}
	if cfg.WorkDir == "" {
		return nil, errors.New("oci backend: a work directory is required")
	}
	if err := Check(cfg.Socket); err != nil {
		return nil, fmt.Errorf("oci backend: %w", err)
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("oci backend: create work directory: %w", err)
	}
	client, err := containerd.New(cfg.Socket, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(connectTimeout))
	if err != nil {
		return nil, fmt.Errorf("oci backend: connect to containerd at %s: %w", cfg.Socket, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if _, err := client.Version(ctx); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("oci backend: containerd at %s does not answer: %w", cfg.Socket, err)
	}
	b := &Backend{
		cfg:         cfg,
		client:      client,
		log:         cfg.Logger.Named("executor.oci"),
		containers:  map[string]*container{},
		closed:      make(chan struct{}),
		imageUsers:  map[string]int{},
		imageUnused: map[string]time.Time{},
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		b.cgroupV2 = true
	} else if _, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"); err == nil {
		b.limitSwap = true
	}
	go b.collectImages()
	if cfg.Network == nil {
		b.notes = append(b.notes, "no container network: instances have loopback only and are not reachable from outside")
	}
	return b, nil
}

// netnsDir is where containers' network namespaces are pinned.
func (b *Backend) netnsDir() string {
	if b.cfg.NetnsDir != "" {
		return b.cfg.NetnsDir
	}
	return cni.NetnsDir
}

// fileExists reports whether path exists.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Close closes the connection to containerd. The containers keep running (containerd's shims
// hold them) and their watchers end without cleaning up: the next rep adopts them (Adopt).
func (b *Backend) Close() error {
	b.closeOnce.Do(func() { close(b.closed) })
	return b.client.Close()
}

// Isolation is an OCI container per instance: namespaces, cgroup limits, rlimits, a user, and
// its own address when a Network attaches it.
func (b *Backend) Isolation() executor.Isolation {
	enforced := []string{"pid, mount, uts, ipc and network namespaces", "memory", "pids", "cpu shares", "nofile", "user", "disk (writable layer, measured)"}
	if b.cfg.Network != nil {
		enforced = append(enforced, "own network address (CNI)")
	}
	return executor.Isolation{Kind: Name, Enforced: enforced}
}

// RunsHooks reports that the backend runs the cell's container hooks itself, as OCI hooks
// (executor.HookRunner).
func (b *Backend) RunsHooks() bool { return true }

var _ executor.HookRunner = (*Backend)(nil)

// Notes lists what this backend does not do on this machine.
func (b *Backend) Notes() []string { return slices.Clone(b.notes) }

// ctx is a context in the backend's containerd namespace.
func (b *Backend) ctx(parent context.Context) context.Context {
	return namespaces.WithNamespace(parent, b.cfg.Namespace)
}

// Start creates the container (overlay, containerd container, task, network) and starts its
// run action; a failure leaves nothing behind.
func (b *Backend) Start(ctx context.Context, spec executor.Spec) (executor.Container, error) {
	if !validGuid(spec.Guid) {
		return nil, fmt.Errorf("start container %q: invalid guid", spec.Guid)
	}
	if IsTree(spec) {
		if err := checkTree(spec); err != nil {
			return nil, fmt.Errorf("start container %s: %w", spec.Guid, err)
		}
	} else if _, err := MainProcess(spec); err != nil {
		return nil, fmt.Errorf("start container %s: %w", spec.Guid, err)
	}
	if spec.RootfsPath == "" && !isImage(spec) {
		return nil, fmt.Errorf("start container %s: the oci backend needs a rootfs directory or a docker:// image (got %q)", spec.Guid, spec.Rootfs)
	}
	b.mu.Lock()
	if _, dup := b.containers[spec.Guid]; dup {
		b.mu.Unlock()
		return nil, fmt.Errorf("start container %s: already exists", spec.Guid)
	}
	b.containers[spec.Guid] = nil // reserved while it is created
	b.mu.Unlock()

	c, err := b.create(ctx, spec)
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

// forget drops a finished container.
func (b *Backend) forget(guid string) {
	b.mu.Lock()
	delete(b.containers, guid)
	b.mu.Unlock()
}

// containerDir is the host directory of container guid.
func (b *Backend) containerDir(guid string) string { return filepath.Join(b.cfg.WorkDir, guid) }

// validGuid reports whether guid can name a directory and a containerd container.
func validGuid(guid string) bool {
	if guid == "" || len(guid) > 76 {
		return false
	}
	for i, r := range guid {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || (i > 0 && (r == '-' || r == '_' || r == '.'))
		if !ok {
			return false
		}
	}
	return true
}
