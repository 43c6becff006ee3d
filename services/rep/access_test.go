package rep_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/ocitest"
	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/authz"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// repExec runs start in r's cell to its end (cancelling it once stop says the output so far is
// enough) and returns its stdout, stderr and exit code (-1 when cancelled).
func repExec(ctx context.Context, t *testing.T, r *repEnv, start *repv1.ExecStart, stop func(stdout, stderr string) bool) (string, string, int32, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := r.client.Exec(ctx)
	if err != nil {
		return "", "", 0, err
	}
	if err := stream.Send(&repv1.ExecRequest{Start: start}); err != nil {
		return "", "", 0, err
	}
	if err := stream.CloseSend(); err != nil {
		return "", "", 0, err
	}
	var out, errOut strings.Builder
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("ended without an exit code")
			}
			return out.String(), errOut.String(), 0, err
		}
		out.Write(m.GetStdout())
		errOut.Write(m.GetStderr())
		if m.ExitCode != nil {
			return out.String(), errOut.String(), m.GetExitCode(), nil
		}
		if stop != nil && stop(out.String(), errOut.String()) {
			return out.String(), errOut.String(), -1, nil
		}
	}
}

// TestContainerSeries: a sim cell's containers are sampled and appear on the rep's /metrics as
// container_* series labelled by process guid, index and instance guid, with their quotas;
// InstanceMetrics answers the same sample, NotFound for what the cell does not hold, and
// InvalidArgument naming the field.
func TestContainerSeries(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) {
		c.MetricsAddress = "127.0.0.1:0"
		c.Metrics.SampleInterval = rep.Duration(100 * time.Millisecond)
	})
	ctx := ctxT(t)
	web := desiredLRP("web", 1)
	desire(t, env, web)
	perform(t, r, []*repv1.LRPInstance{lrpWork(web, 0)}, nil)
	ig := waitRunning(t, env, r, "web", 0).GetInstanceKey().GetInstanceGuid()
	var m *repv1.ContainerMetrics
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		resp, err := r.client.InstanceMetrics(ctx, &repv1.InstanceMetricsRequest{ProcessGuid: "web"})
		if err != nil || len(resp.GetContainers()) != 1 {
			return false, fmt.Sprint(resp, err)
		}
		m = resp.GetContainers()[0]
		return m.GetSampledAt() != nil && m.GetCpuPercent() > 0, fmt.Sprint(m)
	}, "web sampled twice")
	if m.GetInstanceGuid() != ig || m.GetMemoryBytes() == 0 || m.GetMemoryBytes() > m.GetMemoryLimitBytes() || m.GetMemoryLimitBytes() != uint64(web.GetMemoryMb())<<20 {
		t.Fatalf("web's sample %v: want its instance, memory within its %d MiB quota", m, web.GetMemoryMb())
	}
	body := testkit.Scrape(t, r.svc.MetricsAddr())
	labels := fmt.Sprintf(`{index="0",instance_guid="%s",process_guid="web",task_guid=""}`, ig)
	for _, series := range []string{"container_cpu_usage_seconds_total", "container_memory_usage_bytes", "container_spec_memory_limit_bytes",
		"container_fs_usage_bytes", "container_fs_limit_bytes"} {
		if !strings.Contains(body, series+labels) {
			t.Errorf("/metrics lacks %s%s", series, labels)
		}
	}

	_, err := r.client.InstanceMetrics(ctx, &repv1.InstanceMetricsRequest{ProcessGuid: "nope"})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "nope") {
		t.Errorf("metrics of an LRP the cell does not hold: %v, want NotFound naming it", err)
	}
	_, err = r.client.InstanceMetrics(ctx, &repv1.InstanceMetricsRequest{TaskGuid: "t1", Index: new(int32)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "index") {
		t.Errorf("metrics of a task with an index: %v, want InvalidArgument naming index", err)
	}
	_, _, _, err = repExec(ctx, t, r, &repv1.ExecStart{ProcessGuid: "web", Command: []string{"id"}}, nil)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "sim backend cannot run commands") {
		t.Errorf("exec on a sim cell: %v, want FailedPrecondition saying the sim backend cannot", err)
	}
}

// TestOCIInstanceAccess: on an oci cell an instance's sample comes from its containerd task
// (memory in use, its quota), and exec runs commands inside the container: their output on
// stdout and stderr, their exit code, and on a terminal.
func TestOCIInstanceAccess(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: needs containerd")
	}
	d := ocitest.New(t)
	root := t.TempDir()
	for _, dir := range []string{"bin", "etc", "tmp"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := rootfstest.BuildStatic(".", filepath.Join(root, "bin"), "./internal/executor/oci/testdata/probe"); err != nil {
		t.Fatal(err)
	}
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) {
		c.Backend = rep.BackendOCI
		c.OCI.ContainerdSocket = d.Socket
		c.PreloadedRootfses = map[string]string{"cflinuxfs4": root}
		c.Metrics.SampleInterval = rep.Duration(200 * time.Millisecond)
	})
	ctx := ctxT(t)
	probe := func(args ...string) []string { return append([]string{"/bin/probe"}, args...) }
	web := desiredLRP("web", 1)
	web.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: []string{"sleep"}}}}
	web.MemoryMb = 64
	desire(t, env, web)
	if resp := perform(t, r, []*repv1.LRPInstance{lrpWork(web, 0)}, nil); len(resp.GetFailedLrps()) != 0 {
		t.Fatalf("the oci cell refused web/0: %v", resp)
	}
	waitRunning(t, env, r, "web", 0)

	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		resp, err := r.client.InstanceMetrics(ctx, &repv1.InstanceMetricsRequest{ProcessGuid: "web"})
		if err != nil || len(resp.GetContainers()) != 1 {
			return false, fmt.Sprint(resp, err)
		}
		m := resp.GetContainers()[0]
		return m.GetSampledAt() != nil && m.GetMemoryBytes() > 0 && m.GetMemoryLimitBytes() == 64<<20, fmt.Sprint(m)
	}, "web's containerd metrics sampled")

	_, _, code, err := repExec(ctx, t, r, &repv1.ExecStart{ProcessGuid: "web", Command: probe("exit", "3")}, nil)
	if err != nil || code != 3 {
		t.Fatalf("probe exit 3 in web: exit %d, %v; want 3", code, err)
	}
	out, errOut, _, err := repExec(ctx, t, r, &repv1.ExecStart{ProcessGuid: "web", Command: probe("say", "to stdout", "to stderr")},
		func(out, errOut string) bool {
			return strings.Contains(out, "to stdout") && strings.Contains(errOut, "to stderr")
		})
	if err != nil {
		t.Fatalf("probe say in web: %v (stdout %q, stderr %q)", err, out, errOut)
	}
	out, _, _, err = repExec(ctx, t, r, &repv1.ExecStart{ProcessGuid: "web", Command: probe("say", "on a tty", "also"), Tty: true},
		func(out, _ string) bool {
			return strings.Contains(out, "on a tty\r\n") && strings.Contains(out, "also")
		})
	if err != nil {
		t.Fatalf("probe say on a terminal in web: %v (output %q)", err, out)
	}
	_, _, _, err = repExec(ctx, t, r, &repv1.ExecStart{ProcessGuid: "web", Command: []string{"/bin/nothing"}}, nil)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("exec of a missing program: %v, want FailedPrecondition", err)
	}
}

// TestUserRoleRecheck: over mutual TLS the rep checks again the role of the user the BBS
// calls for (authz.OnBehalfOf): logs and metrics for a read-only user pass the check, exec for
// one is refused, as is any of them when the BBS names no user; admin calling directly passes.
func TestUserRoleRecheck(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "rep", "bbs", "admin")
	if err != nil {
		t.Fatal(err)
	}
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) { c.TLS = pki["rep"] })
	dial := func(name string) repv1.RepServiceClient {
		conn, err := grpcx.Dial(r.svc.Addr().String(), grpcx.ClientConfig{TLS: pki[name]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return repv1.NewRepServiceClient(conn)
	}
	bbs, admin := dial("bbs"), dial("admin")
	as := func(role string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), authz.UserIdentityKey, "spiffe://gavel/someone", authz.UserRoleKey, role)
	}
	metrics := func(ctx context.Context, c repv1.RepServiceClient) error {
		_, err := c.InstanceMetrics(ctx, &repv1.InstanceMetricsRequest{ProcessGuid: "web"})
		return err
	}
	exec := func(ctx context.Context, c repv1.RepServiceClient) error {
		s, err := c.Exec(ctx)
		if err == nil {
			err = s.Send(&repv1.ExecRequest{Start: &repv1.ExecStart{ProcessGuid: "web", Command: []string{"id"}}})
		}
		if err == nil || errors.Is(err, io.EOF) {
			// A stream the server already ended fails Send with io.EOF; Recv has its status.
			_, err = s.Recv()
		}
		return err
	}
	logs := func(ctx context.Context, c repv1.RepServiceClient) error {
		_, err := readLogsFrom(ctx, c, &repv1.StreamLogsRequest{ProcessGuid: "web"})
		return err
	}
	for _, tt := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"metrics for read-only", metrics(as("read-only"), bbs), codes.NotFound},
		{"logs for read-only", logs(as("read-only"), bbs), codes.NotFound},
		{"exec for admin", exec(as("admin"), bbs), codes.NotFound},
		{"exec for read-only", exec(as("read-only"), bbs), codes.PermissionDenied},
		{"logs for a rep", logs(as("rep/cell-9"), bbs), codes.PermissionDenied},
		{"metrics for nobody", metrics(ctxT(t), bbs), codes.PermissionDenied},
		{"exec by admin itself", exec(ctxT(t), admin), codes.NotFound},
	} {
		if status.Code(tt.err) != tt.want {
			t.Errorf("%s: %v, want %s", tt.name, tt.err, tt.want)
		}
	}
}

// readLogsFrom reads a StreamLogs stream of client c to its end.
func readLogsFrom(ctx context.Context, c repv1.RepServiceClient, req *repv1.StreamLogsRequest) ([]*repv1.LogLine, error) {
	stream, err := c.StreamLogs(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []*repv1.LogLine
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, resp.GetLines()...)
	}
}
