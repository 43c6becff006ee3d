package executor

import (
	"fmt"
	"sort"
	"time"
)

// Options are what every backend factory may use.
type Options struct {
	// CellAddress is the address instances are reached on.
	CellAddress string
	// PortRangeStart and PortRangeEnd bound the host ports handed out (inclusive).
	PortRangeStart, PortRangeEnd int
	// WorkDir holds per-container directories.
	WorkDir string
	// User is the unprivileged user processes drop to ("" keeps the rep's user).
	User string
	// SimStartLatency is how long a simulated container takes to become healthy.
	SimStartLatency time.Duration
	// SimCrashRate is the probability per second that a simulated LRP crashes.
	SimCrashRate float64
	// SimLogInterval is how often a simulated container writes a synthetic line to its log
	// sink (0: never).
	SimLogInterval time.Duration
	// OCI configures the oci backend.
	OCI OCIOptions
}

// OCIOptions configure the oci backend (containerd + runc).
type OCIOptions struct {
	// ContainerdSocket is containerd's gRPC socket.
	ContainerdSocket string
	// Namespace is the containerd namespace the cell's containers live in.
	Namespace string
	// Runtime is the containerd runtime (shim) name, e.g. io.containerd.runc.v2.
	Runtime string
	// CNIConfDir holds the CNI network configuration; empty runs containers with loopback only.
	CNIConfDir string
	// CNIBinDir holds the CNI plugins.
	CNIBinDir string
	// OnCreateHooks and OnDestroyHooks are the cell's container hooks, run by the backend as
	// OCI createRuntime and poststop hooks (see HookRunner).
	OnCreateHooks, OnDestroyHooks []string
	// HookTimeout bounds each hook run.
	HookTimeout time.Duration
	// Snapshotter is the containerd snapshotter docker:// images are unpacked by (the
	// backend's default when empty).
	Snapshotter string
	// InsecureRegistries lets image pulls talk plain HTTP to any registry.
	InsecureRegistries bool
	// ImageUnusedFor is how long a pulled image no container uses is kept (the backend's
	// default when zero; negative: for ever).
	ImageUnusedFor time.Duration
}

// Factory builds a backend.
type Factory func(Options) (Backend, error)

var registry = map[string]Factory{}

// Register adds a backend factory under name; backends call it from init.
func Register(name string, f Factory) {
	if _, dup := registry[name]; dup {
		panic("executor: backend registered twice: " + name)
	}
	registry[name] = f
}

// New builds the backend registered under name.
func New(name string, opts Options) (Backend, error) {
	f, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown executor backend %q (have %v)", name, Names())
	}
	return f(opts)
}

// Names lists the registered backends.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
