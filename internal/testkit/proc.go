package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Binary builds the project's binaries (the CLI, gavel-etcd, every service's command, the
// examples and the oci backend's test probe; static, CGO off) once per test process and returns
// the path of the one called name. Under -short it skips t before building. A package that
// calls it removes the binaries in its TestMain with RemoveBinaries.
func Binary(t testing.TB, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("over built binaries: skipped under -short")
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "gavel-bin")
		if buildErr != nil {
			return
		}
		_, self, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(self), "..", "..")
		// The go tool does not expand wildcards in directory names, so the services are globbed.
		pkgs := []string{"./cmd/...", "./examples/...", "./services/rep/internal/executor/oci/testdata/probe"}
		services, err := filepath.Glob(filepath.Join(root, "services", "*", "cmd"))
		if err != nil {
			buildErr = err
			return
		}
		for _, dir := range services {
			rel, _ := filepath.Rel(root, dir)
			pkgs = append(pkgs, "./"+rel+"/...")
		}
		cmd := exec.Command("go", append([]string{"build", "-o", binDir + "/"}, pkgs...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, name)
}

// RemoveBinaries removes what Binary built; a TestMain calls it after the run.
func RemoveBinaries() {
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
}

// SyncBuffer collects a process's output for failure messages; safe for concurrent use.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Proc is a process started by a test (StartProc): its output is kept for failure messages and
// it is stopped when the test ends.
type Proc struct {
	// Name names it in messages.
	Name string
	// Pid is its process id.
	Pid int
	// Out is its stdout and stderr.
	Out *SyncBuffer
	// Exited is closed once it has exited.
	Exited chan struct{}
	// Err is how it exited, once Exited is closed.
	Err error
}

// StartProc starts bin with args as name. When the test ends the process gets SIGINT (a rep
// would evacuate on SIGTERM), then SIGKILL after 10s, and its output is
// logged if the test failed.
func StartProc(t testing.TB, name, bin string, args ...string) *Proc {
	t.Helper()
	return StartProcWait(t, 10*time.Second, name, bin, args...)
}

// StartProcWait is StartProc with the time the process gets to stop after SIGINT.
func StartProcWait(t testing.TB, stopWait time.Duration, name, bin string, args ...string) *Proc {
	t.Helper()
	return StartProcEnv(t, stopWait, nil, name, bin, args...)
}

// StartProcEnv is StartProcWait with env ("KEY=value") added to the test's environment.
func StartProcEnv(t testing.TB, stopWait time.Duration, env []string, name, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, Out: &SyncBuffer{}, Exited: make(chan struct{})}
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
	// Killed with the test process too (a test binary stopped by a signal runs no cleanup).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p.Pid = cmd.Process.Pid
	go func() {
		p.Err = cmd.Wait()
		close(p.Exited)
	}()
	t.Cleanup(func() {
		if !p.Done() {
			_ = cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-p.Exited:
			case <-time.After(stopWait):
				t.Errorf("%s did not stop within %s of SIGINT", name, stopWait)
				_ = cmd.Process.Kill()
				<-p.Exited
			}
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.Out.String())
		}
	})
	return p
}

// Done reports whether the process has exited.
func (p *Proc) Done() bool {
	select {
	case <-p.Exited:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL and waits (at most 10s) for the process to be gone.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil && !p.Done() {
		t.Fatalf("kill %s: %v", p.Name, err)
	}
	select {
	case <-p.Exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still running 10s after SIGKILL", p.Name)
	}
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times (100 on Linux).
const clockTicks = 100

// ProcessCPU is process pid's user and system time so far, from /proc/PID/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command (which may hold spaces) start after its last ')', with the
	// state, field 3 as proc(5) counts them: utime and stime are fields 14 and 15.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(f[15-3], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// PeakRSS is process pid's peak resident set size in bytes (VmHWM of /proc/PID/status).
func PeakRSS(pid int) (uint64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// SelfCPU is the CPU time (user and system) this process has used so far: benchmarks report
// their CPU per operation with it, the steadier measure on a busy machine.
func SelfCPU(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
