// Package rep is Gavel's cell agent. Run registers the cell's presence in etcd under a lease,
// serves gavel.rep.v1.RepService (State, Perform, StopLRPInstance, CancelTask, Evacuate) to the
// auctioneer and the BBS, runs the work it accepts through an executor backend, reports every
// lifecycle step to the BBS, and reconciles its containers with the BBS periodically.
package rep

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/authz"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/config"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/serviceconfig"
	"github.com/gavel-sched/gavel/services/rep/internal/api"
	"github.com/gavel-sched/gavel/services/rep/internal/cell"
	"github.com/gavel-sched/gavel/services/rep/internal/drain"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/oci"
	"github.com/gavel-sched/gavel/services/rep/internal/logs"
	"github.com/gavel-sched/gavel/services/rep/internal/presence"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs"
)

// Backends the rep can run containers with.
const (
	// BackendProcess runs the action tree as real processes on the host.
	BackendProcess = "process"
	// BackendSim simulates containers, for scale tests.
	BackendSim = "sim"
	// BackendOCI runs every container as an OCI container through containerd and runc.
	BackendOCI = "oci"
)

// StopGrace is how long a stopped container's processes get before they are killed.
const StopGrace = 10 * time.Second

// Config is the rep's configuration. Fields are set from a JSON config file and flags.
type Config struct {
	// CellID identifies the cell (letters, digits, '-', '_' and '.').
	CellID string `json:"cell_id"`
	// Zone is the cell's availability zone.
	Zone string `json:"zone"`
	// Tags are the cell's placement tags; case-insensitive, stored lower-cased, each shorter
	// than 64 characters.
	Tags []string `json:"tags"`
	// PreloadedRootfses maps a preloaded rootfs name to its directory on the cell, e.g.
	// {"cflinuxfs4": "/var/gavel/rootfs/cflinuxfs4"}; work asks for it as preloaded:NAME.
	PreloadedRootfses map[string]string `json:"preloaded_rootfses"`
	// SupportedRootfsProviders are the rootfs URI schemes the cell fetches, e.g. ["docker"].
	SupportedRootfsProviders []string `json:"supported_rootfs_providers"`
	// Capacity is what the cell offers to work.
	Capacity Capacity `json:"capacity"`
	// Backend runs containers: "process" (real processes), "oci" (containers through
	// containerd and runc) or "sim" (simulated).
	Backend string `json:"backend"`
	// Base is where the rep's gRPC API listens and its TLS, log, metrics_address and authz.
	serviceconfig.Base
	// Etcd is the etcd client the presence is written with: etcd_endpoints and etcd_tls. The
	// rep elects no leader.
	serviceconfig.Etcd
	// AdvertiseAddress is the host:port registered as the cell's rep_address; empty means the
	// bound listen address (with cell_address as host when listening on all interfaces).
	AdvertiseAddress string `json:"advertise_address"`
	// CellAddress is the address instances are reached on (net_info.address).
	CellAddress string `json:"cell_address"`
	// Config is how the service reaches the BBS: bbs_address (or bbs_addresses) and bbs_tls.
	bbsclient.Config
	// LeaseTTL is the TTL of the presence's lease: the cell disappears this long after the rep
	// stops refreshing it (at least 1s; etcd may raise very small values).
	LeaseTTL Duration `json:"lease_ttl"`
	// PortRange is the inclusive range host ports are taken from, "61000-61999".
	PortRange string `json:"port_range"`
	// WorkDir holds per-container directories and the rootfs cache.
	WorkDir string `json:"work_dir"`
	// RunAsUser is the unprivileged user processes drop to; empty keeps the rep's user.
	RunAsUser string `json:"run_as_user"`
	// ChrootPreloaded runs processes of preloaded rootfses chrooted into their directory
	// (needs root).
	ChrootPreloaded bool `json:"chroot_preloaded"`
	// InsecureRegistries lets the docker provider talk plain HTTP to registries.
	InsecureRegistries bool `json:"insecure_registries"`
	// Hooks are executables run around every container with its spec as JSON on stdin.
	Hooks HooksConfig `json:"hooks"`
	// Sim tunes the sim backend.
	Sim SimConfig `json:"sim"`
	// OCI configures the oci backend.
	OCI OCIConfig `json:"oci"`
	// BulkInterval is how often the rep reconciles its containers with the BBS.
	BulkInterval Duration `json:"bulk_interval"`
	// EvacuationTimeout bounds an evacuation; instances still held then are stopped.
	EvacuationTimeout Duration `json:"evacuation_timeout"`
	// Logs configures the capture of containers' output on the cell (work_dir/logs).
	Logs LogsConfig `json:"logs"`
	// Metrics configures the sampling of every container's resource use.
	Metrics MetricsConfig `json:"metrics"`
}

// MetricsConfig configures the sampling of containers' CPU, memory and disk use (served by
// InstanceMetrics and as container_* series on /metrics).
type MetricsConfig struct {
	// SampleInterval is how often every container is measured; a CPU percentage is the use
	// over one interval.
	SampleInterval Duration `json:"sample_interval"`
}

// LogsConfig configures the cell's log store (see services/rep/README.md, "Logs").
type LogsConfig struct {
	// MaxFileBytes bounds each of a container's two log files (the current one and the
	// rotated one), so a container keeps at most twice this on disk.
	MaxFileBytes int64 `json:"max_file_bytes"`
	// Retention is how long the lines of a container the cell no longer holds are kept (a
	// restarted rep serves them meanwhile).
	Retention Duration `json:"retention"`
	// DrainCAFile is a PEM file of the CAs that syslog-tls drains' certificates are verified
	// against (empty: the system roots).
	DrainCAFile string `json:"drain_ca_file"`
}

// Capacity is the cell's total capacity.
type Capacity struct {
	// MemoryMB is the memory in mebibytes.
	MemoryMB int32 `json:"memory_mb"`
	// DiskMB is the disk in mebibytes.
	DiskMB int32 `json:"disk_mb"`
	// Containers is how many containers the cell runs at once.
	Containers int32 `json:"containers"`
}

// HooksConfig lists container hooks.
type HooksConfig struct {
	// OnCreate are run, in order, before a container starts; a failing hook fails the
	// container.
	OnCreate []string `json:"on_create"`
	// OnDestroy are run, in order, after a container stopped; failures are logged.
	OnDestroy []string `json:"on_destroy"`
	// Timeout bounds each hook run.
	Timeout Duration `json:"timeout"`
}

// SimConfig tunes the sim backend.
type SimConfig struct {
	// StartLatency is how long a simulated container takes to become healthy (or a task to
	// complete).
	StartLatency Duration `json:"start_latency"`
	// CrashRate is the probability per second that a simulated LRP crashes (0 to 1).
	CrashRate float64 `json:"crash_rate"`
	// LogInterval is how often a simulated container writes a synthetic log line (0: never).
	LogInterval Duration `json:"log_interval"`
	// Cells, when more than 1, makes this process a sim host running that many simulated cells
	// (SimHost), for scale runs of the deployed binaries: cell i is cell_id-000i, with its own
	// listener (listen_address must be host:0), work directory and presence, and {cell} in the
	// certificate and key paths is replaced by its id.
	Cells int `json:"cells,omitempty"`
}

// OCIConfig configures the oci backend (containerd + runc; see services/rep/README.md).
type OCIConfig struct {
	// ContainerdSocket is containerd's gRPC socket.
	ContainerdSocket string `json:"containerd_socket"`
	// Namespace is the containerd namespace the cell's containers live in.
	Namespace string `json:"namespace"`
	// Runtime is the containerd runtime (shim) containers run with.
	Runtime string `json:"runtime"`
	// CNIConfDir holds the CNI network configuration that networks every container (its
	// .conflist named "gavel"; without one, a bridge + host-local + portmap chain on
	// 10.255.0.0/16, see services/rep/README.md): each container gets its own address and a
	// host port per container port. Empty gives containers a network namespace with loopback
	// only (not reachable from outside).
	CNIConfDir string `json:"cni_conf_dir"`
	// CNIBinDir holds the CNI plugins (empty: /usr/lib/cni, then /opt/cni/bin).
	CNIBinDir string `json:"cni_bin_dir"`
	// Snapshotter is the containerd snapshotter that unpacks docker:// images and holds each
	// container's writable layer on them (empty: overlayfs).
	Snapshotter string `json:"snapshotter"`
	// ImageGCUnusedFor is how long a pulled docker:// image that no container of the cell uses
	// stays in containerd's store before the rep removes it (its content and layer snapshots
	// go with it); 0 keeps unused images for ever. Default 10m.
	ImageGCUnusedFor Duration `json:"image_gc_unused_for"`
}

// Duration is a time.Duration written as a string ("10s") in config files and flags.
type Duration = config.Duration

// DefaultLeaseTTL is lease_ttl's default: a cell disappears 10 s after its rep stops renewing
// its presence.
const DefaultLeaseTTL = 10 * time.Second

// MaxRenewalsPerSecond is the rate of presence renewals a cluster's cells should keep under:
// a rep renews a third of lease_ttl after each renewal, so n cells renew 3n/lease_ttl times a
// second, every one a call over TLS to the etcd leader. At 5,000 cells and the default TTL that
// is 1,500 a second, which took much of one etcd member's CPU and left renewals waiting behind
// the writes (docs/performance.md); LeaseTTLFor sizes the TTL to stay under this rate.
const MaxRenewalsPerSecond = 500

// LeaseTTLFor is the lease_ttl for a cluster of cells: DefaultLeaseTTL, or longer, in whole
// seconds, so that all its cells renew at most MaxRenewalsPerSecond times a second (10 s up to
// 1,666 cells, 30 s for 5,000). Nomad sizes its clients' heartbeat TTL with the cluster in the
// same way. A longer TTL is also a longer wait before a dead cell's instances are replaced.
func LeaseTTLFor(cells int) time.Duration {
	perCell := presence.RenewalsPerTTL * time.Second / MaxRenewalsPerSecond // the TTL each cell adds
	ttl := time.Duration(cells) * perCell
	if r := ttl % time.Second; r != 0 {
		ttl += time.Second - r
	}
	return max(DefaultLeaseTTL, ttl)
}

// RenewalsPerSecond is how many presence renewals cells with leases of ttl send etcd a second.
func RenewalsPerSecond(cells int, ttl time.Duration) float64 {
	return float64(cells) * presence.RenewalsPerTTL / ttl.Seconds()
}

// Default is the configuration of a process-backend rep next to a local BBS and etcd.
func Default() Config {
	return Config{
		Capacity:    Capacity{MemoryMB: 8192, DiskMB: 65536, Containers: 250},
		Backend:     BackendProcess,
		Base:        serviceconfig.DefaultBase("127.0.0.1:1800"),
		Etcd:        serviceconfig.DefaultEtcd(),
		CellAddress: "127.0.0.1",
		Config:      bbsclient.Default(),
		LeaseTTL:    Duration(DefaultLeaseTTL),
		PortRange:   "61000-61999",
		WorkDir:     filepath.Join(os.TempDir(), "gavel-rep"),
		Hooks:       HooksConfig{Timeout: Duration(30 * time.Second)},
		Sim:         SimConfig{StartLatency: Duration(500 * time.Millisecond), LogInterval: Duration(5 * time.Second)},
		OCI: OCIConfig{
			ContainerdSocket: oci.DefaultSocket,
			Namespace:        oci.DefaultNamespace,
			Runtime:          oci.DefaultRuntime,
			ImageGCUnusedFor: Duration(oci.DefaultImageUnusedFor),
		},
		BulkInterval:      Duration(30 * time.Second),
		EvacuationTimeout: Duration(10 * time.Minute),
		Logs:              LogsConfig{MaxFileBytes: logs.DefaultMaxFileBytes, Retention: Duration(logs.DefaultRetention)},
		Metrics:           MetricsConfig{SampleInterval: Duration(cell.DefaultSampleInterval)},
	}
}

// LoadFile overlays the JSON config file at path on c.
func (c *Config) LoadFile(path string) error { return config.LoadJSON(path, c) }

// normalizedTags lower-cases, de-duplicates and sorts tags.
func normalizedTags(tags []string) []string {
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		out = append(out, strings.ToLower(strings.TrimSpace(t)))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ParsePortRange parses "start-end" (inclusive).
func ParsePortRange(s string) (start, end int, err error) { return config.ParsePortRange(s) }

// presence is the CellPresence this configuration registers, with repAddress.
func (c Config) presence(repAddress string) *modelsv1.CellPresence {
	preloaded := map[string]string{}
	for k, v := range c.PreloadedRootfses {
		preloaded[k] = v
	}
	return &modelsv1.CellPresence{
		CellId:            c.CellID,
		RepAddress:        repAddress,
		Zone:              c.Zone,
		Capacity:          &modelsv1.CellCapacity{MemoryMb: c.Capacity.MemoryMB, DiskMb: c.Capacity.DiskMB, Containers: c.Capacity.Containers},
		PlacementTags:     normalizedTags(c.Tags),
		PreloadedRootfses: preloaded,
		RootfsProviders:   append([]string(nil), c.SupportedRootfsProviders...),
		Address:           c.CellAddress,
	}
}

// Validate reports every problem that would stop the rep from starting.
func (c Config) Validate() error {
	errs := []error{c.Base.Validate(), c.Etcd.Validate()}
	// The presence check covers the cell id, tags (lower-cased), preloaded rootfses and
	// providers; the rep address is checked below.
	if err := models.ValidateCellPresence("cell", c.presence("127.0.0.1:1")); err != nil {
		errs = append(errs, err)
	}
	if c.Capacity.MemoryMB <= 0 || c.Capacity.DiskMB <= 0 || c.Capacity.Containers <= 0 {
		errs = append(errs, fmt.Errorf("capacity: memory_mb, disk_mb and containers must be positive, got %+v", c.Capacity))
	}
	switch c.Backend {
	case BackendProcess, BackendSim:
	case BackendOCI:
		errs = append(errs, c.OCI.validate())
	default:
		errs = append(errs, fmt.Errorf("backend must be %q, %q or %q, got %q", BackendProcess, BackendOCI, BackendSim, c.Backend))
	}
	if c.AdvertiseAddress != "" {
		if host, port, err := net.SplitHostPort(c.AdvertiseAddress); err != nil || host == "" || port == "" || port == "0" {
			errs = append(errs, fmt.Errorf("advertise_address must be host:port, got %q", c.AdvertiseAddress))
		}
	}
	if c.CellAddress == "" {
		errs = append(errs, errors.New("cell_address is required"))
	}
	if err := c.Config.Validate(); err != nil { // the BBS client's fields
		errs = append(errs, err)
	}
	if time.Duration(c.LeaseTTL) < time.Second {
		errs = append(errs, fmt.Errorf("lease_ttl must be at least 1s, got %s", time.Duration(c.LeaseTTL)))
	}
	if _, _, err := ParsePortRange(c.PortRange); err != nil {
		errs = append(errs, fmt.Errorf("port_range: %w", err))
	}
	if c.WorkDir == "" {
		errs = append(errs, errors.New("work_dir is required"))
	}
	for _, hooks := range []struct {
		name  string
		paths []string
	}{{"hooks.on_create", c.Hooks.OnCreate}, {"hooks.on_destroy", c.Hooks.OnDestroy}} {
		for i, p := range hooks.paths {
			if err := checkExecutable(p); err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %w", hooks.name, i, err))
			}
		}
	}
	if c.Hooks.Timeout <= 0 {
		errs = append(errs, errors.New("hooks.timeout must be positive"))
	}
	if c.OCI.ImageGCUnusedFor < 0 {
		errs = append(errs, errors.New("oci.image_gc_unused_for must not be negative"))
	}
	if c.Sim.StartLatency < 0 {
		errs = append(errs, errors.New("sim.start_latency must not be negative"))
	}
	if c.Sim.LogInterval < 0 {
		errs = append(errs, errors.New("sim.log_interval must not be negative"))
	}
	if c.Logs.MaxFileBytes < 4096 {
		errs = append(errs, fmt.Errorf("logs.max_file_bytes must be at least 4096, got %d", c.Logs.MaxFileBytes))
	}
	if c.Logs.Retention <= 0 {
		errs = append(errs, errors.New("logs.retention must be positive"))
	}
	if c.Metrics.SampleInterval < Duration(100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("metrics.sample_interval must be at least 100ms, got %s", time.Duration(c.Metrics.SampleInterval)))
	}
	if err := c.simCells(); err != nil {
		errs = append(errs, err)
	}
	if c.Sim.CrashRate < 0 || c.Sim.CrashRate > 1 {
		errs = append(errs, fmt.Errorf("sim.crash_rate must be between 0 and 1, got %v", c.Sim.CrashRate))
	}
	if c.BulkInterval <= 0 {
		errs = append(errs, errors.New("bulk_interval must be positive"))
	}
	if c.EvacuationTimeout <= 0 {
		errs = append(errs, errors.New("evacuation_timeout must be positive"))
	}
	return errors.Join(errs...)
}

// validate reports what stops an oci backend: an empty namespace or runtime, a missing
// containerd socket or runc (a missing CNI plugin is found when the network is loaded).
func (o OCIConfig) validate() error {
	var errs []error
	if o.Namespace == "" {
		errs = append(errs, errors.New("oci.namespace is required"))
	}
	if o.Runtime == "" {
		errs = append(errs, errors.New("oci.runtime is required"))
	}
	if err := oci.Check(o.ContainerdSocket); err != nil {
		errs = append(errs, fmt.Errorf("backend oci: %w", err))
	}
	return errors.Join(errs...)
}

// checkExecutable fails unless path is an executable regular file.
func checkExecutable(path string) error {
	if path == "" {
		return errors.New("path is empty")
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("hook: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("hook %s is not an executable file", path)
	}
	return nil
}

// backendOptions are the executor options this configuration gives the backend.
func backendOptions(c Config) executor.Options {
	start, end, _ := ParsePortRange(c.PortRange)
	return executor.Options{
		CellAddress:     c.CellAddress,
		PortRangeStart:  start,
		PortRangeEnd:    end,
		WorkDir:         filepath.Join(c.WorkDir, "containers"),
		User:            c.RunAsUser,
		SimStartLatency: time.Duration(c.Sim.StartLatency),
		SimCrashRate:    c.Sim.CrashRate,
		SimLogInterval:  time.Duration(c.Sim.LogInterval),
		OCI: executor.OCIOptions{
			ContainerdSocket: c.OCI.ContainerdSocket,
			Namespace:        c.OCI.Namespace,
			Runtime:          c.OCI.Runtime,
			CNIConfDir:       c.OCI.CNIConfDir,
			CNIBinDir:        c.OCI.CNIBinDir,
			OnCreateHooks:    c.Hooks.OnCreate,
			OnDestroyHooks:   c.Hooks.OnDestroy,
			HookTimeout:      time.Duration(c.Hooks.Timeout),
			Snapshotter:      c.OCI.Snapshotter,
			ImageUnusedFor:   imageUnusedFor(c.OCI.ImageGCUnusedFor),
			// The docker provider's setting: the backend pulls images itself.
			InsecureRegistries: c.InsecureRegistries,
		},
	}
}

// imageUnusedFor is oci.image_gc_unused_for as the backend's setting: 0 (keep for ever) is
// negative there, where 0 is its default.
func imageUnusedFor(d Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return time.Duration(d)
}

// newResolver builds the rootfs resolver for c: for the sim backend one that only checks names
// and schemes (nothing is fetched), otherwise the real one (preloaded directories, docker
// images fetched into work_dir/rootfs). On an oci cell docker:// images are left to the
// backend, which pulls them into containerd's content store (imagePassThrough).
func newResolver(c Config) (cell.Resolver, error) {
	if c.Backend == BackendSim {
		return cell.NewStaticResolver(c.PreloadedRootfses, c.SupportedRootfsProviders), nil
	}
	r, err := rootfs.NewResolver(rootfs.Config{
		Preloaded:          c.PreloadedRootfses,
		Providers:          c.SupportedRootfsProviders,
		CacheDir:           filepath.Join(c.WorkDir, "rootfs"),
		ChrootPreloaded:    c.ChrootPreloaded,
		InsecureRegistries: c.InsecureRegistries,
	})
	if err != nil {
		return nil, fmt.Errorf("rootfs resolver: %w", err)
	}
	if c.Backend == BackendOCI {
		return imagePassThrough{rootfsAdapter{r}}, nil
	}
	return rootfsAdapter{r}, nil
}

// imagePassThrough resolves preloaded rootfses as its resolver does and hands docker:// URIs
// to the backend unresolved (no directory), once their reference parses: the oci backend
// pulls them into containerd's content store and unpacks them with its snapshotter.
type imagePassThrough struct{ rootfsAdapter }

// Resolve resolves uri for one container; a docker:// URI resolves to no directory.
func (p imagePassThrough) Resolve(ctx context.Context, uri, containerGuid string, auth cell.ImageAuth) (cell.Rootfs, error) {
	if !p.Supports(uri) {
		return p.rootfsAdapter.Resolve(ctx, uri, containerGuid, auth) // says why
	}
	if r, err := models.ParseRootfs(uri); err == nil && r.Scheme == rootfs.SchemeDocker {
		if _, err := p.r.DockerReference(uri); err != nil {
			return cell.Rootfs{}, fmt.Errorf("resolve rootfs %q: %w", uri, err)
		}
		return cell.Rootfs{}, nil
	}
	return p.rootfsAdapter.Resolve(ctx, uri, containerGuid, auth)
}

// rootfsAdapter makes a *rootfs.Resolver a cell.Resolver.
type rootfsAdapter struct{ r *rootfs.Resolver }

// Supports reports whether the resolver can provide uri.
func (a rootfsAdapter) Supports(uri string) bool { return a.r.Supports(uri) }

// Resolve resolves uri for one container.
func (a rootfsAdapter) Resolve(ctx context.Context, uri, containerGuid string, auth cell.ImageAuth) (cell.Rootfs, error) {
	rfs, err := a.r.Resolve(ctx, uri, containerGuid, rootfs.Auth(auth))
	if err != nil {
		return cell.Rootfs{}, err
	}
	return cell.Rootfs{Path: rfs.Path, Chroot: rfs.Chroot, Release: rfs.Release}, nil
}

// Service is a running rep.
type Service struct {
	cfg           Config
	log           hclog.Logger
	cell          *cell.Cell
	logs          *logs.Store
	server        *grpcx.Server
	handlers      *api.Server
	presence      *presence.Presence
	metricsServer *metrics.Server // nil without metrics_address
}

// New builds a rep from cfg: the work directory, the executor backend cfg.Backend names, the
// rootfs resolver, its cell over the BBS client, its gRPC API, and its presence in etcd. Run
// starts it.
func New(cfg Config, logger hclog.Logger, etcd *clientv3.Client, bbs bbsv1.BBSServiceClient) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("rep config: %w", err)
	}
	if etcd == nil || bbs == nil {
		return nil, errors.New("rep: etcd and bbs clients are required")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("work dir: %w", err)
	}
	backend, err := newBackend(cfg)
	if err != nil {
		return nil, fmt.Errorf("executor backend: %w", err)
	}
	resolver, err := newResolver(cfg)
	if err != nil {
		return nil, err
	}
	// A sim cell's containers are simulated: their lines stay in memory (logs.Options.Memory).
	store, err := logs.New(logs.Options{Dir: filepath.Join(cfg.WorkDir, "logs"), MaxFileBytes: cfg.Logs.MaxFileBytes,
		Retention: time.Duration(cfg.Logs.Retention), Memory: cfg.Backend == BackendSim})
	if err != nil {
		return nil, err
	}
	cfg.Tags = normalizedTags(cfg.Tags)
	var c *cell.Cell
	s := &Service{cfg: cfg, log: logger}
	m := newServiceMetrics(func() cell.Stats { return c.Stats() })
	m.watchLogs(store)
	drainTLS, err := drainTLSConfig(cfg.Logs.DrainCAFile)
	if err != nil {
		return nil, err
	}
	drains := &cell.Drains{TLS: drainTLS, Counters: &drain.Counters{}}
	m.watchDrains(drains.Counters)
	m.watchContainers(func() []*repv1.ContainerMetrics { return c.ContainerMetrics(logs.Filter{}, true) })
	c = cell.New(cell.Config{
		CellID:    cfg.CellID,
		Zone:      cfg.Zone,
		Capacity:  &modelsv1.CellCapacity{MemoryMb: cfg.Capacity.MemoryMB, DiskMb: cfg.Capacity.DiskMB, Containers: cfg.Capacity.Containers},
		Tags:      cfg.Tags,
		Preloaded: cfg.PreloadedRootfses,
		Providers: cfg.SupportedRootfsProviders,
		Hooks: cell.Hooks{
			OnCreate:  cfg.Hooks.OnCreate,
			OnDestroy: cfg.Hooks.OnDestroy,
			Timeout:   time.Duration(cfg.Hooks.Timeout),
		},
		StopGrace:         StopGrace,
		EvacuationTimeout: time.Duration(cfg.EvacuationTimeout),
		Logger:            logger.Named("cell"),
		Observer:          m,
		PresenceHeld:      func() bool { return s.presence.Held() }, // set below, before Run
		Logs:              store,
		Drains:            drains,
	}, bbs, backend, resolver)
	audit := logger.Named("audit")
	authorizer := authz.New(cfg.Authz, Policy, audit)
	users := UserRecheck(audit)
	server, err := grpcx.NewServer(grpcx.ServerConfig{ListenAddress: cfg.ListenAddress, TLS: cfg.TLS}, logger.Named("grpc"),
		grpcx.WithUnaryInterceptors(authorizer.Unary(), users.Unary(), rpcerr.UnaryServerInterceptor()),
		grpcx.WithStreamInterceptors(authorizer.Stream(), users.Stream(), rpcerr.StreamServerInterceptor()),
		grpcx.WithValidator(func(req any) error { return rpcerr.ToStatus(api.Validate(req)) }),
		grpcx.WithMetrics(m.registry),
	)
	if err != nil {
		return nil, fmt.Errorf("rep: %w", err)
	}
	handlers := api.New(c, store)
	repv1.RegisterRepServiceServer(server.GRPC, handlers)
	s.cell, s.logs, s.server, s.handlers = c, store, server, handlers
	s.presence = presence.New(etcd, time.Duration(cfg.LeaseTTL), func() *modelsv1.CellPresence {
		return cfg.presence(s.AdvertiseAddress())
	}, logger.Named("presence"))
	s.metricsServer = cfg.MetricsServer(m.registry)
	return s, nil
}

// Run serves until ctx ends, as an ordered group: the metrics server (with metrics_address),
// the log store's writer, the cell, the links follower, the usage sampler, the gRPC API, the end of its log followers, the presence
// (once the API listens, so the registered address answers) and the bulk loop; ready is
// called once all run. On stop the bulk loop ends, the presence is revoked, log followers are
// let go, the API stops, the containers are stopped, their last lines are written and the
// metrics server stops.
func (s *Service) Run(ctx context.Context, ready func()) error {
	return lifecycle.Run(ctx, s.log, append(s.metricsServer.Members(),
		lifecycle.Member{Name: "logs", Runner: lifecycle.RunFunc(s.logs.Run)},
		lifecycle.Member{Name: "cell", Runner: s.cell},
		lifecycle.Member{Name: "links", Runner: lifecycle.RunFunc(s.cell.FollowLinks)},
		lifecycle.Member{Name: "usage", Runner: lifecycle.RunFunc(s.cell.SampleUsage(time.Duration(s.cfg.Metrics.SampleInterval)))},
		lifecycle.Member{Name: "grpc", Runner: s.server},
		lifecycle.Member{Name: "log followers", Runner: lifecycle.RunFunc(s.handlers.EndFollows)},
		lifecycle.Member{Name: "presence", Runner: s.presence},
		lifecycle.Member{Name: "bulk", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
			return s.cell.Bulk(time.Duration(s.cfg.BulkInterval))(ctx, func() {
				r()
				if ready != nil {
					ready()
				}
			})
		})},
	)...)
}

// MetricsAddr is the bound address of the metrics server once Run has called ready; nil
// without metrics_address.
func (s *Service) MetricsAddr() net.Addr { return s.metricsServer.Addr() }

// Addr is the API's bound address once Run has started the API (nil before).
func (s *Service) Addr() net.Addr { return s.server.Addr() }

// AdvertiseAddress is the rep_address registered in the cell's presence: advertise_address
// when set, else the bound listen address, with cell_address as host when bound to all
// interfaces.
func (s *Service) AdvertiseAddress() string {
	if s.cfg.AdvertiseAddress != "" {
		return s.cfg.AdvertiseAddress
	}
	addr := s.Addr()
	if addr == nil {
		return s.cfg.ListenAddress
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = s.cfg.CellAddress
	}
	return net.JoinHostPort(host, port)
}

// Evacuate drains the cell (see RepService.Evacuate) and returns when it is done or ctx ends.
func (s *Service) Evacuate(ctx context.Context) error { return s.cell.Evacuate(ctx) }

// Policy is the least-privilege rule of this service's gRPC API (see pkg/authz); admin may
// make every call.
var Policy = authz.Methods{
	Service: repv1.RepService_ServiceDesc.ServiceName,
	Reads:   []string{"State"},
	Grants: map[string][]string{
		authz.Auctioneer: {"Perform"},
		authz.BBS:        {"StopLRPInstance", "CancelTask", "StreamLogs", "InstanceMetrics", "Exec"},
	},
	// The auctioneer's Perform comes with every placement: audited only when it fails.
	Quiet: map[string][]string{authz.Auctioneer: {"Perform"}},
}

// drainTLSConfig verifies syslog-tls drains against the CAs of caFile, or the system roots.
func drainTLSConfig(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return &tls.Config{MinVersion: tls.VersionTLS12}, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("logs.drain_ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("logs.drain_ca_file: no PEM certificate in %s", caFile)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}, nil
}

// UserRecheck checks, at the rep, the role of the user the BBS streams logs, reads metrics or
// execs for (the BBS checked it first and says whose call it makes): logs and metrics for admin
// and read-only, exec for admin only. Refusals go to audit.
func UserRecheck(audit hclog.Logger) authz.UserRecheck {
	return authz.UserRecheck{
		Service: repv1.RepService_ServiceDesc.ServiceName,
		Proxy:   authz.BBS,
		Users: map[string][]string{
			"StreamLogs":      {authz.Admin, authz.ReadOnly},
			"InstanceMetrics": {authz.Admin, authz.ReadOnly},
			"Exec":            {authz.Admin},
		},
		Audit: audit,
	}
}
