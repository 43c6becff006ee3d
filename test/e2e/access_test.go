package e2e

// Instance access (logs, syslog drains, metrics, exec) over the built binaries: a cluster with
// mutual TLS where each component presents its own identity, and the built CLI as a user runs
// it.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// gavelArgs are the CLI's flags reaching c's BBS as identity, then args.
func (c *cluster) gavelArgs(identity string, args ...string) []string {
	id := c.pki[identity]
	return append([]string{"--bbs", c.bbsAddr, "--tls-cert", id.CertFile, "--tls-key", id.KeyFile, "--tls-ca", id.CAFile}, args...)
}

// follower is a running `gavel logs -f` whose output lines are kept with their arrival times.
type follower struct {
	mu    sync.Mutex
	lines []arrived
	out   *syncBuffer // stderr
	done  chan struct{}
}

// arrived is one line the CLI printed and when the test read it.
type arrived struct {
	text string
	at   time.Time
}

// follow starts `gavel logs -f` with args as identity; it is stopped when the test ends.
func (c *cluster) follow(t *testing.T, gavelBin, identity string, args ...string) *follower {
	t.Helper()
	cmd := exec.Command(gavelBin, c.gavelArgs(identity, append([]string{"logs", "-f"}, args...)...)...)
	f := &follower{out: &syncBuffer{}, done: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = f.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(f.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f.mu.Lock()
			f.lines = append(f.lines, arrived{sc.Text(), time.Now()})
			f.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-f.done:
		case <-time.After(10 * time.Second):
			t.Errorf("gavel logs -f did not stop within 10s of SIGINT")
			_ = cmd.Process.Kill()
			<-f.done
		}
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("gavel logs -f %s (stderr):\n%s", strings.Join(args, " "), f.out.String())
		}
	})
	return f
}

// snapshot is what the follower has printed so far.
func (f *follower) snapshot() []arrived {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]arrived(nil), f.lines...)
}

// ended reports whether the CLI's output ended (it exited).
func (f *follower) ended() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// tickRE matches a line of tickScript as `gavel logs` prints it: the source and index, then
// the instance index, a counter and the time it was printed in Unix nanoseconds.
var (
	tickRE    = regexp.MustCompile(`\[APP/PROC/WEB/(\d+)\] OUT tick (\d+) (\d+) (\d+)$`)
	startedRE = regexp.MustCompile(`\[APP/PROC/WEB/(\d+)\] OUT started pid (\d+)$`)
)

// tickScript prints its pid, then a numbered line ten times a second with the time it was
// printed.
const tickScript = `echo "started pid $$"; i=0; while :; do i=$((i+1)); echo "tick $INSTANCE_INDEX $i $(date +%s%N)"; sleep 0.1; done`

// tickLRP is an LRP of the process cells running tickScript.
func tickLRP(guid string, instances int32, drains ...string) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid, Domain: "e2e", Rootfs: "preloaded:cflinuxfs4", Instances: instances,
		MemoryMb: 64, DiskMb: 64, LogGuid: guid + "-app", LogDrains: drains,
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/sh", Args: []string{"-c", tickScript}}}},
	}
}

// TestLogsAndDrainsOverBuiltBinaries: `gavel logs hello -f` (the built CLI, over mutual TLS)
// shows the lines of all three instances as they are printed (the lag from printing to the
// CLI's output is logged), then, when one instance is killed, its CELL lifecycle lines (the
// crash, the new container) and the replacement's own lines, on the same follow; `--tail 10`
// prints exactly the last 10 lines. A syslog receiver (RFC 5424 over TCP) gets the app's
// lines with its structured data, and a task's with the task's (its lines also in `gavel logs
// --task`; a task with an https drain is refused naming the field, and not made); `gavel
// update-lrp --log-drain` moves the running instances' lines to another receiver; a second drain of the LRP where nothing accepts loses lines,
// counted in the rep's gavel_rep_drain_lines_dropped_total, while the app, the working drain
// and `gavel logs` go on.
func TestLogsAndDrainsOverBuiltBinaries(t *testing.T) {
	gavelBin := binary(t, "gavel")
	c := startClusterOpts(t, clusterOptions{tls: true, repMetrics: true})
	recv := testkit.NewSyslogReceiver(t, nil)
	dead := testkit.ReservedAddr(t) // reserved: nothing listens there
	c.desire(t, tickLRP("hello", 3, "syslog://"+recv.Addr(), "syslog://"+dead))
	running := c.waitRunning(t, "hello", 3, 60*time.Second)

	f := c.follow(t, gavelBin, "admin", "hello")
	followed := time.Now()
	// Lines of every instance arrive; the lag of a line is from the time it holds (printed)
	// to the time the test read it from the CLI.
	var maxLag time.Duration
	c.waitFor(t, 30*time.Second, "lines of the 3 instances printed after the follow started", func() (bool, string) {
		seen := map[string]bool{}
		maxLag = 0
		for _, l := range f.snapshot() {
			m := tickRE.FindStringSubmatch(l.text)
			if m == nil || m[1] != m[2] {
				continue
			}
			ns, _ := strconv.ParseInt(m[4], 10, 64)
			printed := time.Unix(0, ns)
			if printed.Before(followed) {
				continue
			}
			seen[m[1]] = true
			maxLag = max(maxLag, l.at.Sub(printed))
		}
		return len(seen) == 3 && !f.ended(), fmt.Sprintf("instances seen %v, CLI ended: %v", seen, f.ended())
	})
	t.Logf("lines of all 3 instances arrived through the BBS; the largest lag from printing to the CLI's output: %s", maxLag)

	// Kill instance 1: its crash, its replacement's container and the replacement's lines come
	// on the same follow.
	var pid int
	for _, l := range f.snapshot() {
		if m := startedRE.FindStringSubmatch(l.text); m != nil && m[1] == "1" {
			pid, _ = strconv.Atoi(m[2])
		}
	}
	if pid == 0 {
		// Started before the follow: the cell kept the line, so a tail shows it.
		out, err := exec.Command(gavelBin, c.gavelArgs("admin", "logs", "hello", "--index", "1")...).CombinedOutput()
		if err != nil {
			t.Fatalf("gavel logs hello --index 1: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if m := startedRE.FindStringSubmatch(line); m != nil {
				pid, _ = strconv.Atoi(m[2])
			}
		}
	}
	if pid == 0 {
		t.Fatal("no 'started pid' line of instance 1")
	}
	killedAt := len(f.snapshot())
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill instance 1 (pid %d): %v", pid, err)
	}
	c.waitFor(t, 60*time.Second, "instance 1's crash, its new container and the replacement's lines", func() (bool, string) {
		var crashed, created bool
		newPid := ""
		replacementTicks := 0
		for _, l := range f.snapshot()[killedAt:] {
			switch {
			case strings.Contains(l.text, "[CELL/1] OUT crashed: "):
				crashed = true
			case crashed && strings.Contains(l.text, "[CELL/1] OUT container created"):
				created = true
			}
			if m := startedRE.FindStringSubmatch(l.text); m != nil && m[1] == "1" && created && m[2] != strconv.Itoa(pid) {
				newPid = m[2]
			}
			if m := tickRE.FindStringSubmatch(l.text); m != nil && m[1] == "1" && newPid != "" {
				replacementTicks++
			}
		}
		return replacementTicks >= 3, fmt.Sprintf("crash line %v, container created %v, replacement pid %q, its ticks %d", crashed, created, newPid, replacementTicks)
	})

	// --tail 10: exactly the last 10 lines of the LRP over its cells, in time order; of one
	// instance once it printed more than 10.
	out, err := exec.Command(gavelBin, c.gavelArgs("admin", "logs", "hello", "--tail", "10")...).Output()
	if err != nil {
		t.Fatalf("gavel logs hello --tail 10: %v", err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	inOrder := slices.IsSortedFunc(lines, func(a, b string) int { // each starts with its time, fixed width
		return strings.Compare(strings.Fields(a)[0], strings.Fields(b)[0])
	})
	if len(lines) != 10 || !inOrder {
		t.Fatalf("gavel logs hello --tail 10 printed %d lines, want the last 10 in time order:\n%s", len(lines), out)
	}
	c.waitFor(t, 20*time.Second, "instance 2's 12th line", func() (bool, string) {
		for _, l := range f.snapshot() {
			if strings.Contains(l.text, "OUT tick 2 12 ") {
				return true, ""
			}
		}
		return false, ""
	})
	out, err = exec.Command(gavelBin, c.gavelArgs("admin", "logs", "hello", "--index", "2", "--tail", "10")...).Output()
	if lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n"); err != nil || len(lines) != 10 || !strings.Contains(lines[9], "[APP/PROC/WEB/2]") {
		t.Fatalf("gavel logs hello --index 2 --tail 10: %v, %d lines:\n%s", err, len(lines), out)
	}

	// The syslog receiver has the app's lines with the structured data of their instance.
	ig0 := running[0].GetInstanceKey().GetInstanceGuid()
	var msg []string
	c.waitFor(t, 20*time.Second, "the drain's RFC 5424 message of instance 0's tick 5", func() (bool, string) {
		msg = recv.FindPrefix("tick 0 5 ")
		return msg != nil, fmt.Sprintf("%d messages", recv.Count())
	})
	sd := fmt.Sprintf(`[gavel@47450 process_guid="hello" index="0" instance_guid="%s" source="APP/PROC/WEB"]`, ig0)
	if msg[1] != "14" || msg[3] != running[0].GetInstanceKey().GetCellId() || msg[4] != "hello-app" || msg[5] != "[APP/PROC/WEB/0]" || msg[7] != sd {
		t.Errorf("drain message %q: want <14>, host %s, app hello-app, procid [APP/PROC/WEB/0], SD %s", msg[0], running[0].GetInstanceKey().GetCellId(), sd)
	}

	// A task's lines: at its drain with the task's structured data, and in gavel logs --task. A
	// drain that is not syslog is refused naming the field, and no task is made.
	task := &modelsv1.TaskDefinition{Rootfs: "preloaded:cflinuxfs4", MemoryMb: 32, DiskMb: 32, LogGuid: "job-app",
		LogDrains: []string{"syslog://" + recv.Addr()},
		Action:    &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/sh", Args: []string{"-c", "echo task says hi; sleep 1"}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bad := proto.Clone(task).(*modelsv1.TaskDefinition)
	bad.LogDrains = []string{"https://logs.example.com:443"}
	_, err = c.bbs.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: "bad-job", Domain: "e2e", Definition: bad})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "definition.log_drains[0]") {
		t.Fatalf("a task with an https drain: %v, want InvalidArgument naming definition.log_drains[0]", err)
	}
	if _, err := c.bbs.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: "bad-job"}); status.Code(err) != codes.NotFound {
		t.Fatalf("the refused task: %v, want NotFound", err)
	}
	if _, err := c.bbs.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: "job", Domain: "e2e", Definition: task}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, 30*time.Second, "the task's line at its drain and in gavel logs --task", func() (bool, string) {
		msg = recv.Find("task says hi")
		out, err := exec.Command(gavelBin, c.gavelArgs("admin", "logs", "--task", "job")...).CombinedOutput()
		return msg != nil && err == nil && strings.Contains(string(out), "[APP/TASK/job/0] OUT task says hi"),
			fmt.Sprintf("drain message %q; gavel logs --task job: %v\n%s", msg, err, out)
	})
	if want := `[gavel@47450 task_guid="job" instance_guid="job" source="APP/TASK/job"]`; msg[4] != "job-app" || msg[7] != want {
		t.Errorf("the task's drain message %q: want app job-app and SD %s", msg[0], want)
	}

	// The drain where nothing accepts loses lines, counted on every cell; the app, the
	// working drain and the follow go on.
	for cell, addr := range c.repMetrics {
		c.waitFor(t, 20*time.Second, cell+" counting the dead drain's dropped lines", func() (bool, string) {
			v, err := scrapeValue(addr, "gavel_rep_drain_lines_dropped_total")
			return err == nil && v > 0, fmt.Sprintf("%v %v", v, err)
		})
	}
	received, printed := recv.Count(), len(f.snapshot())
	c.waitFor(t, 20*time.Second, "the working drain and the follow going on", func() (bool, string) {
		return recv.Count() > received+20 && len(f.snapshot()) > printed+20 && !f.ended(),
			fmt.Sprintf("drain %d→%d messages, follow %d→%d lines", received, recv.Count(), printed, len(f.snapshot()))
	})

	// gavel update-lrp --log-drain switches the running instances' drains: all three
	// instances' lines reach the new receiver.
	next := testkit.NewSyslogReceiver(t, nil)
	if out, err := exec.Command(gavelBin, c.gavelArgs("admin", "update-lrp", "hello", "--log-drain", "syslog://"+next.Addr())...).CombinedOutput(); err != nil {
		t.Fatalf("gavel update-lrp hello --log-drain: %v\n%s", err, out)
	}
	c.waitFor(t, 30*time.Second, "the three instances' lines at the new drain", func() (bool, string) {
		found := 0
		for _, index := range []string{"0", "1", "2"} {
			if next.FindPrefix("tick "+index+" ") != nil {
				found++
			}
		}
		return found == 3, fmt.Sprintf("%d instances, %d messages", found, next.Count())
	})
}

// scrapeValue reads the value of an unlabelled series from a plain-HTTP /metrics at addr.
func scrapeValue(addr, series string) (float64, error) {
	resp, err := httpClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, errors.New(resp.Status)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s's /metrics", series, addr)
}

// buildUsage builds the instance metrics tests' program (test/integration/testdata/usage) and
// returns its path.
func buildUsage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir, "../integration/testdata/usage")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the usage program: %v\n%s", err, out)
	}
	return filepath.Join(dir, "usage")
}

// openPTY opens a pseudo-terminal pair: the master the test drives and the terminal the CLI
// gets as its standard streams (the route the rep's process backend takes, without cgo).
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("SKIP: no pseudo-terminals here (%v)", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 30, Col: 100}); err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return master, tty
}

// statusField is the value of field in a /proc/PID/status text ("" when absent).
func statusField(status, field string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// exitCode is the exit status of a finished command (-1 when it did not run or was killed).
func exitCode(err error) int {
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	}
	return -1
}

// TestExecMetricsAndRolesOverBuiltBinaries, on process cells over mutual TLS, with the built
// CLI: `gavel exec hello/0 -- cat /proc/self/status` runs in the instance (its user and
// groups, its environment and directory; the command's exit status is the CLI's); `gavel exec
// -it` on a pseudo-terminal the test drives echoes what is typed and exits with the shell's
// status; an instance that allocated 50 MiB shows about that much and a CPU spinner most of a
// core in `gavel top` (a read-only identity); read-only follows logs but its exec is refused
// (exit code 3, PermissionDenied, the refusal in the BBS's audit log); a rep's identity is
// refused logs, metrics and exec of another cell's instance, at the BBS and at that cell.
func TestExecMetricsAndRolesOverBuiltBinaries(t *testing.T) {
	gavelBin, usage := binary(t, "gavel"), buildUsage(t)
	c := startClusterOpts(t, clusterOptions{tls: true, repArgs: []string{"--metrics-sample-interval", "500ms"}})
	hello := tickLRP("hello", 1)
	hello.Env = []*modelsv1.EnvironmentVariable{{Name: "GREETING", Value: "hi there"}}
	mem, spin := tickLRP("mem", 1), tickLRP("spin", 1)
	mem.MemoryMb, spin.MemoryMb = 256, 256
	mem.Action.GetRun().Path, mem.Action.GetRun().Args = usage, []string{"mem", "50"}
	spin.Action.GetRun().Path, spin.Action.GetRun().Args = usage, []string{"spin"}
	for _, d := range []*modelsv1.DesiredLRP{hello, mem, spin} {
		c.desire(t, d)
	}
	h := c.waitRunning(t, "hello", 1, 60*time.Second)[0]
	c.waitRunning(t, "mem", 1, 60*time.Second)
	c.waitRunning(t, "spin", 1, 60*time.Second)
	ig := h.GetInstanceKey().GetInstanceGuid()
	gavel := func(identity string, args ...string) (string, error) {
		out, err := exec.Command(gavelBin, c.gavelArgs(identity, args...)...).CombinedOutput()
		return string(out), err
	}

	// The instance's own process, from its first line.
	var pid int
	c.waitFor(t, 20*time.Second, "hello's 'started pid' line", func() (bool, string) {
		out, err := gavel("admin", "logs", "hello")
		for _, line := range strings.Split(out, "\n") {
			if m := startedRE.FindStringSubmatch(line); m != nil {
				pid, _ = strconv.Atoi(m[2])
			}
		}
		return pid != 0, fmt.Sprintf("%v: %s", err, out)
	})
	own, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	ownDir, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		t.Fatal(err)
	}

	out, err := gavel("admin", "exec", "hello/0", "--", "cat", "/proc/self/status")
	if err != nil || statusField(out, "Name") != "cat" {
		t.Fatalf("gavel exec hello/0 -- cat /proc/self/status: %v\n%s", err, out)
	}
	for _, field := range []string{"Uid", "Gid", "Groups"} {
		if got, want := statusField(out, field), statusField(string(own), field); got != want {
			t.Errorf("exec'd cat runs with %s %q, the instance with %q", field, got, want)
		}
	}
	out, err = gavel("admin", "exec", "hello", "--", "/bin/sh", "-c", `echo "$INSTANCE_INDEX $INSTANCE_GUID $GREETING"; pwd; exit 3`)
	if want := "0 " + ig + " hi there\n" + ownDir + "\n"; exitCode(err) != 3 || !strings.HasPrefix(out, want) {
		t.Fatalf("gavel exec hello -- sh: exit %d (%v), output %q; want exit 3 and %q", exitCode(err), err, out, want)
	}

	// An interactive shell on a pseudo-terminal the test drives.
	master, tty := openPTY(t)
	cmd := exec.Command(gavelBin, c.gavelArgs("admin", "exec", "-it", "hello/0", "--", "/bin/sh")...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	tty.Close() // the CLI holds it now
	screen := &syncBuffer{}
	go func() { _, _ = io.Copy(screen, master) }()
	if _, err := master.WriteString("stty size; echo $((6*7))\n"); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, 20*time.Second, "the shell's answer on the terminal", func() (bool, string) {
		return strings.Contains(screen.String(), "42\r\n"), fmt.Sprintf("%q", screen.String())
	})
	if sc := screen.String(); !strings.Contains(sc, "echo $((6*7))") || !strings.Contains(sc, "30 100\r\n") {
		t.Errorf("the terminal did not echo the typed line or the shell got another size than 30x100: %q", sc)
	}
	if _, err := master.WriteString("exit 5\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if exitCode(err) != 5 {
			t.Fatalf("gavel exec -it: %v, want exit status 5; terminal: %q", err, screen.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("gavel exec -it did not end after exit 5; terminal: %q", screen.String())
	}

	// Metrics, read-only: 50 MiB allocated, a core spinning. The spinner gets a whole core
	// only on an idle machine: the figure wanted is at least 50%, or half the share of a core
	// the kernel says the spinner has had over its life when the machine is too busy for that.
	spinPID := pidOf(t, usage, "spin")
	var memBytes, spinCPU, share float64
	c.waitFor(t, 60*time.Second, "mem's 50 MiB and spin's core in gavel top", func() (bool, string) {
		m, err1 := topSample(gavelBin, c, "mem")
		sp, err2 := topSample(gavelBin, c, "spin")
		share = cpuShare(t, spinPID)
		memBytes, spinCPU = m.memory, sp.cpu
		return err1 == nil && err2 == nil && memBytes >= 30<<20 && spinCPU >= min(50, 100*share/2),
			fmt.Sprintf("mem %+v %v, spin %+v %v, spin's share of a core so far %.2f", m, err1, sp, err2, share)
	})
	if memBytes > 200<<20 || spinCPU > 100*float64(runtime.NumCPU())+10 {
		t.Errorf("mem shows %.1f MiB, want about 50; spin %.1f%%, more than the machine's %d cores", memBytes/(1<<20), spinCPU, runtime.NumCPU())
	}
	t.Logf("gavel top (read-only): mem %.1f MiB, spin %.1f%% of a core (the kernel: %.0f%% over its life so far, on a machine shared with other work)",
		memBytes/(1<<20), spinCPU, 100*share)
	for _, args := range [][]string{{"top", "mem"}, {"lrp", "mem"}} {
		if out, err := gavel("read-only", args...); err != nil || !strings.Contains(out, " of 256M") {
			t.Errorf("gavel %s as read-only: %v, want the memory column (of 256M):\n%s", strings.Join(args, " "), err, out)
		}
	}

	// read-only follows logs; its exec is refused and audited.
	f := c.follow(t, gavelBin, "read-only", "hello", "--tail", "0")
	c.waitFor(t, 20*time.Second, "read-only's follow printing hello's ticks", func() (bool, string) {
		n := 0
		for _, l := range f.snapshot() {
			if tickRE.MatchString(l.text) {
				n++
			}
		}
		return n >= 3, fmt.Sprintf("%d ticks", n)
	})
	// Several times: the refusal ends the stream before the CLI's first message may be sent,
	// and the CLI must then read the status rather than report the send's EOF.
	for range 5 {
		out, err = gavel("read-only", "exec", "hello/0", "--", "id")
		if exitCode(err) != 3 || !strings.Contains(out, "permission denied") || !strings.Contains(out, "Exec") {
			t.Fatalf("gavel exec as read-only: exit %d (%v), want 3 and a permission denied naming Exec:\n%s", exitCode(err), err, out)
		}
	}
	waitOutput(t, c.bbsProc, "refused", "identity=spiffe://gavel/read-only", "call=/gavel.bbs.v1.BBSService/Exec")
	waitOutput(t, c.bbsProc, "exec:", "identity=spiffe://gavel/admin", "process_guid=hello", "instance_guid="+ig, `command="cat /proc/self/status"`)

	// A rep's identity, at the BBS and at the cell holding hello, for logs, metrics and exec.
	cellID := h.GetInstanceKey().GetCellId()
	other := "rep/cell-z1"
	if cellID == "cell-z1" {
		other = "rep/cell-z2"
	}
	for _, args := range [][]string{{"logs", "hello"}, {"top", "hello"}, {"exec", "hello/0", "--", "id"}} {
		out, err := gavel(other, args...)
		if exitCode(err) != 3 || !strings.Contains(out, "permission denied") {
			t.Errorf("gavel %s as %s: exit %d (%v), want 3 (permission denied):\n%s", strings.Join(args, " "), other, exitCode(err), err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cells, err := c.bbs.Cells(ctx, &bbsv1.CellsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var repAddr string
	for _, p := range cells.GetCells() {
		if p.GetCellId() == cellID {
			repAddr = p.GetRepAddress()
		}
	}
	rep := repv1.NewRepServiceClient(c.dial(t, repAddr, other))
	logs, err := rep.StreamLogs(ctx, &repv1.StreamLogsRequest{ProcessGuid: "hello"})
	if err == nil {
		_, err = logs.Recv()
	}
	wantDenied(t, err, "StreamLogs")
	_, err = rep.InstanceMetrics(ctx, &repv1.InstanceMetricsRequest{ProcessGuid: "hello"})
	wantDenied(t, err, "InstanceMetrics")
	stream, err := rep.Exec(ctx)
	if err == nil {
		// A Send after the server ended the stream answers io.EOF; Recv has the status.
		_ = stream.Send(&repv1.ExecRequest{Start: &repv1.ExecStart{ProcessGuid: "hello", Command: []string{"id"}}})
		_, err = stream.Recv()
	}
	wantDenied(t, err, "Exec")
}

// sample is one container's figures as `gavel top -o json` shows them.
type sample struct {
	memory, cpu float64
}

// topSample is guid's instance 0 from `gavel top GUID -o json` as read-only.
func topSample(gavelBin string, c *cluster, guid string) (sample, error) {
	out, err := exec.Command(gavelBin, c.gavelArgs("read-only", "top", guid, "-o", "json")...).Output()
	if err != nil {
		return sample{}, fmt.Errorf("gavel top %s: %w", guid, err)
	}
	var resp bbsv1.InstanceMetricsResponse
	if err := protojson.Unmarshal(out, &resp); err != nil {
		return sample{}, fmt.Errorf("gavel top %s -o json: %w: %s", guid, err, out)
	}
	if len(resp.GetContainers()) != 1 || resp.GetContainers()[0].GetSampledAt() == nil {
		return sample{}, fmt.Errorf("gavel top %s: %s", guid, out)
	}
	m := resp.GetContainers()[0]
	return sample{memory: float64(m.GetMemoryBytes()), cpu: m.GetCpuPercent()}, nil
}

// pidOf finds the process running path with arg as its first argument.
func pidOf(t testing.TB, path, arg string) int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if argv := strings.Split(string(cmdline), "\x00"); len(argv) >= 2 && argv[0] == path && argv[1] == arg {
			return pid
		}
	}
	t.Fatalf("no process runs %s %s", path, arg)
	return 0
}

// procStat is /proc/PID/stat by field number as proc(5) counts them (from 1; the command, which
// may hold spaces, is left out: fields 1 and 2 are empty).
func procStat(t testing.TB, pid int) []string {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"", "", ""}, strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))...)
}

// clockTicks is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux's architectures).
const clockTicks = 100

// cpuShare is the share of a core pid has used since it started: its user and system time
// over its age, from /proc/PID/stat and /proc/uptime.
func cpuShare(t testing.TB, pid int) float64 {
	t.Helper()
	f := procStat(t, pid) // utime is field 14, stime 15, starttime 22
	utime, _ := strconv.ParseFloat(f[14], 64)
	stime, _ := strconv.ParseFloat(f[15], 64)
	start, _ := strconv.ParseFloat(f[22], 64)
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	uptime, _ := strconv.ParseFloat(strings.Fields(string(up))[0], 64)
	age := uptime - start/clockTicks
	if age <= 0 {
		return 0
	}
	return (utime + stime) / clockTicks / age
}

// TestOCIInstanceAccessOverBuiltBinaries: on an oci cell (built binaries, a private
// containerd, runc, a CNI bridge), with the built CLI: `gavel logs` shows the sample app's
// lines; `gavel exec` runs in the container (its pid namespace, where pid 1 is the app, and its
// environment) and returns
// the command's exit status; `gavel top` shows about 50 MiB for an instance that allocated 50 MiB
// (the container's working set, from containerd's metrics). The rootfs holds only the sample
// app and the usage program, so the command run is the usage program's cat and env.
func TestOCIInstanceAccessOverBuiltBinaries(t *testing.T) {
	o := startOCICell(t)
	c := o.cluster
	gavelBin := binary(t, "gavel")
	usage, err := os.ReadFile(buildUsage(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "cflinuxfs4", "bin", "usage"), usage, 0o755); err != nil {
		t.Fatal(err)
	}
	// startOCICell's rootfs has a /tmp (mode 1777) the container's unprivileged user may write
	// its ballast file in.
	hello := helloLRP("oci-hello", "preloaded:cflinuxfs4", "/bin/hello", 1, nil)
	hello.Env = []*modelsv1.EnvironmentVariable{{Name: "GREETING", Value: "hi there"}}
	mem := tickLRP("oci-mem", 1)
	mem.MemoryMb = 256
	mem.Action.GetRun().Path, mem.Action.GetRun().Args, mem.Action.GetRun().Dir = "/bin/usage", []string{"mem", "50"}, "/tmp"
	c.desire(t, hello)
	c.desire(t, mem)
	c.waitRunning(t, "oci-hello", 1, 60*time.Second)
	c.waitRunning(t, "oci-mem", 1, 60*time.Second)
	gavel := func(args ...string) (string, error) {
		out, err := exec.Command(gavelBin, append([]string{"--insecure", "--bbs", c.bbsAddr}, args...)...).CombinedOutput()
		return string(out), err
	}

	c.waitFor(t, 20*time.Second, "the sample app's line in gavel logs", func() (bool, string) {
		out, err := gavel("logs", "oci-hello")
		return err == nil && strings.Contains(out, "[APP/PROC/WEB/0] ERR ") && strings.Contains(out, "hello: instance 0 ("), fmt.Sprintf("%v\n%s", err, out)
	})

	// In the container's pid namespace: pid 1 is the app.
	out, err := gavel("exec", "oci-hello/0", "--", "/bin/usage", "cat", "/proc/self/status")
	if err != nil || statusField(out, "Name") != "usage" {
		t.Fatalf("gavel exec oci-hello/0 -- usage cat /proc/self/status: %v\n%s", err, out)
	}
	if out, err := gavel("exec", "oci-hello/0", "--", "/bin/usage", "cat", "/proc/1/cmdline"); err != nil || out != "/bin/hello\x00" {
		t.Fatalf("gavel exec oci-hello/0 -- usage cat /proc/1/cmdline: %v, %q; want the app as pid 1", err, out)
	}
	out, err = gavel("exec", "oci-hello/0", "--", "/bin/usage", "env")
	if err != nil || !strings.Contains(out, "GREETING=hi there\n") || !strings.Contains(out, "INSTANCE_INDEX=0\n") {
		t.Fatalf("gavel exec oci-hello/0 -- usage env: %v\n%s", err, out)
	}
	if out, err := gavel("exec", "oci-hello/0", "--", "/bin/usage"); exitCode(err) != 2 {
		t.Fatalf("gavel exec oci-hello/0 -- usage: exit %d (%v), want 2\n%s", exitCode(err), err, out)
	}

	var m sample
	c.waitFor(t, 60*time.Second, "oci-mem's 50 MiB in gavel top", func() (bool, string) {
		out, err := exec.Command(gavelBin, "--insecure", "--bbs", c.bbsAddr, "top", "oci-mem", "-o", "json").Output()
		if err != nil {
			return false, err.Error()
		}
		var resp bbsv1.InstanceMetricsResponse
		if err := protojson.Unmarshal(out, &resp); err != nil || len(resp.GetContainers()) != 1 {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		m = sample{memory: float64(resp.GetContainers()[0].GetMemoryBytes())}
		return m.memory >= 30<<20, string(out)
	})
	if m.memory > 200<<20 {
		t.Errorf("oci-mem shows %.1f MiB, want about 50", m.memory/(1<<20))
	}
	t.Logf("gavel top on the oci cell: oci-mem %.1f MiB", m.memory/(1<<20))
}
