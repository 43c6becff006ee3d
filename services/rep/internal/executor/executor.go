// Package executor is the contract between the rep and the backends that run containers:
// `process` (real processes on the host), `oci` (OCI containers through containerd) and `sim`
// (simulated containers for scale tests).
// Backends are registered by name in one map (see registry.go).
package executor

import (
	"context"
	"syscall"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Kind says whether a container runs an LRP instance or a task.
type Kind int

const (
	// KindLRP is a long-running instance: it should never exit.
	KindLRP Kind = iota
	// KindTask runs to completion; its exit status and result file are its outcome.
	KindTask
)

// Spec is everything a backend needs to run one container. It is the rep's container spec:
// Properties carry the work's properties untouched, and the whole Spec is what container hooks
// receive as JSON.
type Spec struct {
	// Guid identifies the container (an LRP's instance guid, or a task guid).
	Guid string `json:"guid"`
	// Kind is LRP or task.
	Kind Kind `json:"kind"`
	// ProcessGuid and Index identify an LRP instance (empty/zero for tasks).
	ProcessGuid string `json:"process_guid,omitempty"`
	// Index is the LRP instance index.
	Index int32 `json:"index"`
	// TaskGuid identifies a task (empty for LRPs).
	TaskGuid string `json:"task_guid,omitempty"`
	// Domain is the work's domain.
	Domain string `json:"domain"`
	// Rootfs is the work's root filesystem URI.
	Rootfs string `json:"rootfs"`
	// ImageUsername and ImagePassword authenticate the pull of a docker:// Rootfs at its
	// registry (both empty: anonymous). Never serialized: not in the JSON container hooks get,
	// nor in a backend's records.
	ImageUsername string `json:"-"`
	// ImagePassword is ImageUsername's password or token.
	ImagePassword string `json:"-"`
	// RootfsPath is the resolved root filesystem directory; empty runs on the host's.
	RootfsPath string `json:"rootfs_path,omitempty"`
	// Chroot runs every process chrooted into RootfsPath (paths in actions are inside it).
	Chroot bool `json:"chroot"`
	// Env is set for every process (the backend adds PORT, PORT_<n> and CF_INSTANCE_* itself).
	Env []*modelsv1.EnvironmentVariable `json:"env,omitempty"`
	// Setup runs once before Action.
	Setup *modelsv1.Action `json:"setup,omitempty"`
	// Action is the main step tree.
	Action *modelsv1.Action `json:"action,omitempty"`
	// Monitor is a legacy health check action run periodically after Action started.
	Monitor *modelsv1.Action `json:"monitor,omitempty"`
	// Checks are health checks (they crash the container) and readiness checks (they drive
	// routability).
	Checks *modelsv1.CheckDefinition `json:"checks,omitempty"`
	// Ports are the container ports to map to host ports.
	Ports []uint32 `json:"ports,omitempty"`
	// MemoryMB, DiskMB and MaxPids are the limits (0: the cell's default).
	MemoryMB int32 `json:"memory_mb"`
	// DiskMB is the disk limit.
	DiskMB int32 `json:"disk_mb"`
	// MaxPids is the process limit.
	MaxPids int32 `json:"max_pids"`
	// CPUWeight is the work's relative CPU share, 1 to 100 (0: the cell's default). The
	// oci backend maps it to CPU shares; the process and sim backends ignore it.
	CPUWeight uint32 `json:"cpu_weight,omitempty"`
	// Privileged keeps the processes' privileges instead of dropping to the cell's user.
	Privileged bool `json:"privileged"`
	// ResultFile, for tasks, is read when the action finishes and returned in Result.Output.
	ResultFile string `json:"result_file,omitempty"`
	// StartTimeout bounds how long an LRP may take to become healthy (0: the cell's default).
	StartTimeout time.Duration `json:"start_timeout"`
	// PlacementConstraint is the work's placement constraint, kept so a restarted rep's cell
	// state shows an adopted container's as a started one's.
	PlacementConstraint *modelsv1.PlacementConstraint `json:"placement_constraint,omitempty"`
	// Properties are the work's opaque properties, carried untouched.
	Properties map[string]string `json:"properties,omitempty"`
	// LogGuid tags the container's logs.
	LogGuid string `json:"log_guid,omitempty"`
	// LogDrains are the syslog drains the cell forwards the container's log lines to.
	LogDrains []string `json:"log_drains,omitempty"`
	// FilesDir, when set, is a directory (a path inside the container, relative to its root
	// as its processes see it) that the backend creates and fills with Files before any
	// process starts; the cell rewrites files in it while the container runs (link files).
	FilesDir string `json:"files_dir,omitempty"`
	// FilesDirEnv names the environment variable that receives FilesDir's absolute path as the
	// processes see it.
	FilesDirEnv string `json:"files_dir_env,omitempty"`
	// Files are written into FilesDir, by file name, before any process starts.
	Files map[string][]byte `json:"-"`
	// Log receives every output line of the container's processes (those of a run action
	// with suppress_log_output excepted), with the action's log_source (empty: the
	// container's default source); nil discards them. The process and oci backends feed it
	// through procout.Writer, the sim backend with synthetic lines.
	Log LogSink `json:"-"`
}

// LogSink receives a container's output lines: the cell's log store (logs.Instance).
type LogSink interface {
	// Line captures one line of stream ("stdout" or "stderr") labelled source.
	Line(source, stream, text string)
}

// Result is how a container ended.
type Result struct {
	// Failed is true when the action failed, a health check failed, or it was stopped.
	Failed bool
	// Reason says why it failed (e.g. "exit status 1", "health check failed", "stopped").
	Reason string
	// Output is the content of the task's result file.
	Output string
}

// ReasonExitedCleanly is the reason of an LRP whose action ended without an error: for an LRP,
// which should run for ever, that is a crash.
const ReasonExitedCleanly = "exited with status 0"

// Completed is the result of work whose action ended without an error: an LRP crashed
// (ReasonExitedCleanly); a task succeeded, with the content of its result file when spec names
// one (read by readResultFile; failing to read it fails the task).
func Completed(spec Spec, readResultFile func() (string, error)) Result {
	switch {
	case spec.Kind == KindLRP:
		return Result{Failed: true, Reason: ReasonExitedCleanly}
	case spec.ResultFile != "":
		out, err := readResultFile()
		if err != nil {
			return Result{Failed: true, Reason: err.Error()}
		}
		return Result{Output: out}
	}
	return Result{}
}

// Container is a started container.
type Container interface {
	// Guid is Spec.Guid.
	Guid() string
	// NetInfo is where the container is reached: the cell address, the instance address and a
	// host port for every Spec port. Valid as soon as Start returns.
	NetInfo() *modelsv1.ActualLRPNetInfo
	// Healthy is closed once the LRP's health checks first pass (at once when it has none).
	Healthy() <-chan struct{}
	// Routable sends the readiness state whenever it changes (true at once when the LRP has no
	// readiness checks). It is closed when the container is done.
	Routable() <-chan bool
	// Done is closed when every process has exited.
	Done() <-chan struct{}
	// Result is valid once Done is closed.
	Result() Result
	// Stop signals the processes, waits up to grace, then kills them. It is idempotent and
	// returns once Done is closed.
	Stop(grace time.Duration)
	// FilesPath is where Spec.FilesDir is on the host, for the cell to rewrite files in while
	// the container runs: root is a host directory the container cannot replace (its root
	// filesystem, or its own directory without one) and dir the files directory relative to
	// it. The cell writes through os.OpenRoot(root), so that no link the container makes can
	// lead its writes outside. Both are empty when the spec has none or the backend keeps no
	// files.
	FilesPath() (root, dir string)
	// Signal sends sig to every running process of the container.
	Signal(sig syscall.Signal) error
}

// Backend starts containers.
type Backend interface {
	// Start allocates the container's resources and starts its processes without waiting for
	// them; it fails when the container cannot be created.
	Start(ctx context.Context, spec Spec) (Container, error)
	// Notes lists limitations the cell reports in its state, e.g. "memory limits not enforced:
	// cgroup v2 not writable".
	Notes() []string
	// Isolation says what the backend's containers are and what it enforces on this machine.
	Isolation() Isolation
}

// Isolation is what a backend's containers are and what it enforces, as the cell's state
// reports it.
type Isolation struct {
	// Kind is the backend: "process", "oci" or "sim".
	Kind string
	// Enforced lists the isolation and limits in force, e.g. "pid namespace", "memory".
	Enforced []string
}
