package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

func getJSON(t *testing.T, hostPort uint32) map[string]string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/", hostPort))
	if err != nil {
		t.Fatalf("GET through host port %d: %v", hostPort, err)
	}
	defer resp.Body.Close()
	var out map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return out
}

func TestRegistered(t *testing.T) {
	b, err := executor.New(Name, executor.Options{WorkDir: t.TempDir(), PortRangeStart: 61000, PortRangeEnd: 61001})
	if err != nil {
		t.Fatalf("executor.New(%q): %v", Name, err)
	}
	if _, ok := b.(*Backend); !ok {
		t.Fatalf("executor.New(%q) = %T", Name, b)
	}
}

func TestEnvAndPortMapping(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	spec := lrp("env", &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{httpCheck(8080, "/health")}},
		"GREETING", "hi", "OVERRIDDEN", "by-spec")
	spec.Ports = []uint32{8080, 9090, 8080}
	spec.Action.GetRun().Env = env("OVERRIDDEN", "by-run")
	c := start(t, b, spec)

	ni := c.NetInfo()
	if ni.GetAddress() != "127.0.0.1" || ni.GetInstanceAddress() != "127.0.0.1" {
		t.Errorf("NetInfo addresses = %s, %s; want the cell address", ni.GetAddress(), ni.GetInstanceAddress())
	}
	if len(ni.GetPorts()) != 2 {
		t.Fatalf("NetInfo ports = %v, want one mapping per distinct container port", ni.GetPorts())
	}
	hp, hp2 := hostPort(t, c, 8080), hostPort(t, c, 9090)
	for _, p := range []uint32{hp, hp2} {
		if int(p) < b.opts.PortRangeStart || int(p) > b.opts.PortRangeEnd {
			t.Errorf("host port %d outside %d-%d", p, b.opts.PortRangeStart, b.opts.PortRangeEnd)
		}
	}
	if hp == hp2 {
		t.Errorf("both container ports got host port %d", hp)
	}

	waitHealthy(t, c, 10*time.Second)
	expectRoutable(t, c, true, 5*time.Second)
	got := getJSON(t, hp)
	want := map[string]string{
		"PORT":             fmt.Sprint(hp),
		"PORT_8080":        fmt.Sprint(hp),
		"PORT_9090":        fmt.Sprint(hp2),
		"CF_INSTANCE_IP":   "127.0.0.1",
		"CF_INSTANCE_PORT": fmt.Sprint(hp),
		"CF_INSTANCE_ADDR": fmt.Sprintf("127.0.0.1:%d", hp),
		"INSTANCE_INDEX":   "2",
		"INSTANCE_GUID":    "env",
		"HOME":             filepath.Join(b.opts.WorkDir, "env"),
		"cwd":              filepath.Join(b.opts.WorkDir, "env"),
		"GREETING":         "hi",
		"OVERRIDDEN":       "by-run",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	var pairs []struct{ External, Internal int }
	if err := json.Unmarshal([]byte(got["CF_INSTANCE_PORTS"]), &pairs); err != nil {
		t.Fatalf("CF_INSTANCE_PORTS %q: %v", got["CF_INSTANCE_PORTS"], err)
	}
	if len(pairs) != 2 || pairs[0].External != int(hp) || pairs[0].Internal != 8080 ||
		pairs[1].External != int(hp2) || pairs[1].Internal != 9090 {
		t.Errorf("CF_INSTANCE_PORTS = %s", got["CF_INSTANCE_PORTS"])
	}
	// The second mapping reaches the same process.
	if got2 := getJSON(t, hp2); got2["PORT_9090"] != fmt.Sprint(hp2) {
		t.Errorf("through port %d: %v", hp2, got2)
	}

	c.Stop(5 * time.Second)
	if res := c.Result(); !res.Failed || res.Reason != ReasonStopped {
		t.Errorf("Result after Stop = %+v, want failed %q", res, ReasonStopped)
	}
	if _, err := os.Stat(filepath.Join(b.opts.WorkDir, "env")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("container directory still there after the container is done: %v", err)
	}
	if _, ok := <-c.Routable(); ok {
		// A buffered value may remain; the channel must then be closed.
		if _, ok := <-c.Routable(); ok {
			t.Errorf("Routable not closed after Done")
		}
	}
}

func TestHTTPHealthCheckFailsLater(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	fail := filepath.Join(t.TempDir(), "fail")
	c := start(t, b, lrp("http-fail", &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{httpCheck(8080, "health")}},
		"HEALTH_FAIL_FILE", fail))
	waitHealthy(t, c, 10*time.Second)
	if err := os.WriteFile(fail, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := waitDone(t, c, 10*time.Second)
	if !res.Failed || res.Reason != ReasonHealthCheckFailed {
		t.Errorf("Result = %+v, want failed %q", res, ReasonHealthCheckFailed)
	}
}

func TestTCPHealthCheckFailsLater(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	closeFile := filepath.Join(t.TempDir(), "close")
	c := start(t, b, lrp("tcp-fail", &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{tcpCheck(8080)}},
		"CLOSE_FILE", closeFile))
	waitHealthy(t, c, 10*time.Second)
	select {
	case <-c.Done():
		t.Fatalf("done while the port is open: %+v", c.Result())
	case <-time.After(500 * time.Millisecond):
	}
	if err := os.WriteFile(closeFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := waitDone(t, c, 10*time.Second)
	if !res.Failed || res.Reason != ReasonHealthCheckFailed {
		t.Errorf("Result = %+v, want failed %q", res, ReasonHealthCheckFailed)
	}
}

// TestChecksProbeTheCellAddress runs a process that binds only the address it is given
// (CF_INSTANCE_IP, the cell address, here 127.0.0.2): its HTTP and TCP checks reach it there,
// so it becomes healthy and routable, and it answers on the cell address and not on 127.0.0.1.
func TestChecksProbeTheCellAddress(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, func(o *executor.Options) { o.CellAddress = "127.0.0.2" })
	c := start(t, b, lrp("bound", &modelsv1.CheckDefinition{
		Checks:          []*modelsv1.Check{tcpCheck(8080)},
		ReadinessChecks: []*modelsv1.Check{httpCheck(8080, "/ready")},
	}, "BIND_INSTANCE_IP", "1"))
	waitHealthy(t, c, 10*time.Second)
	expectRoutable(t, c, true, 5*time.Second)
	hostPort := c.NetInfo().GetPorts()[0].GetHostPort()
	if got := c.NetInfo().GetAddress(); got != "127.0.0.2" {
		t.Errorf("net_info address %q, want the cell address 127.0.0.2", got)
	}
	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.2", strconv.Itoa(int(hostPort))))
	if err != nil {
		t.Fatalf("dial the cell address: %v", err)
	}
	conn.Close()
	if conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(hostPort)))); err == nil {
		conn.Close()
		t.Errorf("the process answers on 127.0.0.1:%d though it binds only CF_INSTANCE_IP", hostPort)
	}
}

func TestReadinessDrivesRoutable(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	notReady := filepath.Join(t.TempDir(), "not-ready")
	if err := os.WriteFile(notReady, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := start(t, b, lrp("ready", &modelsv1.CheckDefinition{
		Checks:          []*modelsv1.Check{tcpCheck(8080)},
		ReadinessChecks: []*modelsv1.Check{httpCheck(8080, "/ready")},
	}, "READY_FAIL_FILE", notReady))
	waitHealthy(t, c, 10*time.Second)
	select {
	case v := <-c.Routable():
		t.Fatalf("Routable sent %v while the readiness check fails", v)
	case <-time.After(500 * time.Millisecond):
	}
	if err := os.Remove(notReady); err != nil {
		t.Fatal(err)
	}
	expectRoutable(t, c, true, 5*time.Second)
	if err := os.WriteFile(notReady, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	expectRoutable(t, c, false, 5*time.Second)
	if err := os.Remove(notReady); err != nil {
		t.Fatal(err)
	}
	expectRoutable(t, c, true, 5*time.Second)
	select {
	case <-c.Done():
		t.Fatalf("a failing readiness check ended the container: %+v", c.Result())
	default:
	}
}

func TestStartTimeout(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	spec := lrp("slow", &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{tcpCheck(8080)}})
	spec.Action = sh("sleep 30")
	spec.StartTimeout = time.Second
	began := time.Now()
	c := start(t, b, spec)
	res := waitDone(t, c, 10*time.Second)
	if !res.Failed || res.Reason != ReasonNeverHealthy {
		t.Errorf("Result = %+v, want failed %q", res, ReasonNeverHealthy)
	}
	if d := time.Since(began); d < time.Second {
		t.Errorf("gave up after %v, before the start timeout", d)
	}
	select {
	case <-c.Healthy():
		t.Errorf("Healthy closed for an LRP that never passed its check")
	default:
	}
}

func TestNoChecks(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	spec := lrp("nochecks", nil)
	spec.Action = sh("sleep 30")
	c := start(t, b, spec)
	waitHealthy(t, c, 5*time.Second)
	expectRoutable(t, c, true, 5*time.Second)
	c.Stop(5 * time.Second)
}

func TestLRPExit(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	tests := []struct {
		name   string
		action *modelsv1.Action
		reason string
	}{
		{"clean", sh("exit 0"), ReasonExitedCleanly},
		{"crash", run(bin("exitwith"), "3", "boom"), "exit status 3: boom"},
		{"missing", run("/no/such/program"), "run /no/such/program: fork/exec /no/such/program: no such file or directory"},
	}
	for _, tc := range tests {
		spec := lrp("exit-"+tc.name, nil)
		spec.Action = tc.action
		c := start(t, b, spec)
		res := waitDone(t, c, 10*time.Second)
		if !res.Failed || res.Reason != tc.reason {
			t.Errorf("%s: Result = %+v, want failed %q", tc.name, res, tc.reason)
		}
	}
}

func TestActionTree(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	marks := openDir(t)
	mark := func(name string) string { return fmt.Sprintf("echo x > %s/%s", marks, name) }
	marked := func(name string) bool {
		_, err := os.Stat(filepath.Join(marks, name))
		return err == nil
	}
	long := strings.Repeat("y", 300)
	tests := []struct {
		name      string
		action    *modelsv1.Action
		reason    string // "" means success
		maxTime   time.Duration
		marked    []string
		notMarked []string
	}{
		{name: "serial stops at the first failure",
			action: serial(sh(mark("s1")), sh("exit 2"), sh(mark("s3"))),
			reason: "exit status 2", marked: []string{"s1"}, notMarked: []string{"s3"}},
		{name: "serial succeeds",
			action: serial(sh(mark("ok1")), sh(mark("ok2"))), marked: []string{"ok1", "ok2"}},
		{name: "parallel runs all at once",
			action:  parallel(sh("sleep 0.5; "+mark("p1")), sh("sleep 0.5; "+mark("p2"))),
			maxTime: 1400 * time.Millisecond, marked: []string{"p1", "p2"}},
		{name: "parallel fails if any fails",
			action: parallel(sh("sleep 0.2; "+mark("pf1")), sh("exit 5")),
			reason: "exit status 5", marked: []string{"pf1"}},
		{name: "codependent stops the others when one fails",
			action: codependent(sh("exit 3"), sh("sleep 30")),
			reason: "exit status 3", maxTime: 5 * time.Second},
		{name: "codependent stops the others when one exits cleanly",
			action:  codependent(sh("sleep 0.1"), sh("sleep 30")),
			maxTime: 5 * time.Second},
		{name: "try ignores the failure",
			action: serial(try(sh("exit 1")), sh(mark("after-try"))), marked: []string{"after-try"}},
		{name: "timeout fails a slow action",
			action: timeout(300, sh("sleep 30")), reason: "timed out after 300ms", maxTime: 5 * time.Second},
		{name: "timeout lets a quick action pass",
			action: timeout(5000, sh("true"))},
		{name: "stderr tail in the reason",
			action: run(bin("exitwith"), "4", "first", "second"), reason: "exit status 4: first | second"},
		{name: "long stderr is cut",
			action: run(bin("exitwith"), "4", "early", long), reason: "exit status 4: …" + long[100:]},
		{name: "signal",
			action: sh("kill -9 $$"), reason: "signal: killed"},
		{name: "empty action",
			action: &modelsv1.Action{}, reason: "empty action"},
	}
	var wg sync.WaitGroup
	for i, tc := range tests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Now()
			c, err := b.Start(t.Context(), task(fmt.Sprintf("tree-%d", i), tc.action))
			if err != nil {
				t.Errorf("%s: Start: %v", tc.name, err)
				return
			}
			defer c.Stop(0)
			select {
			case <-c.Done():
			case <-time.After(20 * time.Second):
				t.Errorf("%s: not done", tc.name)
				return
			}
			res := c.Result()
			if tc.reason == "" && res.Failed {
				t.Errorf("%s: failed: %q", tc.name, res.Reason)
			}
			if tc.reason != "" && (!res.Failed || res.Reason != tc.reason) {
				t.Errorf("%s: Result = %+v, want failed %q", tc.name, res, tc.reason)
			}
			if d := time.Since(began); tc.maxTime > 0 && d > tc.maxTime {
				t.Errorf("%s: took %v, want at most %v", tc.name, d, tc.maxTime)
			}
			for _, m := range tc.marked {
				if !marked(m) {
					t.Errorf("%s: step %s did not run", tc.name, m)
				}
			}
			for _, m := range tc.notMarked {
				if marked(m) {
					t.Errorf("%s: step %s ran", tc.name, m)
				}
			}
		}()
	}
	wg.Wait()
}

func TestTaskResultFile(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	tests := []struct {
		name   string
		action *modelsv1.Action
		file   string
		output string
		reason string
	}{
		{name: "read", action: run(bin("writeresult"), "out/result.json", `{"ok":true}`), file: "out/result.json",
			output: fmt.Sprintf("{\"ok\":true}\nuid=%d\n", os.Getuid())},
		{name: "missing", action: sh("true"), file: "nothing", reason: "read result file: openat nothing: no such file or directory"},
		{name: "too large", action: sh("head -c 20000 /dev/zero > big"), file: "big", reason: "result file big is larger than 10240 bytes"},
		{name: "failed task", action: sh("echo partial > r; echo oops >&2; exit 1"), file: "r", reason: "exit status 1: oops"},
	}
	for _, tc := range tests {
		spec := task("result-"+strings.ReplaceAll(tc.name, " ", "-"), serial(sh("mkdir -p out"), tc.action))
		spec.ResultFile = tc.file
		res := waitDone(t, start(t, b, spec), 10*time.Second)
		if tc.reason == "" {
			if res.Failed || res.Output != tc.output {
				t.Errorf("%s: Result = %+v, want output %q", tc.name, res, tc.output)
			}
			continue
		}
		if !res.Failed || !strings.HasPrefix(res.Reason, tc.reason) || res.Output != "" {
			t.Errorf("%s: Result = %+v, want failed %q…", tc.name, res, tc.reason)
		}
	}
}

func TestStopGrace(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	tests := []struct {
		name     string
		script   string
		grace    time.Duration
		min, max time.Duration
	}{
		{"exits on SIGTERM", "trap 'exit 0' TERM; while true; do sleep 0.05; done", 10 * time.Second, 0, 3 * time.Second},
		{"ignores SIGTERM", "trap '' TERM; while true; do sleep 0.05; done", 700 * time.Millisecond, 700 * time.Millisecond, 4 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := lrp("stop-"+strings.ReplaceAll(tc.name, " ", "-"), nil)
			spec.Action = sh(tc.script)
			c := start(t, b, spec)
			waitHealthy(t, c, 5*time.Second)
			time.Sleep(200 * time.Millisecond) // let the shell install its trap

			began := time.Now()
			var wg sync.WaitGroup
			for range 3 { // concurrent and repeated stops are fine
				wg.Add(1)
				go func() { defer wg.Done(); c.Stop(tc.grace) }()
			}
			wg.Wait()
			d := time.Since(began)
			if d < tc.min || d > tc.max {
				t.Errorf("Stop took %v, want between %v and %v", d, tc.min, tc.max)
			}
			if res := c.Result(); !res.Failed || res.Reason != ReasonStopped {
				t.Errorf("Result = %+v, want failed %q", res, ReasonStopped)
			}
			c.Stop(tc.grace) // after Done
		})
	}
}

func TestPortRelease(t *testing.T) {
	t.Parallel()
	// A range of one port: the second container gets it only once the first is done.
	b := newTestBackend(t, func(o *executor.Options) { o.PortRangeEnd = o.PortRangeStart })
	spec := lrp("port-a", nil)
	spec.Action = sh("sleep 30")
	a := start(t, b, spec)
	portA := hostPort(t, a, 8080)

	spec.Guid = "port-b"
	if _, err := b.Start(t.Context(), spec); err == nil {
		t.Fatalf("Start with no free port succeeded")
	}
	if _, err := os.Stat(filepath.Join(b.opts.WorkDir, "port-b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed Start left its directory: %v", err)
	}
	a.Stop(5 * time.Second)
	c := start(t, b, spec)
	if got := hostPort(t, c, 8080); got != portA {
		t.Errorf("after release got port %d, want %d", got, portA)
	}
	c.Stop(5 * time.Second)

	// A port something else on the host uses is skipped.
	b2 := newTestBackend(t, func(o *executor.Options) { o.PortRangeEnd = o.PortRangeStart + 1 })
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b2.opts.PortRangeStart)))
	if err != nil {
		t.Skipf("cannot hold port %d for the test: %v", b2.opts.PortRangeStart, err)
	}
	defer l.Close()
	spec.Guid = "port-c"
	c = start(t, b2, spec)
	if got := hostPort(t, c, 8080); int(got) != b2.opts.PortRangeStart+1 {
		t.Errorf("got port %d, want %d (the other one is in use)", got, b2.opts.PortRangeStart+1)
	}
}

func TestChroot(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	root := openDir(t)
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, bin("httpserver"), filepath.Join(root, "bin", "httpserver"))

	spec := lrp("chroot", &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{httpCheck(8080, "/health")}})
	spec.Action = run("httpserver") // found through PATH inside the rootfs
	spec.Chroot = true
	spec.RootfsPath = root
	c := start(t, b, spec)
	waitHealthy(t, c, 10*time.Second)
	got := getJSON(t, hostPort(t, c, 8080))
	if got["cwd"] != "/" || got["HOME"] != "/" {
		t.Errorf("cwd = %q, HOME = %q; want / in the chroot", got["cwd"], got["HOME"])
	}
	if _, err := os.Stat("/etc/resolv.conf"); err == nil {
		if got["resolv"] != "true" {
			t.Errorf("/etc/resolv.conf not copied into the rootfs")
		}
	}
	c.Stop(5 * time.Second)
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestDropPrivileges(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("dropping to nobody needs root")
	}
	b := newTestBackend(t, func(o *executor.Options) { o.User = "nobody" })
	for _, privileged := range []bool{false, true} {
		spec := task(fmt.Sprintf("nobody-%v", privileged), run(bin("writeresult"), "result", "hi"))
		spec.ResultFile = "result"
		spec.Privileged = privileged
		res := waitDone(t, start(t, b, spec), 10*time.Second)
		want := "hi\nuid=65534\n"
		if privileged {
			want = "hi\nuid=0\n"
		}
		if res.Failed || res.Output != want {
			t.Errorf("privileged=%v: Result = %+v, want output %q", privileged, res, want)
		}
	}
}

func TestCgroupLimits(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	if b.cgroups == nil {
		t.Skipf("cgroup v2 not writable here: %v", b.Notes())
	}
	spec := task("cgroup", sh("cat /proc/self/cgroup > result; cat "+
		filepath.Join(b.cgroups.parent, "cgroup", "memory.max")+" "+
		filepath.Join(b.cgroups.parent, "cgroup", "pids.max")+" >> result"))
	spec.MemoryMB = 64
	spec.MaxPids = 50
	spec.ResultFile = "result"
	res := waitDone(t, start(t, b, spec), 10*time.Second)
	if res.Failed {
		t.Fatalf("Result = %+v", res)
	}
	want := fmt.Sprintf("0::/%s/cgroup\n%d\n50\n", cgroupParent, 64<<20)
	if !strings.HasSuffix(res.Output, want) {
		t.Errorf("output %q, want it to end with %q", res.Output, want)
	}
	if _, err := os.Stat(filepath.Join(b.cgroups.parent, "cgroup")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup not removed: %v", err)
	}
}

func TestNotes(t *testing.T) {
	b, err := newBackend(executor.Options{WorkDir: t.TempDir(), PortRangeStart: 61000, PortRangeEnd: 61001}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	notes := strings.Join(b.Notes(), "; ")
	if !strings.Contains(notes, "memory and pid limits not enforced: cgroup v2 not mounted at") {
		t.Errorf("Notes = %q", notes)
	}
	t.Logf("on this machine: %v", newTestBackend(t, nil).Notes())
}

func TestDownload(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	archive := tgz(t, map[string]string{"hello.txt": "hello from the archive\n", "sub/deep.txt": "deep\n"})
	script := "#!/bin/sh\necho tool ran\n"
	srv := newLoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/app.tgz":
			_, _ = w.Write(archive)
		case "/tool":
			_, _ = io.WriteString(w, script)
		default:
			http.NotFound(w, r)
		}
	}))
	sum := sha256Hex(archive)
	tests := []struct {
		name   string
		action *modelsv1.Action
		output string
		reason string
	}{
		{name: "archive with checksum", action: serial(
			download(srv+"/app.tgz", "app", "sha256", sum),
			sh("cat app/hello.txt app/sub/deep.txt > result")),
			output: "hello from the archive\ndeep\n"},
		{name: "plain file", action: serial(
			download(srv+"/tool", "bin/tool", "", ""),
			sh("./bin/tool > result")),
			output: "tool ran\n"},
		{name: "checksum mismatch", action: download(srv+"/app.tgz", "app", "sha256", strings.Repeat("0", 64)),
			reason: "download " + srv + "/app.tgz: sha256 checksum mismatch"},
		{name: "not found", action: download(srv+"/missing", "x", "", ""),
			reason: "download " + srv + "/missing: get: status 404 Not Found"},
	}
	for i, tc := range tests {
		spec := task(fmt.Sprintf("download-%d", i), tc.action)
		spec.ResultFile = "result"
		res := waitDone(t, start(t, b, spec), 10*time.Second)
		if tc.reason == "" {
			if res.Failed || res.Output != tc.output {
				t.Errorf("%s: Result = %+v, want output %q", tc.name, res, tc.output)
			}
		} else if !res.Failed || !strings.HasPrefix(res.Reason, tc.reason) {
			t.Errorf("%s: Result = %+v, want failed %q…", tc.name, res, tc.reason)
		}
	}
}

func TestBadSpecs(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	spec := lrp("dup", nil)
	spec.Action = sh("sleep 30")
	start(t, b, spec)
	if _, err := b.Start(t.Context(), spec); err == nil {
		t.Errorf("Start of a duplicate guid succeeded")
	}
	for _, s := range []executor.Spec{
		{Guid: "../x", Action: sh("true")},
		{Guid: "noaction"},
		{Guid: "nochroot", Action: sh("true"), Chroot: true},
	} {
		if _, err := b.Start(t.Context(), s); err == nil {
			t.Errorf("Start(%+v) succeeded", s)
		}
	}
}

func TestKeepContainers(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	b.keep = true // what GAVEL_KEEP_CONTAINERS=1 sets
	res := waitDone(t, start(t, b, task("kept", sh("echo left > file"))), 10*time.Second)
	if res.Failed {
		t.Fatalf("Result = %+v", res)
	}
	if b, err := os.ReadFile(filepath.Join(b.opts.WorkDir, "kept", "file")); err != nil || string(b) != "left\n" {
		t.Errorf("kept directory: %q, %v", b, err)
	}
}

func TestLeftoverProcessesAreKilled(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	pidFile := filepath.Join(openDir(t), "pid")
	began := time.Now()
	res := waitDone(t, start(t, b, task("leftover", sh("sleep 30 & echo $! > "+pidFile))), 10*time.Second)
	if res.Failed {
		t.Fatalf("Result = %+v", res)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("a background child holding the output kept the task for %v", d)
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	for i := 0; i < 50; i++ {
		// Gone, or a zombie waiting for init.
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("background child %d still running after its task ended", pid)
}
