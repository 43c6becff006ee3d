package process

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// binDir holds the helper programs of testdata, built once by TestMain (world-readable, so
// that processes running as nobody can execute them).
var binDir string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "process-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := rootfstest.BuildStatic(".", dir, "./testdata/httpserver", "./testdata/exitwith", "./testdata/writeresult"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	binDir = dir
	return m.Run()
}

func bin(name string) string { return filepath.Join(binDir, name) }

// openDir is a temporary directory everyone can read and traverse (for processes running as
// nobody).
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "process-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// portBlock is the number of host ports each test backend gets: a block private to the test
// (testkit.PortBlock), so packages and worktrees testing at once never hand out one port twice.
const portBlock = 20

func newTestBackend(t *testing.T, tweak func(*executor.Options)) *Backend {
	t.Helper()
	first, last := testkit.PortBlock(t, portBlock)
	opts := executor.Options{
		CellAddress:    "127.0.0.1",
		PortRangeStart: first,
		PortRangeEnd:   last,
		WorkDir:        filepath.Join(openDir(t), "work"),
	}
	if tweak != nil {
		tweak(&opts)
	}
	b, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	b.killGrace = 2 * time.Second
	return b
}

func start(t *testing.T, b *Backend, spec executor.Spec) executor.Container {
	t.Helper()
	c, err := b.Start(t.Context(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { c.Stop(0) })
	return c
}

func waitDone(t *testing.T, c executor.Container, within time.Duration) executor.Result {
	t.Helper()
	select {
	case <-c.Done():
		return c.Result()
	case <-time.After(within):
		t.Fatalf("container %s not done within %v", c.Guid(), within)
		return executor.Result{}
	}
}

func waitHealthy(t *testing.T, c executor.Container, within time.Duration) {
	t.Helper()
	select {
	case <-c.Healthy():
	case <-c.Done():
		t.Fatalf("container %s done before healthy: %+v", c.Guid(), c.Result())
	case <-time.After(within):
		t.Fatalf("container %s not healthy within %v", c.Guid(), within)
	}
}

func expectRoutable(t *testing.T, c executor.Container, want bool, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case got, ok := <-c.Routable():
			if !ok {
				t.Fatalf("Routable closed while waiting for %v", want)
			}
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("Routable did not send %v within %v", want, within)
		}
	}
}

func hostPort(t *testing.T, c executor.Container, containerPort uint32) uint32 {
	t.Helper()
	for _, m := range c.NetInfo().GetPorts() {
		if m.GetContainerPort() == containerPort {
			return m.GetHostPort()
		}
	}
	t.Fatalf("no host port for container port %d in %v", containerPort, c.NetInfo())
	return 0
}

// Action builders.

func run(path string, args ...string) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path, Args: args}}}
}

func sh(script string) *modelsv1.Action { return run("sh", "-c", script) }

func serial(as ...*modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: as}}}
}

func parallel(as ...*modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Parallel{Parallel: &modelsv1.ParallelAction{Actions: as}}}
}

func codependent(as ...*modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Codependent{Codependent: &modelsv1.CodependentAction{Actions: as}}}
}

func try(a *modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Try{Try: &modelsv1.TryAction{Action: a}}}
}

func timeout(ms int64, a *modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Timeout{Timeout: &modelsv1.TimeoutAction{Action: a, TimeoutMs: ms}}}
}

func download(from, to, alg, sum string) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{
		From: from, To: to, ChecksumAlgorithm: alg, ChecksumValue: sum,
	}}}
}

func httpCheck(port uint32, path string) *modelsv1.Check {
	return &modelsv1.Check{Kind: &modelsv1.Check_Http{Http: &modelsv1.HTTPCheck{Port: port, Path: path, IntervalMs: 100}}}
}

func tcpCheck(port uint32) *modelsv1.Check {
	return &modelsv1.Check{Kind: &modelsv1.Check_Tcp{Tcp: &modelsv1.TCPCheck{Port: port, IntervalMs: 100}}}
}

func env(kv ...string) []*modelsv1.EnvironmentVariable {
	var out []*modelsv1.EnvironmentVariable
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &modelsv1.EnvironmentVariable{Name: kv[i], Value: kv[i+1]})
	}
	return out
}

// lrp is an LRP spec running the test HTTP server on container port 8080.
func lrp(guid string, checks *modelsv1.CheckDefinition, kv ...string) executor.Spec {
	return executor.Spec{
		Guid:        guid,
		Kind:        executor.KindLRP,
		ProcessGuid: "pg-" + guid,
		Index:       2,
		Action:      run(bin("httpserver")),
		Ports:       []uint32{8080},
		Checks:      checks,
		Env:         env(kv...),
	}
}

func task(guid string, action *modelsv1.Action) executor.Spec {
	return executor.Spec{Guid: guid, Kind: executor.KindTask, TaskGuid: guid, Action: action}
}
