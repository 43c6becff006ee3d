package rep_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/authz"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
)

// processRep runs the rep with the process backend (the instances are real /bin/sh
// processes) on workDir.
func processRep(workDir string) func(*rep.Config) {
	return func(c *rep.Config) {
		c.Backend = rep.BackendProcess
		c.WorkDir = workDir
	}
}

// shLRP is an LRP whose instances run script with /bin/sh.
func shLRP(guid, script string) *modelsv1.DesiredLRP {
	d := desiredLRP(guid, 1)
	d.Ports = nil
	d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/sh", Args: []string{"-c", script}}}}
	return d
}

// readLogs reads a StreamLogs stream to its end.
func readLogs(ctx context.Context, r *repEnv, req *repv1.StreamLogsRequest) ([]*repv1.LogLine, error) {
	stream, err := r.client.StreamLogs(ctx, req)
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

// texts renders lines as "SOURCE text" for messages and comparisons.
func texts(lines []*repv1.LogLine) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.GetSource() + " " + l.GetText()
	}
	return out
}

func hasLine(lines []*repv1.LogLine, source, prefix string) bool {
	for _, l := range lines {
		if l.GetSource() == source && strings.HasPrefix(l.GetText(), prefix) {
			return true
		}
	}
	return false
}

// TestLogsProcessBackend: an instance's printed lines reach a following StreamLogs client
// (labelled APP/PROC/WEB, with index, instance guid and stream) along with the cell's
// lifecycle lines; tail 10 returns exactly the last 10 lines; since filters; a crashing
// instance's lines end with "crashed: exit status 3" and a follower of it is let go when it
// ends; a failing health check writes HEALTH lines before the crash; a follower is let go when
// the rep stops; a rep restarted on the same work dir still serves the earlier lines.
func TestLogsProcessBackend(t *testing.T) {
	env := bbstest.Start(t)
	workDir := t.TempDir()
	r := startRep(t, env, processRep(workDir))
	ctx := ctxT(t)

	// A follower started before the instance exists gets its lines as they come.
	web := shLRP("web", `echo oops >&2; i=1; while [ $i -le 50 ]; do echo "line $i"; i=$((i+1)); done; exec sleep 600`)
	desire(t, env, web)
	perform(t, r, []*repv1.LRPInstance{lrpWork(web, 0)}, nil)
	follow, err := r.client.StreamLogs(ctx, &repv1.StreamLogsRequest{ProcessGuid: "web", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	ig := waitRunning(t, env, r, "web", 0).GetInstanceKey().GetInstanceGuid()
	var followed []*repv1.LogLine
	// The health check's line is written when the check passes, which may come after the app's
	// last line: follow until both are in.
	for !hasLine(followed, "APP/PROC/WEB", "oops") || !hasLine(followed, "APP/PROC/WEB", "line 50") || !hasLine(followed, "CELL", "health check passed") {
		resp, err := follow.Recv()
		if err != nil {
			t.Fatalf("follow: %v after %q", err, texts(followed))
		}
		followed = append(followed, resp.GetLines()...)
	}
	for _, want := range [][2]string{{"CELL", "creating container"}, {"CELL", "container created"}, {"CELL", "health check passed"}, {"APP/PROC/WEB", "line 1"}} {
		if !hasLine(followed, want[0], want[1]) {
			t.Errorf("followed lines %q lack %q", texts(followed), want)
		}
	}
	for _, l := range followed {
		wantStream := repv1.LogStream_LOG_STREAM_STDOUT
		if l.GetText() == "oops" {
			wantStream = repv1.LogStream_LOG_STREAM_STDERR
		}
		if l.GetIndex() != 0 || l.GetInstanceGuid() != ig || l.GetStream() != wantStream || l.GetTimestamp() == nil {
			t.Fatalf("line %v: want index 0, instance %s, %s, a timestamp", l, ig, wantStream)
		}
	}

	// Nothing more is printed: tail 10 is exactly the last 10 of everything kept.
	all, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	tail, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "web", Index: proto.Int32(0), Tail: proto.Int32(10)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := texts(tail), texts(all[len(all)-10:]); strings.Join(got, "|") != strings.Join(want, "|") || !hasLine(tail, "APP/PROC/WEB", "line 50") {
		t.Fatalf("tail 10 = %q, want %q ending with line 50", got, want)
	}
	since := followed[len(followed)-1].GetTimestamp()
	recent, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "web", Since: since})
	if err != nil || len(recent) == 0 || recent[0].GetTimestamp().AsTime().Before(since.AsTime()) {
		t.Fatalf("since %v: %q, %v", since.AsTime(), texts(recent), err)
	}

	// A crash: its lifecycle lines carry the reason, and a follower is let go once the cell
	// no longer holds the instance (no auctioneer here places a replacement).
	crasher := shLRP("crasher", `sleep 0.3; echo bye; exit 3`)
	desire(t, env, crasher)
	perform(t, r, []*repv1.LRPInstance{lrpWork(crasher, 0)}, nil)
	testkit.Eventually(t, 10*time.Second, func() bool {
		_, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "crasher"})
		return err == nil
	}, "crasher's log exists")
	followCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	crashLines, err := readLogs(followCtx, r, &repv1.StreamLogsRequest{ProcessGuid: "crasher", Index: proto.Int32(0), Follow: true})
	if err != nil {
		t.Fatalf("follow of the crashing instance: %v (%q)", err, texts(crashLines))
	}
	if !hasLine(crashLines, "APP/PROC/WEB", "bye") || !hasLine(crashLines, "CELL", "crashed: exit status 3") {
		t.Fatalf("crasher's lines %q lack its output or its crash reason", texts(crashLines))
	}

	// A health check that never passes: its HEALTH line, then the crash with its reason.
	unhealthy := shLRP("unhealthy", `exec sleep 600`)
	unhealthy.Ports = []uint32{8080}
	unhealthy.StartTimeoutMs = 300
	unhealthy.CheckDefinition = &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{{Kind: &modelsv1.Check_Tcp{Tcp: &modelsv1.TCPCheck{Port: 8080}}}}}
	desire(t, env, unhealthy)
	perform(t, r, []*repv1.LRPInstance{lrpWork(unhealthy, 0)}, nil)
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		lines, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "unhealthy"})
		return err == nil && hasLine(lines, "HEALTH", "health check never passed within 300ms") &&
			hasLine(lines, "CELL", "crashed: health check never passed"), fmt.Sprintf("%q, %v", texts(lines), err)
	}, "the health check's line and the crash")

	// A rep that stops lets its followers go cleanly; a new rep on the same work dir serves
	// what the first one captured.
	r.stop()
	for {
		_, err := follow.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("follow at the rep's stop: %v, want a clean end", err)
		}
	}
	r2 := startRep(t, env, processRep(workDir))
	earlier, err := readLogs(ctx, r2, &repv1.StreamLogsRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if !hasLine(earlier, "APP/PROC/WEB", "line 50") || !hasLine(earlier, "CELL", "container stopped") {
		t.Fatalf("restarted rep serves %q, want the earlier lines and the stop", texts(earlier))
	}
}

// TestLogsSim: the sim backend's synthetic lines stream to a follower, and a task's log is
// read by its guid with its APP/TASK source.
func TestLogsSim(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) { c.Sim.LogInterval = rep.Duration(20 * time.Millisecond) })
	ctx := ctxT(t)
	d := desiredLRP("simweb", 2)
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0), lrpWork(d, 1)}, []*repv1.TaskWork{desireTask(t, env, "simtask")})
	stream, err := r.client.StreamLogs(ctx, &repv1.StreamLogsRequest{ProcessGuid: "simweb", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	for len(seen) < 2 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		for _, l := range resp.GetLines() {
			if l.GetSource() == "APP/PROC/WEB" && strings.HasPrefix(l.GetText(), "sim: ") {
				seen[l.GetIndex()] = true
			}
		}
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		lines, err := readLogs(ctx, r, &repv1.StreamLogsRequest{TaskGuid: "simtask"})
		return err == nil && hasLine(lines, "APP/TASK/simtask", "sim: ") && hasLine(lines, "CELL", "task completed"),
			fmt.Sprintf("%q, %v", texts(lines), err)
	}, "the task's synthetic line and completion")
}

// TestLogsBadInput: what the cell does not hold or keep is NotFound naming it; bad fields are
// InvalidArgument naming the field.
func TestLogsBadInput(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env)
	ctx := ctxT(t)
	d := desiredLRP("known", 1)
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	waitRunning(t, env, r, "known", 0)
	for _, c := range []struct {
		req  *repv1.StreamLogsRequest
		code codes.Code
		name string
	}{
		{&repv1.StreamLogsRequest{ProcessGuid: "nope"}, codes.NotFound, "process guid nope"},
		{&repv1.StreamLogsRequest{ProcessGuid: "known", Index: proto.Int32(3)}, codes.NotFound, "process guid known index 3"},
		{&repv1.StreamLogsRequest{TaskGuid: "nope"}, codes.NotFound, "task nope"},
		{&repv1.StreamLogsRequest{ProcessGuid: "known", Since: timestamppb.New(time.Now().Add(time.Hour))}, codes.InvalidArgument, "since"},
		{&repv1.StreamLogsRequest{ProcessGuid: "known", Tail: proto.Int32(-1)}, codes.InvalidArgument, "tail"},
		{&repv1.StreamLogsRequest{ProcessGuid: "known", Index: proto.Int32(-1)}, codes.InvalidArgument, "index"},
		{&repv1.StreamLogsRequest{ProcessGuid: "known", TaskGuid: "t"}, codes.InvalidArgument, "task_guid"},
		{&repv1.StreamLogsRequest{}, codes.InvalidArgument, "process_guid"},
	} {
		_, err := readLogs(ctx, r, c.req)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.name) {
			t.Errorf("StreamLogs(%v) = %v, want %s naming %q", c.req, err, c.code, c.name)
		}
	}
}

// TestLogsPolicy: the rep lets the BBS (which proxies it) stream logs, and no other service
// role; admin may make every call.
func TestLogsPolicy(t *testing.T) {
	const m = "/gavel.rep.v1.RepService/StreamLogs"
	if err := rep.Policy.Allow(authz.Role{Kind: authz.BBS}, m, nil); err != nil {
		t.Errorf("bbs refused: %v", err)
	}
	for _, k := range []string{authz.ReadOnly, authz.Auctioneer, authz.Rep, authz.Router} {
		if rep.Policy.Allow(authz.Role{Kind: k, Param: "cell-1"}, m, nil) == nil {
			t.Errorf("%s allowed StreamLogs", k)
		}
	}
}
