package oci

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"runtime"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// Defaults of the limits a spec leaves open.
const (
	// DefaultNofile is RLIMIT_NOFILE (soft and hard) when the run action sets no nofile_limit.
	DefaultNofile = 1024
	// MaxCPUShares is the CPU shares of cpu_weight 100; weight w gets w% of it (at least 2).
	MaxCPUShares = 1024
	// NobodyID is the uid and gid of "nobody" when the rootfs does not list it.
	NobodyID = 65534
	// MaxHostname is the longest hostname the kernel takes; longer guids are cut.
	MaxHostname = 64
)

// defaultPath is PATH when the spec sets none (as in the process backend).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// IDs are a user's uid and primary gid, and its home directory.
type IDs struct {
	// UID is the user id.
	UID uint32
	// GID is the primary group id.
	GID uint32
	// Home is the home directory ("" when unknown).
	Home string
}

// SpecConfig is what BuildSpec needs besides the executor spec: where the container's root is,
// the cell's defaults and what the machine supports.
type SpecConfig struct {
	// RootPath is the container's root filesystem on the host (the overlay's mount point).
	RootPath string
	// CgroupParent is the cgroup every container's cgroup is created under ("/gavel").
	CgroupParent string
	// Users are the users of the rootfs's /etc/passwd, by name.
	Users map[string]IDs
	// DefaultUser is who a run action without a user runs as unless the work is privileged
	// (a name in Users, "uid" or "uid:gid"); empty means "nobody".
	DefaultUser string
	// DefaultNofile is RLIMIT_NOFILE when the run action sets none (0: DefaultNofile).
	DefaultNofile uint64
	// LimitSwap sets memory+swap to the memory limit too (the cgroup has swap accounting), so
	// a container cannot swap its way past memory_mb.
	LimitSwap bool
	// Env are the variables the cell adds after the spec's own (PORT, CF_INSTANCE_*, ...).
	Env []string
	// NetnsPath, when set, is the pinned network namespace the container joins (the one its
	// network is attached to); empty gives the container a new one.
	NetnsPath string
	// Hooks are the cell's container hooks.
	Hooks Hooks
	// InitPath is the host file of the init program of a container whose action is a tree
	// (IsTree), bind-mounted read-only at InitMount; unused otherwise.
	InitPath string
}

// InitMount is where a tree container's init program is mounted: in /dev, the container's
// own tmpfs, so nothing is added to its root filesystem.
const InitMount = "/dev/.gavel-init"

// Hooks are the cell's container hooks as OCI hooks: OnCreate as createRuntime hooks (run by
// the runtime in its own namespaces once the container's namespaces exist, before its process
// starts; a failing one fails the container), OnDestroy as poststop hooks (run when the
// container is deleted). Each gets the OCI state (id, pid, bundle, annotations: the work's
// properties) on stdin, and GAVEL_HOOK (on_create, on_destroy), GAVEL_CONTAINER_GUID and PATH
// in its environment.
type Hooks struct {
	// OnCreate and OnDestroy are executables on the cell.
	OnCreate, OnDestroy []string
	// Timeout bounds each run (rounded up to whole seconds; 0: none).
	Timeout time.Duration
}

// ociHooks is h for container guid, nil without hooks.
func (h Hooks) ociHooks(guid string) *specs.Hooks {
	if len(h.OnCreate) == 0 && len(h.OnDestroy) == 0 {
		return nil
	}
	var timeout *int
	if h.Timeout > 0 {
		secs := int((h.Timeout + time.Second - 1) / time.Second)
		timeout = &secs
	}
	list := func(event string, paths []string) []specs.Hook {
		var out []specs.Hook
		for _, p := range paths {
			out = append(out, specs.Hook{Path: p, Args: []string{p}, Timeout: timeout,
				Env: []string{"GAVEL_HOOK=" + event, "GAVEL_CONTAINER_GUID=" + guid, "PATH=" + defaultPath}})
		}
		return out
	}
	return &specs.Hooks{CreateRuntime: list("on_create", h.OnCreate), Poststop: list("on_destroy", h.OnDestroy)}
}

// MainProcess is the run action a container's init process runs when its action has the
// simple shape: a run action, or a serial action of download actions ending with one, with a
// setup of download actions only (one, or a serial of them) and no monitor action. Any other
// tree is run with an init program as the container's init and every run action exec'd in the
// container (IsTree); MainProcess fails for it, saying why.
func MainProcess(s executor.Spec) (*modelsv1.RunAction, error) {
	_, ra, err := splitActions(s)
	return ra, err
}

// IsTree reports whether s's action tree is not of the simple shape MainProcess takes, so its
// container runs an init program and the tree is interpreted by the rep (tree.go).
func IsTree(s executor.Spec) bool {
	_, _, err := splitActions(s)
	var ts treeShape
	return errors.As(err, &ts)
}

// treeShape is MainProcess's failure for a tree: what in it is not of the simple shape.
type treeShape struct{ what string }

func (t treeShape) Error() string {
	return "oci backend: " + t.what + " is run as an action tree, not as the container's init"
}

// checkTree reports why the tree s cannot run on this cell: no init program for this
// architecture, or no action.
func checkTree(s executor.Spec) error {
	if len(pauseProgram) == 0 {
		return fmt.Errorf("oci backend: action trees other than downloads then one run action need the init program, which is not built for %s", runtime.GOARCH)
	}
	if s.Action.GetKind() == nil {
		return errors.New("no action")
	}
	return nil
}

// runActions are the run actions of s's setup, action and monitor, in tree order.
func runActions(s executor.Spec) []*modelsv1.RunAction {
	var out []*modelsv1.RunAction
	var walk func(a *modelsv1.Action)
	walk = func(a *modelsv1.Action) {
		switch k := a.GetKind().(type) {
		case *modelsv1.Action_Run:
			out = append(out, k.Run)
		case *modelsv1.Action_Serial:
			for _, c := range k.Serial.GetActions() {
				walk(c)
			}
		case *modelsv1.Action_Parallel:
			for _, c := range k.Parallel.GetActions() {
				walk(c)
			}
		case *modelsv1.Action_Codependent:
			for _, c := range k.Codependent.GetActions() {
				walk(c)
			}
		case *modelsv1.Action_Try:
			walk(k.Try.GetAction())
		case *modelsv1.Action_Timeout:
			walk(k.Timeout.GetAction())
		}
	}
	walk(s.Setup)
	walk(s.Action)
	walk(s.Monitor)
	return out
}

// Downloads are the download actions of s in the order they run, before its run action: its
// setup's, then those of its serial action.
func Downloads(s executor.Spec) ([]*modelsv1.DownloadAction, error) {
	ds, _, err := splitActions(s)
	return ds, err
}

// splitActions splits s into its downloads and its run action, or says why the oci backend cannot
// run it.
func splitActions(s executor.Spec) ([]*modelsv1.DownloadAction, *modelsv1.RunAction, error) {
	if s.Monitor != nil {
		return nil, nil, treeShape{"a monitor action"}
	}
	var downloads []*modelsv1.DownloadAction
	if s.Setup != nil {
		setup := []*modelsv1.Action{s.Setup}
		if serial := s.Setup.GetSerial(); serial != nil {
			setup = serial.GetActions()
		}
		for _, a := range setup {
			d := a.GetDownload()
			if d == nil {
				return nil, nil, treeShape{"a setup action holding " + actionKind(a)}
			}
			downloads = append(downloads, d)
		}
	}
	main := s.Action
	if serial := main.GetSerial(); serial != nil && len(serial.GetActions()) > 0 {
		steps := serial.GetActions()
		for _, a := range steps[:len(steps)-1] {
			d := a.GetDownload()
			if d == nil {
				return nil, nil, treeShape{"a serial action holding " + actionKind(a) + " before its last"}
			}
			downloads = append(downloads, d)
		}
		main = steps[len(steps)-1]
	}
	ra := main.GetRun()
	if ra == nil {
		return nil, nil, treeShape{"an action tree ending with " + actionKind(main)}
	}
	if ra.GetPath() == "" {
		return nil, nil, errors.New("run action: empty path")
	}
	return downloads, ra, nil
}

// actionKind names the kind of a (non-run) action for the refusal reason.
func actionKind(a *modelsv1.Action) string {
	if a == nil || a.GetKind() == nil {
		return "no action"
	}
	k := fmt.Sprintf("%T", a.GetKind()) // *modelsv1.Action_Download
	k = k[strings.LastIndex(k, "_")+1:]
	return strings.ToLower(k) + " action"
}

// BuildSpec is the OCI runtime spec of the container s: its run action as the init process
// (ProcessSpec) or, for a tree (IsTree), the init program at InitMount (cfg.InitPath mounted
// read-only) as nobody without capabilities; namespaces pid, mount, uts, ipc and network, the
// guid as hostname, memory, pids and CPU shares limits in a cgroup under cfg.CgroupParent, and
// the work's properties as annotations, keys as given (no prefix). It is a pure function.
func BuildSpec(s executor.Spec, cfg SpecConfig) (*specs.Spec, error) {
	if cfg.RootPath == "" {
		return nil, errors.New("oci spec: no root path")
	}
	mounts := defaultMounts()
	var proc *specs.Process
	if IsTree(s) {
		if cfg.InitPath == "" {
			return nil, errors.New("oci spec: an action tree needs the init program")
		}
		mounts = append(mounts, specs.Mount{Destination: InitMount, Type: "bind", Source: cfg.InitPath,
			Options: []string{"bind", "ro", "nosuid", "nodev"}})
		proc = &specs.Process{
			User:            specs.User{UID: NobodyID, GID: NobodyID},
			Args:            []string{InitMount},
			Env:             []string{"PATH=" + defaultPath},
			Cwd:             "/",
			Capabilities:    &specs.LinuxCapabilities{},
			NoNewPrivileges: true,
		}
	} else {
		ra, err := MainProcess(s)
		if err != nil {
			return nil, err
		}
		if proc, err = ProcessSpec(s, ra, cfg); err != nil {
			return nil, err
		}
	}
	hostname := s.Guid
	if len(hostname) > MaxHostname {
		hostname = hostname[:MaxHostname]
	}
	resources := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if s.MemoryMB > 0 {
		limit := int64(s.MemoryMB) << 20
		resources.Memory = &specs.LinuxMemory{Limit: &limit}
		if cfg.LimitSwap {
			swap := limit
			resources.Memory.Swap = &swap
		}
	}
	if s.MaxPids > 0 {
		pids := int64(s.MaxPids)
		resources.Pids = &specs.LinuxPids{Limit: &pids}
	}
	if s.CPUWeight > 0 {
		shares := max(uint64(s.CPUWeight)*MaxCPUShares/100, 2)
		resources.CPU = &specs.LinuxCPU{Shares: &shares}
	}
	parent := cfg.CgroupParent
	if parent == "" {
		parent = "/gavel"
	}

	var annotations map[string]string
	if len(s.Properties) > 0 {
		annotations = maps.Clone(s.Properties)
	}
	return &specs.Spec{
		Version:     specs.Version,
		Process:     proc,
		Root:        &specs.Root{Path: cfg.RootPath},
		Hostname:    hostname,
		Mounts:      mounts,
		Annotations: annotations,
		Hooks:       cfg.Hooks.ociHooks(s.Guid),
		Linux: &specs.Linux{
			CgroupsPath: path.Join(parent, s.Guid),
			Resources:   resources,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.NetworkNamespace, Path: cfg.NetnsPath},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
				"/sys/firmware", "/sys/devices/virtual/powercap",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
		},
	}, nil
}

// ProcessSpec is the OCI process of run action ra of container s: its user (processUser), its
// arguments, HOME, PATH, the spec's environment, cfg.Env and its own, its working directory,
// RLIMIT_NOFILE, and the default capabilities (effective only for root).
func ProcessSpec(s executor.Spec, ra *modelsv1.RunAction, cfg SpecConfig) (*specs.Process, error) {
	if ra.GetPath() == "" {
		return nil, errors.New("run action: empty path")
	}
	ids, err := processUser(s, ra, cfg)
	if err != nil {
		return nil, err
	}
	nofile := ra.GetNofileLimit()
	if nofile == 0 {
		nofile = cfg.DefaultNofile
	}
	if nofile == 0 {
		nofile = DefaultNofile
	}
	home := ids.Home
	if home == "" {
		home = "/"
	}
	env := []string{"HOME=" + home, "PATH=" + defaultPath}
	for _, e := range s.Env {
		env = append(env, e.GetName()+"="+e.GetValue())
	}
	env = append(env, cfg.Env...)
	for _, e := range ra.GetEnv() {
		env = append(env, e.GetName()+"="+e.GetValue())
	}
	caps := defaultCapabilities()
	procCaps := &specs.LinuxCapabilities{Bounding: caps}
	if ids.UID == 0 {
		procCaps.Effective, procCaps.Permitted = caps, caps
	}
	return &specs.Process{
		User:            specs.User{UID: ids.UID, GID: ids.GID},
		Args:            append([]string{ra.GetPath()}, ra.GetArgs()...),
		Env:             env,
		Cwd:             path.Join("/", ra.GetDir()),
		Capabilities:    procCaps,
		Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile}},
		NoNewPrivileges: !s.Privileged,
	}, nil
}

// processUser resolves who the init process runs as: the run action's user, else root for
// privileged work, else cfg.DefaultUser, else nobody. Root is refused for unprivileged work
// (there is no user namespace to make it safe).
func processUser(s executor.Spec, ra *modelsv1.RunAction, cfg SpecConfig) (IDs, error) {
	name := ra.GetUser()
	switch {
	case name != "":
	case s.Privileged:
		name = "root"
	case cfg.DefaultUser != "":
		name = cfg.DefaultUser
	default:
		name = "nobody"
	}
	ids, err := lookupUser(name, cfg.Users)
	if err != nil {
		return IDs{}, err
	}
	if ids.UID == 0 && !s.Privileged {
		return IDs{}, fmt.Errorf("user %q is root: only privileged work may run as root", name)
	}
	return ids, nil
}

// lookupUser resolves a user name of the rootfs, "uid" or "uid:gid".
func lookupUser(name string, users map[string]IDs) (IDs, error) {
	if u, ok := users[name]; ok {
		return u, nil
	}
	uidStr, gidStr, hasGid := strings.Cut(name, ":")
	if uid, err := strconv.ParseUint(uidStr, 10, 32); err == nil {
		gid := uid
		if hasGid {
			g, err := strconv.ParseUint(gidStr, 10, 32)
			if err != nil {
				return IDs{}, fmt.Errorf("user %q: bad gid: %w", name, err)
			}
			gid = g
		}
		return IDs{UID: uint32(uid), GID: uint32(gid)}, nil
	}
	switch name {
	case "root":
		return IDs{UID: 0, GID: 0, Home: "/root"}, nil
	case "nobody":
		return IDs{UID: NobodyID, GID: NobodyID}, nil
	}
	return IDs{}, fmt.Errorf("user %q is not in the rootfs's /etc/passwd", name)
}

// defaultCapabilities is the capability set of a container's root (containerd's default).
func defaultCapabilities() []string {
	return []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
		"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
}

// defaultMounts are the kernel filesystems every container gets (containerd's defaults).
func defaultMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro", "nosuid", "noexec", "nodev", "relatime"}},
	}
}
