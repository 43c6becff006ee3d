package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/gavel-sched/gavel/internal/ocitest"
	"github.com/gavel-sched/gavel/internal/testkit"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// The package's integration tests share one private containerd and one rootfs, made by
// TestMain; skipReason says why they skip when they cannot run.
var (
	daemon     *ocitest.Containerd
	rootfsDir  string
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		skipReason = "short mode: oci integration tests need a containerd"
		return m.Run()
	}
	if os.Getenv(repProcessEnv) != "" { // TestRepProcess, run by TestAdoptAfterTheRepDies
		rootfsDir = os.Getenv("GAVEL_OCI_ROOTFS")
		return m.Run()
	}
	if missing := ocitest.Missing(); missing != "" {
		skipReason = fmt.Sprintf("%s (missing: %s)", ocitest.InstallHint, missing)
		fmt.Fprintln(os.Stderr, skipReason)
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "oci-test-rootfs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := makeRootfs(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rootfsDir = dir
	d, err := ocitest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	daemon = d
	code := m.Run()
	if err := d.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return code
}

// makeRootfs builds the tests' rootfs: bin/probe (static), etc/passwd and a world-writable
// tmp/ the probes write their results to.
func makeRootfs(dir string) error {
	for _, d := range []string{"bin", "etc", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\nvcap:x:2000:2001:vcap:/home/vcap:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	return rootfstest.BuildStatic(".", filepath.Join(dir, "bin"), "./testdata/probe")
}

// newTestBackend connects a backend to the tests' containerd, with its work directory under
// t.TempDir and its config changed by configure before it starts, or skips t.
func newTestBackend(t *testing.T, configure ...func(*Config)) *Backend {
	t.Helper()
	switch {
	case testing.Short():
		t.Skip(skipReason)
	case skipReason != "":
		testkit.SkipWithoutTool(t, skipReason)
	}
	cfg := Config{
		Socket:    daemon.Socket,
		WorkDir:   filepath.Join(t.TempDir(), "work"),
		NetnsDir:  t.TempDir(),
		KillGrace: 2 * time.Second,
		Logger:    logtest.New(t),
	}
	for _, f := range configure {
		f(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

var guidSeq atomic.Int64

// guid is a fresh container guid for t.
func guid(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.TrimPrefix(t.Name(), "Test"))
	if len(name) > 40 {
		name = name[:40]
	}
	return fmt.Sprintf("%s-%d-%d", strings.Trim(name, "-"), os.Getpid(), guidSeq.Add(1))
}

// probeTask is a task running probe with args, writing its result to /tmp/result.
func probeTask(t testing.TB, args ...string) executor.Spec {
	return executor.Spec{
		Guid:       guid(t),
		Kind:       executor.KindTask,
		Rootfs:     "preloaded:probe",
		RootfsPath: rootfsDir,
		Env:        []*modelsv1.EnvironmentVariable{{Name: "RESULT", Value: "/tmp/result"}, {Name: "GOMAXPROCS", Value: "1"}},
		Action:     &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: args}}},
		ResultFile: "/tmp/result",
	}
}

// probeLRP is an LRP running probe with args.
func probeLRP(t testing.TB, args ...string) executor.Spec {
	s := probeTask(t, args...)
	s.Kind, s.ResultFile, s.ProcessGuid = executor.KindLRP, "", "probe"
	return s
}

// run starts spec, waits for it to end (a task) and returns its result.
func run(t *testing.T, b *Backend, spec executor.Spec) executor.Result {
	t.Helper()
	c, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(2 * time.Minute):
		c.Stop(0)
		t.Fatalf("container %s did not end", spec.Guid)
	}
	assertGone(t, b, spec.Guid)
	return c.Result()
}

// assertGone checks that nothing of container guid is left: containerd container and task,
// overlay mount, cgroups, directory.
func assertGone(t *testing.T, b *Backend, guid string) {
	t.Helper()
	ctx := b.ctx(context.Background())
	if _, err := b.client.LoadContainer(ctx, guid); !errdefs.IsNotFound(err) {
		t.Errorf("containerd container %s still there (err %v)", guid, err)
	}
	dir := b.containerDir(guid)
	if m, err := mounted(filepath.Join(dir, "rootfs")); err != nil || m {
		t.Errorf("rootfs of %s still mounted (err %v)", guid, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("container directory %s still there (err %v)", dir, err)
	}
	for _, cg := range cgroupDirs(b, guid) {
		if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s still there (err %v)", cg, err)
		}
	}
}

// cgroupDirs are the cgroup directories of container guid.
func cgroupDirs(b *Backend, guid string) []string {
	if b.cgroupV2 {
		return []string{filepath.Join("/sys/fs/cgroup", b.cfg.CgroupParent, guid)}
	}
	var dirs []string
	for _, ctl := range []string{"memory", "pids", "cpu", "freezer", "devices"} {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", ctl, b.cfg.CgroupParent, guid))
	}
	return dirs
}

func TestTaskExitsZero(t *testing.T) {
	b := newTestBackend(t)
	res := run(t, b, probeTask(t, "hostname"))
	if res.Failed {
		t.Fatalf("Result = %+v, want success", res)
	}
}

func TestExitStatusIsTheReason(t *testing.T) {
	b := newTestBackend(t)
	res := run(t, b, probeTask(t, "exit", "3"))
	if !res.Failed || res.Reason != "exit status 3" {
		t.Fatalf("Result = %+v, want failed with exit status 3", res)
	}
}

func TestHostnameIsTheGuid(t *testing.T) {
	b := newTestBackend(t)
	spec := probeTask(t, "hostname")
	res := run(t, b, spec)
	if res.Failed || res.Output != spec.Guid {
		t.Fatalf("Result = %+v, want hostname %q", res, spec.Guid)
	}
}

func TestUser(t *testing.T) {
	b := newTestBackend(t)
	for _, tc := range []struct {
		name, user, want string
	}{
		{"default is nobody", "", "65534 65534"},
		{"user of the rootfs", "vcap", "2000 2001"},
		{"numeric", "1234:99", "1234 99"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := probeTask(t, "id")
			spec.Action.GetRun().User = tc.user
			res := run(t, b, spec)
			if res.Failed || res.Output != tc.want {
				t.Fatalf("Result = %+v, want %q", res, tc.want)
			}
		})
	}
}

func TestNofileLimit(t *testing.T) {
	b := newTestBackend(t)
	for _, tc := range []struct {
		name  string
		limit uint64
		want  string
	}{
		{"default", 0, fmt.Sprintf("%d %d", DefaultNofile, DefaultNofile)},
		{"nofile_limit", 2048, "2048 2048"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := probeTask(t, "nofile")
			spec.Action.GetRun().NofileLimit = tc.limit
			res := run(t, b, spec)
			if res.Failed || res.Output != tc.want {
				t.Fatalf("Result = %+v, want %q", res, tc.want)
			}
		})
	}
}

func TestOutOfMemory(t *testing.T) {
	b := newTestBackend(t)
	spec := probeTask(t, "hog")
	spec.MemoryMB = 32
	res := run(t, b, spec)
	if !res.Failed || res.Reason != ReasonOutOfMemory {
		t.Fatalf("Result = %+v, want failed %q", res, ReasonOutOfMemory)
	}
}

func TestMaxPidsStopsAForkBomb(t *testing.T) {
	b := newTestBackend(t)
	spec := probeTask(t, "forkbomb")
	spec.MaxPids = 32
	res := run(t, b, spec)
	if res.Failed {
		t.Fatalf("Result = %+v", res)
	}
	var n int
	var errText string
	if _, err := fmt.Sscanf(res.Output, "forked %d: %s", &n, &errText); err != nil {
		t.Fatalf("output %q: %v", res.Output, err)
	}
	t.Logf("fork bomb in a container with max_pids 32: %s", res.Output)
	if n >= 32 || !strings.Contains(res.Output, "resource temporarily unavailable") {
		t.Fatalf("fork bomb: %q, want fewer than 32 forks ended by EAGAIN", res.Output)
	}
}

func TestContainersCannotSeeEachOther(t *testing.T) {
	b := newTestBackend(t)
	other, err := b.Start(context.Background(), probeLRP(t, "sleep"))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer other.Stop(time.Second)
	res := run(t, b, probeTask(t, "ps"))
	if res.Failed || res.Output != "1" {
		t.Fatalf("Result = %+v, want only pid 1 in /proc", res)
	}
}

func TestAnnotationsCarryProperties(t *testing.T) {
	b := newTestBackend(t)
	props := map[string]string{
		"app_guid":        "4a6f1c2e-app",
		"network_id":      "net-1",
		"network.policy":  "ünïcødé ✓ 日本語",
		"network.big":     strings.Repeat("0123456789abcdef", 256), // 4 KiB
		"example.com/key": "a=b,c;d \"quoted\"\n",
	}
	spec := probeLRP(t, "sleep")
	spec.Properties = props
	c, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	ctx := b.ctx(context.Background())
	ctr, err := b.client.LoadContainer(ctx, spec.Guid)
	if err != nil {
		t.Fatalf("LoadContainer: %v", err)
	}
	s, err := ctr.Spec(ctx)
	if err != nil {
		t.Fatalf("Spec: %v", err)
	}
	if len(s.Annotations) != len(props) {
		t.Errorf("annotations %d, want %d", len(s.Annotations), len(props))
	}
	for k, v := range props {
		if s.Annotations[k] != v {
			t.Errorf("annotation %q = %q, want %q", k, s.Annotations[k], v)
		}
	}
	c.Stop(time.Second)
	assertGone(t, b, spec.Guid)
}

func TestStopLeavesNothing(t *testing.T) {
	b := newTestBackend(t)
	spec := probeLRP(t, "sleep")
	spec.MemoryMB, spec.MaxPids, spec.CPUWeight = 64, 50, 10
	c := startHealthy(t, b, spec)
	for _, cg := range cgroupDirs(b, spec.Guid) {
		if _, err := os.Stat(cg); err != nil {
			t.Errorf("cgroup of a running container: %v", err)
		}
	}
	if !b.cgroupV2 {
		if got := readTrim(t, filepath.Join("/sys/fs/cgroup/cpu", b.cfg.CgroupParent, spec.Guid, "cpu.shares")); got != "102" {
			t.Errorf("cpu.shares = %s, want 102 (cpu_weight 10)", got)
		}
		if got := readTrim(t, filepath.Join("/sys/fs/cgroup/pids", b.cfg.CgroupParent, spec.Guid, "pids.max")); got != "50" {
			t.Errorf("pids.max = %s, want 50", got)
		}
		if got := readTrim(t, filepath.Join("/sys/fs/cgroup/memory", b.cfg.CgroupParent, spec.Guid, "memory.limit_in_bytes")); got != strconv.Itoa(64<<20) {
			t.Errorf("memory.limit_in_bytes = %s, want %d", got, 64<<20)
		}
	}
	c.Stop(time.Second)
	if res := c.Result(); !res.Failed || res.Reason != ReasonStopped {
		t.Errorf("Result = %+v, want %q", res, ReasonStopped)
	}
	assertGone(t, b, spec.Guid)
}

func TestHealthCheckInsideTheNetworkNamespace(t *testing.T) {
	b := newTestBackend(t)
	serving := probeLRP(t, "serve", "8080")
	serving.Checks = &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{{Kind: &modelsv1.Check_Tcp{Tcp: &modelsv1.TCPCheck{Port: 8080, IntervalMs: 50}}}}}
	c := startHealthy(t, b, serving)
	c.Stop(time.Second)
	assertGone(t, b, serving.Guid)

	spec := probeLRP(t, "sleep")
	spec.Checks = &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{{Kind: &modelsv1.Check_Tcp{Tcp: &modelsv1.TCPCheck{Port: 8080, IntervalMs: 50}}}}}
	spec.StartTimeout = 2 * time.Second
	// Nothing listens on 8080: the check never passes.
	res := run(t, b, spec)
	if !res.Failed || res.Reason != "health check never passed" {
		t.Fatalf("Result = %+v, want never healthy", res)
	}
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("read %s: %v", path, err)
	}
	return strings.TrimSpace(string(b))
}

// fakeNetwork records the calls of the backend; Attach fails when fail is set.
type fakeNetwork struct {
	fail     error
	attached []string // "id netnsPath ports props"
	detached []string
	nsExists bool // the namespace file existed at Attach
}

func (n *fakeNetwork) Attach(_ context.Context, id, netnsPath string, ports []uint32, props map[string]string) (Attachment, error) {
	_, err := os.Stat(netnsPath)
	n.nsExists = err == nil
	n.attached = append(n.attached, fmt.Sprintf("%s %v %v", id, ports, props))
	if n.fail != nil {
		return Attachment{}, n.fail
	}
	return Attachment{Address: "10.255.0.7", Ports: map[uint32]uint32{8080: 40001}}, nil
}

func (n *fakeNetwork) Detach(_ context.Context, id, _ string, ports []uint32, props map[string]string) error {
	n.detached = append(n.detached, fmt.Sprintf("%s %v %v", id, ports, props))
	return nil
}

func (n *fakeNetwork) Adopt(context.Context, string, string) (Attachment, bool, error) {
	return Attachment{}, false, nil
}

// TestNetworkSeam: a configured Network attaches the container's network namespace before the
// process starts, with its ports and properties, its address and host ports are the net info,
// and it is detached at clean-up; a failed attach fails Start and leaves nothing.
func TestNetworkSeam(t *testing.T) {
	b := newTestBackend(t)
	net := &fakeNetwork{}
	b.cfg.Network = net
	spec := probeLRP(t, "sleep")
	spec.Ports = []uint32{8080, 8080}
	spec.Properties = map[string]string{"app_guid": "a1", "network_id": "ünï"}
	c, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	want := fmt.Sprintf("%s [8080] map[app_guid:a1 network_id:ünï]", spec.Guid)
	if len(net.attached) != 1 || net.attached[0] != want || !net.nsExists {
		t.Errorf("attached %q (namespace there: %v), want %q", net.attached, net.nsExists, want)
	}
	ni := c.NetInfo()
	if ni.GetInstanceAddress() != "10.255.0.7" || len(ni.GetPorts()) != 1 || ni.GetPorts()[0].GetHostPort() != 40001 {
		t.Errorf("net info %v", ni)
	}
	c.Stop(time.Second)
	if len(net.detached) != 1 || net.detached[0] != want {
		t.Errorf("detached %q, want %q", net.detached, want)
	}
	assertGone(t, b, spec.Guid)

	net.fail = errors.New("no address left")
	spec = probeLRP(t, "sleep")
	if _, err := b.Start(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "attach network: no address left") {
		t.Fatalf("Start with a failing network: %v", err)
	}
	assertGone(t, b, spec.Guid)
}

// TestSignalAndFailureReason: Signal reaches the process (SIGKILL: "signal: killed"), and a
// failing process's stderr tail is in its reason.
func TestSignalAndFailureReason(t *testing.T) {
	b := newTestBackend(t)
	c, err := b.Start(context.Background(), probeTask(t, "sleep"))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := c.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	<-c.Done()
	if res := c.Result(); !res.Failed || res.Reason != "signal: killed" {
		t.Errorf("Result = %+v, want signal: killed", res)
	}
	res := run(t, b, probeTask(t, "no-such-command"))
	if !res.Failed || res.Reason != "exit status 1: unknown command no-such-command" {
		t.Errorf("Result = %+v, want exit status 1 with the stderr tail", res)
	}
}

// TestPrivilegedRunsAsRoot: privileged work runs as root; unprivileged work asking for root
// is refused at Start.
func TestPrivilegedRunsAsRoot(t *testing.T) {
	b := newTestBackend(t)
	spec := probeTask(t, "id")
	spec.Privileged = true
	if res := run(t, b, spec); res.Failed || res.Output != "0 0" {
		t.Errorf("privileged Result = %+v, want 0 0", res)
	}
	spec = probeTask(t, "id")
	spec.Action.GetRun().User = "root"
	if _, err := b.Start(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "only privileged work may run as root") {
		t.Errorf("Start as root: %v", err)
	}
	assertGone(t, b, spec.Guid)
}

// mounted reports whether path is a mount point (per /proc/self/mountinfo).
func mounted(path string) (bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mountinfo: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == path {
			return true, nil
		}
	}
	return false, nil
}

// TestDiskLimit: a container that writes more than disk_mb into its writable layer is stopped
// with a "disk limit exceeded" reason; one that stays under it keeps running.
// assertStoppedForDisk starts spec, an LRP writing 3 MiB, with disk_mb 1 and checks that it is
// stopped for it, leaving nothing.
func assertStoppedForDisk(t *testing.T, b *Backend, spec executor.Spec) {
	t.Helper()
	spec.DiskMB = 1
	c, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		c.Stop(0)
		t.Fatal("a container writing 3 MiB with disk_mb 1 was not stopped")
	}
	// The monitor may catch the file mid-write, and the blocks a file holds can exceed its
	// size: any amount over the limit, rounded up to whole MiB, up to a few MiB.
	res := c.Result()
	var wrote, limit int
	n, _ := fmt.Sscanf(res.Reason, ReasonDiskLimit+": the container wrote %d MiB, disk_mb is %d", &wrote, &limit)
	if !res.Failed || n != 2 || wrote < 2 || wrote > 8 || limit != 1 {
		t.Errorf("Result = %+v, want %q with 2 to 8 MiB written and disk_mb 1", res, ReasonDiskLimit)
	}
	assertGone(t, b, spec.Guid)
}

func TestDiskLimit(t *testing.T) {
	b := newTestBackend(t)
	b.cfg.DiskInterval = 50 * time.Millisecond
	assertStoppedForDisk(t, b, probeLRP(t, "fill", "3"))

	under := probeLRP(t, "fill", "1")
	under.DiskMB = 4
	c, err := b.Start(context.Background(), under)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	// Measured (the file is written) several times over without a stop.
	deadline := time.Now().Add(time.Minute)
	for {
		used, err := diskUsage(c.(*container).ov.upper)
		if err == nil && used >= 1<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the 1 MiB file never showed in the writable layer (%d, %v)", used, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := 0; i < 5; i++ {
		if used, _ := diskUsage(c.(*container).ov.upper); used < 1<<20 {
			t.Fatalf("writable layer shrank to %d", used)
		}
		time.Sleep(b.cfg.DiskInterval)
	}
	select {
	case <-c.Done():
		t.Fatalf("a container under its disk limit ended: %+v", c.Result())
	default:
	}
	c.Stop(time.Second)
	assertGone(t, b, under.Guid)
}

// TestOCIHooks: the cell's container hooks run as OCI createRuntime and poststop hooks: each
// gets the OCI state on stdin (the container's id and its annotations, the work's properties
// byte for byte) and GAVEL_HOOK; a failing on_create hook fails the start, naming the hook,
// and leaves nothing.
func TestOCIHooks(t *testing.T) {
	b := newTestBackend(t)
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook.sh")
	script := "#!/bin/sh\ncat > " + dir + "/\"$GAVEL_HOOK-$GAVEL_CONTAINER_GUID.json\"\n"
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b.cfg.Hooks = Hooks{OnCreate: []string{hook}, OnDestroy: []string{hook}, Timeout: 10 * time.Second}
	spec := probeLRP(t, "sleep")
	spec.Properties = map[string]string{"app_guid": "a1", "network_id": "ünï ✓"}
	c, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	c.Stop(time.Second)
	for _, event := range []string{"on_create", "on_destroy"} {
		raw, err := os.ReadFile(filepath.Join(dir, event+"-"+spec.Guid+".json"))
		if err != nil {
			t.Errorf("%s hook did not run: %v", event, err)
			continue
		}
		var st struct {
			ID          string            `json:"id"`
			Annotations map[string]string `json:"annotations"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Errorf("%s hook's stdin is not the OCI state: %v: %s", event, err, raw)
			continue
		}
		if st.ID != spec.Guid || st.Annotations["app_guid"] != "a1" || st.Annotations["network_id"] != "ünï ✓" {
			t.Errorf("%s hook got state %s", event, raw)
		}
	}
	assertGone(t, b, spec.Guid)

	failing := filepath.Join(dir, "fail.sh")
	if err := os.WriteFile(failing, []byte("#!/bin/sh\necho no network for you >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.cfg.Hooks = Hooks{OnCreate: []string{failing}}
	spec = probeLRP(t, "sleep")
	if _, err := b.Start(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "fail.sh") {
		t.Errorf("Start with a failing on_create hook: %v, want an error naming the hook", err)
	}
	assertGone(t, b, spec.Guid)
}

// TestExec: a command exec'd in a running container gets its input to the end (it sees EOF
// when the input ends: `echo x | gavel exec ... cat` ends), its output is the caller's and its
// exit status is returned.
func TestExec(t *testing.T) {
	b := newTestBackend(t)
	spec := probeLRP(t, "sleep")
	spec.Env = []*modelsv1.EnvironmentVariable{{Name: "GOMAXPROCS", Value: "1"}} // no RESULT: probe prints
	c, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer func() {
		c.Stop(time.Second)
		assertGone(t, b, spec.Guid)
	}()
	ex := c.(executor.Execer)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut strings.Builder
	code, err := ex.Exec(ctx, executor.ExecSpec{Command: []string{"/bin/probe", "cat", "/dev/stdin"},
		Stdin: strings.NewReader("ünï input"), Stdout: &out, Stderr: &errOut})
	if err != nil || code != 0 || out.String() != "ünï input\n" {
		t.Errorf("exec cat /dev/stdin: code %d, %v, stdout %q, stderr %q; want the input back", code, err, out.String(), errOut.String())
	}
	if code, err := ex.Exec(ctx, executor.ExecSpec{Command: []string{"/bin/probe", "exit", "3"}, Stdout: &out, Stderr: &errOut}); err != nil || code != 3 {
		t.Errorf("exec exit 3: code %d, %v", code, err)
	}
	// A caller that leaves while its command still runs (with and without a terminal): the
	// command is killed, Exec returns, and the container still stops (the deferred check).
	for _, tty := range []bool{false, true} {
		lctx, leave := context.WithCancel(ctx)
		w := &firstWrite{seen: make(chan struct{})}
		ended := make(chan error, 1)
		go func() {
			_, err := ex.Exec(lctx, executor.ExecSpec{Command: []string{"/bin/probe", "tick"}, TTY: tty, Stdout: w, Stderr: w})
			ended <- err
		}()
		select {
		case <-w.seen:
		case <-time.After(30 * time.Second):
			t.Fatalf("exec tick (tty %v): no output", tty)
		}
		leave()
		select {
		case err := <-ended:
			if err != nil {
				t.Errorf("exec tick (tty %v) whose caller left: %v", tty, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("exec tick (tty %v) did not return after its caller left", tty)
		}
	}
}

// firstWrite is an io.Writer that closes seen on its first write.
type firstWrite struct {
	once sync.Once
	seen chan struct{}
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.seen) })
	return len(p), nil
}

// TestDownloadActions: download actions in the setup and before the run action of a serial
// action are fetched by the rep into the container's root filesystem before its process
// starts: a gzipped tar extracted (its symbolic link working, its directories the container
// user's), a plain file saved into a directory, the checksum verified. A checksum mismatch, or
// a destination whose path leads out of the root filesystem through the rootfs's symbolic
// link, fails the start naming the download, writes nothing outside and leaves nothing.
func TestDownloadActions(t *testing.T) {
	b := newTestBackend(t)
	var tgz bytes.Buffer
	zw := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(zw)
	for _, h := range []*tar.Header{
		{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "app/hello.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 19},
		{Name: "app/link", Typeflag: tar.TypeSymlink, Linkname: "hello.txt"},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			_, _ = tw.Write([]byte("hi from the tarball"))
		}
	}
	if err := errors.Join(tw.Close(), zw.Close()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/app.tgz":
			_, _ = w.Write(tgz.Bytes())
		case "/tool":
			_, _ = w.Write([]byte("#!tool"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	sum := sha256.Sum256(tgz.Bytes())
	dl := func(from, to, checksum string) *modelsv1.Action {
		d := &modelsv1.DownloadAction{From: srv.URL + from, To: to}
		if checksum != "" {
			d.ChecksumAlgorithm, d.ChecksumValue = "sha256", checksum
		}
		return &modelsv1.Action{Kind: &modelsv1.Action_Download{Download: d}}
	}
	withDownloads := func(spec executor.Spec, tarSum string) executor.Spec {
		spec.Setup = dl("/app.tgz", "/srv", tarSum)
		spec.Action = &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{
			Actions: []*modelsv1.Action{dl("/tool", "/srv/bin/", ""), spec.Action}}}}
		return spec
	}
	for _, tc := range []struct{ args, want string }{
		{"cat /srv/app/link", "hi from the tarball"},
		{"cat /srv/bin/tool", "#!tool"},
		{"write /srv/app/mine yes", "written"}, // /srv/app is the container user's
	} {
		res := run(t, b, withDownloads(probeTask(t, strings.Fields(tc.args)...), hex.EncodeToString(sum[:])))
		if res.Failed || res.Output != tc.want {
			t.Errorf("probe %s after the downloads: %+v, want %q", tc.args, res, tc.want)
		}
	}

	spec := withDownloads(probeTask(t, "id"), strings.Repeat("0", 64))
	if _, err := b.Start(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "sha256 checksum mismatch") {
		t.Errorf("Start with a wrong checksum: %v", err)
	}
	assertGone(t, b, spec.Guid)

	// A rootfs whose /escape leads to a directory of the host.
	outside, root := t.TempDir(), t.TempDir()
	for _, d := range []string{"bin", "etc", "tmp"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"bin/probe", "etc/passwd"} {
		content, err := os.ReadFile(filepath.Join(rootfsDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), content, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{"escape": outside, "up": "../../../../../../../../" + outside} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
		spec := probeTask(t, "id")
		spec.RootfsPath = root
		spec.Setup = dl("/tool", "/"+name+"/", "")
		_, err := b.Start(context.Background(), spec)
		if err == nil || !strings.Contains(err.Error(), "download "+srv.URL+"/tool") || !strings.Contains(err.Error(), "escapes") {
			t.Errorf("Start with a download through /%s -> %s: %v, want a download error: the path escapes", name, target, err)
		}
		t.Logf("a download through /%s -> %s: %v", name, target, err)
		assertGone(t, b, spec.Guid)
		if entries, _ := os.ReadDir(outside); len(entries) > 0 {
			t.Fatalf("a download through /%s wrote %v outside the container", name, entries)
		}
	}
}

// TestResultFileLinkedOutside: a task that makes its result file a symbolic link to a host
// file fails with the reason, and the host file's content is not its result (the rep reads
// result files as root). A files directory through a link out of the rootfs is refused.
func TestResultFileLinkedOutside(t *testing.T) {
	b := newTestBackend(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := probeTask(t, "link", secret, "/tmp/result")
	spec.FilesDir, spec.Files = "/tmp/files", map[string][]byte{"f": []byte("x")}
	res := run(t, b, spec)
	if !res.Failed || strings.Contains(res.Output+res.Reason, "host secret") || !strings.HasPrefix(res.Reason, "read result file: ") {
		t.Errorf("Result = %+v, want failed reading the result file, without the host file", res)
	}
	t.Logf("reason: %s", res.Reason)

	// A files directory through a rootfs's link to outside it is refused, nothing written.
	rootDir, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(rootDir, "out")); err != nil {
		t.Fatal(err)
	}
	escape := probeTask(t, "hostname")
	escape.RootfsPath, escape.FilesDir, escape.Files = rootDir, "/out/files", map[string][]byte{"f": []byte("x")}
	if c, err := b.Start(context.Background(), escape); err == nil || !strings.Contains(err.Error(), "create files directory: ") {
		if err == nil {
			c.Stop(0)
		}
		t.Errorf("Start with files through /out -> %s: %v, want refused", outside, err)
	}
	assertGone(t, b, escape.Guid)
	if entries, _ := os.ReadDir(outside); len(entries) > 0 {
		t.Errorf("written outside the rootfs: %v", entries)
	}
}

// startHealthy starts spec on b and waits (at most a minute) until it is healthy, failing t
// when it cannot start or ends first.
func startHealthy(t testing.TB, b *Backend, spec executor.Spec) executor.Container {
	t.Helper()
	c, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	select {
	case <-c.Healthy():
	case <-c.Done():
		t.Fatalf("container ended before healthy: %+v", c.Result())
	case <-time.After(time.Minute):
		t.Fatal("not healthy within a minute")
	}
	return c
}
