package oci

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/gavel-sched/gavel/internal/ocitest"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// lineSink collects a container's output lines.
type lineSink struct {
	mu    sync.Mutex
	lines []string
	added chan struct{} // gets a value on every line (dropped when full)
}

func newLineSink() *lineSink { return &lineSink{added: make(chan struct{}, 1)} }

func (s *lineSink) Line(_, _, text string) {
	s.mu.Lock()
	s.lines = append(s.lines, text)
	s.mu.Unlock()
	select {
	case s.added <- struct{}{}:
	default:
	}
}

// waitFor waits until a line satisfies ok.
func (s *lineSink) waitFor(t *testing.T, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		s.mu.Lock()
		found := slices.ContainsFunc(s.lines, ok)
		s.mu.Unlock()
		if found {
			return
		}
		select {
		case <-s.added:
		case <-deadline:
			t.Fatalf("no line %s", what)
		}
	}
}

// adoptionBackend is a backend on socket in its own containerd namespace, with work and netns
// directories that a second backend (the restarted rep) can be given.
func adoptionBackend(t *testing.T, socket string, cfg Config) *Backend {
	t.Helper()
	cfg.Socket, cfg.KillGrace, cfg.Logger = socket, 2*time.Second, logtest.New(t)
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// adoptionConfig is a Config with a namespace, work directory and netns directory of t's own.
func adoptionConfig(t *testing.T) Config {
	return Config{
		Namespace: fmt.Sprintf("adopt-%d-%d", os.Getpid(), guidSeq.Add(1)),
		WorkDir:   filepath.Join(t.TempDir(), "work"),
		NetnsDir:  t.TempDir(),
	}
}

// repProcessEnv is set (to the backend's config as JSON) in TestRepProcess's environment.
const repProcessEnv = "GAVEL_OCI_REP_PROCESS"

// TestRepProcess is the rep that TestAdoptAfterTheRepDies kills: run only as its subprocess,
// it starts a ticking LRP and a sleeping task on a backend configured from repProcessEnv,
// prints "started LRP-GUID LRP-PID TASK-GUID TASK-PID" and waits to be killed.
func TestRepProcess(t *testing.T) {
	conf := os.Getenv(repProcessEnv)
	if conf == "" {
		t.Skip("the subprocess of TestAdoptAfterTheRepDies")
	}
	var cfg Config
	if err := json.Unmarshal([]byte(conf), &cfg); err != nil {
		t.Fatal(err)
	}
	b := adoptionBackend(t, cfg.Socket, cfg)
	lrpSpec := probeLRP(t, "tick")
	lrpSpec.Index = 3
	lrpSpec.Properties = map[string]string{"app_guid": "a1"}
	lrp, err := b.Start(context.Background(), lrpSpec)
	if err != nil {
		t.Fatalf("Start lrp: %v", err)
	}
	task, err := b.Start(context.Background(), probeTask(t, "sleep"))
	if err != nil {
		t.Fatalf("Start task: %v", err)
	}
	<-lrp.Healthy()
	fmt.Printf("started %s %d %s %d\n", lrp.Guid(), lrp.(*container).task.Pid(), task.Guid(), task.(*container).task.Pid())
	select {}
}

// TestAdoptAfterTheRepDies: a rep killed with SIGKILL (TestRepProcess, a subprocess) leaves
// its containers running; the next backend on the same work directory and namespace adopts
// them — the same init process (not restarted), its output captured again, a task that ended
// meanwhile reported with its exit — and removes what it does not own: a containerd
// container without a record and a container directory (with its overlay mount) without a
// containerd container.
func TestAdoptAfterTheRepDies(t *testing.T) {
	newTestBackend(t) // skips without containerd
	cfg := adoptionConfig(t)
	cfg.Socket = daemon.Socket
	conf, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^TestRepProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), repProcessEnv+"="+string(conf), "GAVEL_OCI_ROOTFS="+rootfsDir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lrpGuid, taskGuid string
	var lrpPid, taskPid uint32
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "started %s %d %s %d", &lrpGuid, &lrpPid, &taskGuid, &taskPid); err == nil {
			break
		}
	}
	if lrpGuid == "" {
		_ = cmd.Process.Kill()
		t.Fatalf("the rep subprocess started nothing: %v", cmd.Wait())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	b2 := adoptionBackend(t, daemon.Socket, cfg)
	// Leftovers: a containerd container without a record, a directory with a mounted overlay
	// but no containerd container.
	ctx := b2.ctx(context.Background())
	stray := guid(t)
	if _, err := b2.client.NewContainer(ctx, stray, containerd.WithNewSpec(oci.WithRootFSPath(rootfsDir))); err != nil {
		t.Fatalf("stray container: %v", err)
	}
	half := guid(t)
	ov := newOverlay(b2.containerDir(half), rootfsDir)
	if err := os.MkdirAll(b2.containerDir(half), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ov.mount(); err != nil {
		t.Fatal(err)
	}
	// The task ends while no rep watches it.
	if err := syscall.Kill(int(taskPid), syscall.SIGKILL); err != nil {
		t.Fatalf("kill the task's process: %v", err)
	}

	sinks := map[string]*lineSink{}
	adopted, err := b2.Adopt(context.Background(), func(s executor.Spec) executor.LogSink {
		sinks[s.Guid] = newLineSink()
		return sinks[s.Guid]
	})
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	got := map[string]executor.Adopted{}
	for _, a := range adopted {
		got[a.Spec.Guid] = a
	}
	if len(got) != 2 {
		t.Fatalf("adopted %v, want the lrp and the task", adopted)
	}
	a := got[lrpGuid]
	if a.Spec.Kind != executor.KindLRP || a.Spec.ProcessGuid != "probe" || a.Spec.Index != 3 ||
		a.Spec.Properties["app_guid"] != "a1" || a.Spec.Action.GetRun().GetPath() != "/bin/probe" {
		t.Errorf("adopted lrp spec %+v", a.Spec)
	}
	if pid := a.Container.(*container).task.Pid(); pid != lrpPid {
		t.Errorf("adopted lrp's init pid %d, want %d (not restarted)", pid, lrpPid)
	}
	<-a.Container.Healthy()
	sinks[lrpGuid].waitFor(t, "ticked after the adoption", func(l string) bool { return strings.HasPrefix(l, "tick ") })

	tk := got[taskGuid].Container
	<-tk.Done()
	if res := tk.Result(); !res.Failed || res.Reason != "signal: killed" {
		t.Errorf("task that ended meanwhile: %+v, want signal: killed", res)
	}
	assertGone(t, b2, taskGuid)
	assertGone(t, b2, stray)
	assertGone(t, b2, half)

	a.Container.Stop(time.Second)
	if res := a.Container.Result(); res.Reason != ReasonStopped {
		t.Errorf("adopted lrp stopped: %+v", res)
	}
	assertGone(t, b2, lrpGuid)
	if again, err := b2.Adopt(context.Background(), nil); err != nil || len(again) != 0 {
		t.Errorf("Adopt again: %v, %v; want nothing", again, err)
	}
}

// TestContainerdRestart: containers keep running through a containerd restart and the backend
// watches them again once it answers: an exit after the restart is seen, a stop works and
// leaves nothing.
func TestContainerdRestart(t *testing.T) {
	newTestBackend(t) // skips without containerd
	d := ocitest.New(t)
	b := adoptionBackend(t, d.Socket, adoptionConfig(t))
	lrp, err := b.Start(context.Background(), probeLRP(t, "sleep"))
	if err != nil {
		t.Fatalf("Start lrp: %v", err)
	}
	task, err := b.Start(context.Background(), probeTask(t, "sleep"))
	if err != nil {
		t.Fatalf("Start task: %v", err)
	}
	<-lrp.Healthy()
	if err := d.Restart(); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	select {
	case <-lrp.Done():
		t.Fatalf("lrp ended with containerd's restart: %+v", lrp.Result())
	case <-task.Done():
		t.Fatalf("task ended with containerd's restart: %+v", task.Result())
	default:
	}
	if err := task.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("Signal after the restart: %v", err)
	}
	<-task.Done()
	if res := task.Result(); res.Reason != "signal: killed" {
		t.Errorf("task killed after the restart: %+v", res)
	}
	assertGone(t, b, task.Guid())
	lrp.Stop(time.Second)
	if res := lrp.Result(); res.Reason != ReasonStopped {
		t.Errorf("lrp stopped after the restart: %+v", res)
	}
	assertGone(t, b, lrp.Guid())
}
