package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/services/rep"
)

// accessCluster runs a cluster with mutual TLS and one process cell sampling every 200ms,
// capturing every component's log lines (the BBS's audit lines among them) in logs.
func accessCluster(t *testing.T, logs *syncBuffer) *devcluster.Cluster {
	t.Helper()
	cfg := rep.Default()
	cfg.CellID, cfg.Zone = "cell-0", "z1"
	cfg.Backend = rep.BackendProcess
	cfg.WorkDir = t.TempDir()
	cfg.PreloadedRootfses = map[string]string{"x": t.TempDir()}
	cfg.Capacity = rep.Capacity{MemoryMB: 4096, DiskMB: 4096, Containers: 20}
	cfg.Metrics.SampleInterval = rep.Duration(200 * time.Millisecond)
	dc := devcluster.Config{Cells: []devcluster.Cell{{Config: cfg}}, TLS: true}
	dc.Dir, dc.BBSAddress, dc.AuctioneerAddress = t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	dc.UnsafeNoFsync = true
	dc.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	c := devcluster.New(dc)
	testkit.Start(t, "cluster", c)
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		resp, err := c.BBS.Cells(context.Background(), &bbsv1.CellsRequest{})
		if err != nil {
			return false, err.Error()
		}
		return len(resp.GetCells()) == 1, fmt.Sprintf("%d cells", len(resp.GetCells()))
	}, "the cell present")
	return c
}

// processLRP is a one-instance LRP of the process cell running path with args.
func processLRP(guid, path string, args ...string) *modelsv1.DesiredLRP {
	d := desiredLRP(guid, "preloaded:x", 1, nil)
	d.Ports = nil
	d.MemoryMb, d.DiskMb = 256, 64
	d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path, Args: args}}}
	return d
}

// running waits for guid's instance 0 to be RUNNING and returns it.
func running(t *testing.T, c *devcluster.Cluster, guid string) *modelsv1.ActualLRP {
	t.Helper()
	var got *modelsv1.ActualLRP
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		as := actualLRPs(t, c, guid)
		if len(as) == 1 && as[0].GetState() == modelsv1.ActualLRP_STATE_RUNNING {
			got = as[0]
			return true, ""
		}
		return false, fmt.Sprintf("%v", as)
	}, guid+" running")
	return got
}

// execResult is what an exec printed and how it ended.
type execResult struct {
	stdout, stderr string
	code           int32
	instance, cell string
}

// execIn runs start through client's Exec with stdin as input, to its end.
func execIn(ctx context.Context, client bbsv1.BBSServiceClient, start *repv1.ExecStart, stdin string) (execResult, error) {
	stream, err := client.Exec(ctx)
	if err != nil {
		return execResult{}, err
	}
	// A Send after the BBS ended the stream (a refusal) answers io.EOF; Recv below has the
	// status, so send errors are left to it.
	_ = stream.Send(&bbsv1.ExecRequest{Start: start})
	if stdin != "" {
		_ = stream.Send(&bbsv1.ExecRequest{Stdin: []byte(stdin)})
	}
	if err := stream.CloseSend(); err != nil {
		return execResult{}, err
	}
	var r execResult
	var out, errOut bytes.Buffer
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("ended without an exit code")
			}
			return r, err
		}
		out.Write(m.GetStdout())
		errOut.Write(m.GetStderr())
		if m.GetInstanceGuid() != "" {
			r.instance, r.cell = m.GetInstanceGuid(), m.GetCellId()
		}
		if m.ExitCode != nil {
			r.stdout, r.stderr, r.code = out.String(), errOut.String(), m.GetExitCode()
			return r, nil
		}
	}
}

// TestInstanceMetricsThroughTheBBS: on a process cell (no cgroup v2 here: the rep reads its
// processes' /proc entries), an instance that allocated 50 MiB shows about that much memory
// and its 2 MiB file as disk, with its quotas, to a read-only identity through the BBS; a CPU
// spinner shows CPU use (the figure is logged: on an idle machine it is about 100% of a core);
// an unknown LRP is NotFound, a bad request names its field, and a rep's identity is refused.
func TestInstanceMetricsThroughTheBBS(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "./testdata/usage")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the usage program: %v\n%s", err, out)
	}
	logs := &syncBuffer{}
	c := accessCluster(t, logs)
	ctx := t.Context()
	for _, d := range []*modelsv1.DesiredLRP{processLRP("mem", filepath.Join(bin, "usage"), "mem", "50"), processLRP("spin", filepath.Join(bin, "usage"), "spin")} {
		if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
			t.Fatal(err)
		}
	}
	mem := running(t, c, "mem")
	running(t, c, "spin")
	readOnly := tlsBBS(t, c, "read-only")

	var m *repv1.ContainerMetrics
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		resp, err := readOnly.InstanceMetrics(ctx, &bbsv1.InstanceMetricsRequest{ProcessGuid: "mem"})
		if err != nil {
			return false, err.Error()
		}
		if len(resp.GetContainers()) != 1 {
			return false, fmt.Sprintf("%v", resp)
		}
		m = resp.GetContainers()[0]
		return m.GetMemoryBytes() >= 50<<20 && m.GetDiskBytes() >= 2<<20, fmt.Sprintf("%v", m)
	}, "mem's 50 MiB and its 2 MiB file sampled")
	if m.GetMemoryBytes() > 80<<20 || m.GetDiskBytes() > 8<<20 {
		t.Errorf("mem uses %d bytes of memory and %d of disk, want about 50 MiB and 2 MiB", m.GetMemoryBytes(), m.GetDiskBytes())
	}
	if m.GetMemoryLimitBytes() != 256<<20 || m.GetDiskLimitBytes() != 64<<20 || m.GetCellId() != "cell-0" ||
		m.GetInstanceGuid() != mem.GetInstanceKey().GetInstanceGuid() || m.GetState() != "running" {
		t.Errorf("mem's sample %v: want quotas 256 MiB and 64 MiB, cell-0, its instance guid, running", m)
	}
	t.Logf("mem: %.1f MiB of memory, %.1f MiB of disk", float64(m.GetMemoryBytes())/(1<<20), float64(m.GetDiskBytes())/(1<<20))

	var spin *repv1.ContainerMetrics
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		resp, err := readOnly.InstanceMetrics(ctx, &bbsv1.InstanceMetricsRequest{ProcessGuid: "spin", Index: new(int32)})
		if err != nil {
			return false, err.Error()
		}
		spin = resp.GetContainers()[0]
		return spin.GetCpuPercent() > 0 && spin.GetCpuSeconds() > 0, fmt.Sprintf("%v", spin)
	}, "spin's CPU use sampled")
	if max := float64(100*runtime.NumCPU()) + 10; spin.GetCpuPercent() > max {
		t.Errorf("spin uses %.1f%% CPU, more than the machine's %d cores", spin.GetCpuPercent(), runtime.NumCPU())
	}
	t.Logf("spin: %.1f%% of a core (%d cores here, shared with whatever else runs)", spin.GetCpuPercent(), runtime.NumCPU())

	_, err := readOnly.InstanceMetrics(ctx, &bbsv1.InstanceMetricsRequest{ProcessGuid: "nope"})
	wantStatus(t, err, codes.NotFound, "nope")
	_, err = readOnly.InstanceMetrics(ctx, &bbsv1.InstanceMetricsRequest{ProcessGuid: "mem", TaskGuid: "t"})
	wantStatus(t, err, codes.InvalidArgument, "process_guid")
	_, err = tlsBBS(t, c, "rep/cell-0").InstanceMetrics(ctx, &bbsv1.InstanceMetricsRequest{ProcessGuid: "mem"})
	wantStatus(t, err, codes.PermissionDenied, "InstanceMetrics")
}

// TestExecThroughTheBBS: admin runs commands in a process instance through the BBS — they see
// the instance's environment and working directory, and their exit codes come back; an
// interactive shell on a pseudo-terminal echoes what the test types and returns its exit code;
// every exec is audited with the identity, the instance and the command; read-only and a rep
// are refused (PermissionDenied, audited); an unknown LRP or index is NotFound, an instance
// not running FailedPrecondition, an empty command InvalidArgument naming start.command.
func TestExecThroughTheBBS(t *testing.T) {
	logs := &syncBuffer{}
	c := accessCluster(t, logs)
	// Bounded: a stream that never shows what the test waits for fails it, not the suite's timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	d := processLRP("hello", "/bin/sh", "-c", "exec sleep 600")
	d.Env = []*modelsv1.EnvironmentVariable{{Name: "GREETING", Value: "hi there"}}
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatal(err)
	}
	hello := running(t, c, "hello")
	ig := hello.GetInstanceKey().GetInstanceGuid()

	r, err := execIn(ctx, c.BBS, &repv1.ExecStart{ProcessGuid: "hello", Command: []string{"cat", "/proc/self/status"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.code != 0 || !strings.Contains(r.stdout, "Name:\tcat") || r.instance != ig || r.cell != "cell-0" {
		t.Fatalf("cat /proc/self/status: %+v; want exit 0, cat's status, instance %s on cell-0", r, ig)
	}
	r, err = execIn(ctx, c.BBS, &repv1.ExecStart{ProcessGuid: "hello", Command: []string{"/bin/sh", "-c", `echo "$INSTANCE_INDEX $INSTANCE_GUID $GREETING"; pwd; read line; echo "got $line" >&2; exit 3`}}, "typed\n")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 3 || len(lines) != 2 || lines[0] != "0 "+ig+" hi there" || !strings.Contains(lines[1], ig) || r.stderr != "got typed\n" {
		t.Fatalf("sh in hello: %+v; want exit 3, the instance's index, guid and env, its directory, stdin echoed on stderr", r)
	}

	// An interactive shell on a terminal: what is typed is echoed, and its exit code returns.
	stream, err := c.BBS.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *bbsv1.ExecRequest) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&bbsv1.ExecRequest{Start: &repv1.ExecStart{ProcessGuid: "hello", Command: []string{"/bin/sh"}, Tty: true, Size: &repv1.TerminalSize{Rows: 24, Cols: 80}}})
	send(&bbsv1.ExecRequest{Resize: &repv1.TerminalSize{Rows: 40, Cols: 120}})
	send(&bbsv1.ExecRequest{Stdin: []byte("stty size; echo $((6*7))\n")})
	var screen strings.Builder
	for !strings.Contains(screen.String(), "42\r\n") || !strings.Contains(screen.String(), "40 120") {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("interactive shell: %v after %q", err, screen.String())
		}
		screen.Write(m.GetStdout())
	}
	if !strings.Contains(screen.String(), "echo $((6*7))") {
		t.Errorf("the terminal did not echo the typed line: %q", screen.String())
	}
	send(&bbsv1.ExecRequest{Stdin: []byte("exit 5\n")})
	var code *int32
	for code == nil {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("interactive shell's end: %v", err)
		}
		code = m.ExitCode
	}
	if *code != 5 {
		t.Fatalf("interactive shell exited %d, want 5", *code)
	}

	// Refusals and bad input.
	_, err = execIn(ctx, tlsBBS(t, c, "read-only"), &repv1.ExecStart{ProcessGuid: "hello", Command: []string{"id"}}, "")
	wantStatus(t, err, codes.PermissionDenied, "Exec")
	_, err = execIn(ctx, tlsBBS(t, c, "rep/cell-0"), &repv1.ExecStart{ProcessGuid: "hello", Command: []string{"id"}}, "")
	wantStatus(t, err, codes.PermissionDenied, "Exec")
	_, err = execIn(ctx, c.BBS, &repv1.ExecStart{ProcessGuid: "nope", Command: []string{"id"}}, "")
	wantStatus(t, err, codes.NotFound, "nope")
	_, err = execIn(ctx, c.BBS, &repv1.ExecStart{ProcessGuid: "hello", Index: 4, Command: []string{"id"}}, "")
	wantStatus(t, err, codes.NotFound, "index 4")
	_, err = execIn(ctx, c.BBS, &repv1.ExecStart{ProcessGuid: "hello"}, "")
	wantStatus(t, err, codes.InvalidArgument, "start.command")
	_, err = execIn(ctx, c.BBS, &repv1.ExecStart{ProcessGuid: "hello", Command: []string{"no-such-program"}}, "")
	wantStatus(t, err, codes.FailedPrecondition, "no-such-program")
	starting := processLRP("starting", "/bin/sh", "-c", "exec sleep 600")
	starting.Ports = []uint32{8080}
	starting.StartTimeoutMs = 600_000
	starting.CheckDefinition = &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{{Kind: &modelsv1.Check_Tcp{Tcp: &modelsv1.TCPCheck{Port: 8080}}}}}
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: starting}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() bool {
		as := actualLRPs(t, c, "starting")
		return len(as) == 1 && as[0].GetState() == modelsv1.ActualLRP_STATE_CLAIMED
	}, "starting claimed")
	_, err = execIn(ctx, c.BBS, &repv1.ExecStart{ProcessGuid: "starting", Command: []string{"id"}}, "")
	wantStatus(t, err, codes.FailedPrecondition, "not running")

	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		audit := logs.String()
		var want []string
		for _, w := range []string{
			`exec: identity=spiffe://gavel/admin role=admin call=Exec process_guid=hello index=0 instance_guid=` + ig + ` cell_id=cell-0 command="cat /proc/self/status"`,
			`exec ended: identity=spiffe://gavel/admin role=admin call=Exec process_guid=hello index=0 instance_guid=` + ig,
			`exit_code=5`,
			`refused: identity=spiffe://gavel/read-only role=read-only call=/gavel.bbs.v1.BBSService/Exec`,
		} {
			if !strings.Contains(audit, w) {
				want = append(want, w)
			}
		}
		return len(want) == 0, fmt.Sprintf("audit log lacks %q", want)
	}, "the execs and the refusal audited")
}

// tlsBBS is a BBS client of c presenting identity's certificate.
func tlsBBS(t *testing.T, c *devcluster.Cluster, identity string) bbsv1.BBSServiceClient {
	t.Helper()
	conn, err := grpcx.Dial(c.BBSAddress, grpcx.ClientConfig{TLS: c.PKI[identity]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return bbsv1.NewBBSServiceClient(conn)
}

// wantStatus fails unless err has code and its message mentions what.
func wantStatus(t *testing.T, err error, code codes.Code, what string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message()+fmt.Sprint(st.Details()), what) {
		t.Fatalf("got %v, want %s mentioning %q", err, code, what)
	}
}
