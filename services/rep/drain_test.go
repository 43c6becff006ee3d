package rep_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
)

// TestLogDrains: an instance's lines reach a syslog receiver over TCP and one over TLS as RFC
// 5424 messages with the LRP's structured data (process guid, index, instance guid, source),
// its log guid as APP-NAME, the cell as HOSTNAME and stderr at severity error; a receiver that
// drops the connection gets the later lines on a new one; a drain where nothing listens loses
// its lines, counted in gavel_rep_drain_lines_dropped_total, while the app and its log on the
// cell go on.
func TestLogDrains(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "drain")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(pki["drain"].CertFile, pki["drain"].KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	plain := testkit.NewSyslogReceiver(t, nil)
	secure := testkit.NewSyslogReceiver(t, &tls.Config{Certificates: []tls.Certificate{cert}})
	dead := testkit.ReservedAddr(t)

	env := bbstest.Start(t)
	r := startRep(t, env, processRep(t.TempDir()), func(c *rep.Config) {
		c.MetricsAddress = "127.0.0.1:0"
		c.Logs.DrainCAFile = pki["drain"].CAFile
	})
	ctx := ctxT(t)
	d := shLRP("drained", `i=0; while true; do i=$((i+1)); echo "line $i"; [ $((i % 10)) = 0 ] && echo "oops $i" >&2; sleep 0.02; done`)
	d.LogGuid = "drained-app"
	d.LogDrains = []string{"syslog://" + plain.Addr(), "syslog-tls://" + secure.Addr(), "syslog://" + dead}
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	ig := waitRunning(t, env, r, "drained", 0).GetInstanceKey().GetInstanceGuid()

	sd := fmt.Sprintf(`[gavel@47450 process_guid="drained" index="0" instance_guid="%s" source="APP/PROC/WEB"]`, ig)
	for name, recv := range map[string]*testkit.SyslogReceiver{"tcp": plain, "tls": secure} {
		var out, errLine []string
		testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
			out, errLine = recv.Find("line 3"), recv.Find("oops 10")
			return out != nil && errLine != nil, fmt.Sprintf("%d messages", recv.Count())
		}, name+" drain receives line 3 and oops 10")
		if out[1] != "14" || out[3] != r.cfg.CellID || out[4] != "drained-app" || out[5] != "[APP/PROC/WEB/0]" || out[7] != sd {
			t.Errorf("%s drain: %q; want <14>, host %s, app drained-app, procid [APP/PROC/WEB/0], SD %s", name, out[0], r.cfg.CellID, sd)
		}
		if _, err := time.Parse(time.RFC3339Nano, out[2]); err != nil {
			t.Errorf("%s drain: timestamp %q: %v", name, out[2], err)
		}
		if errLine[1] != "11" {
			t.Errorf("%s drain: stderr line %q, want priority 11 (user.err)", name, errLine[0])
		}
	}

	// A task's drain: its lines come with the task's structured data.
	def := taskDefinition()
	def.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/sh", Args: []string{"-c", "echo task says hi; sleep 1"}}}}
	def.LogGuid, def.LogDrains = "job-app", []string{"syslog://" + plain.Addr()}
	if _, err := env.Client.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: "job", Domain: "jobs", Definition: def}); err != nil {
		t.Fatal(err)
	}
	perform(t, r, nil, []*repv1.TaskWork{{TaskGuid: "job", Domain: "jobs", Rootfs: def.GetRootfs(),
		Resources: &modelsv1.Resources{MemoryMb: def.GetMemoryMb(), DiskMb: def.GetDiskMb()}}})
	var task []string
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		task = plain.Find("task says hi")
		return task != nil, fmt.Sprintf("%d messages", plain.Count())
	}, "the task's line at its drain")
	if want := `[gavel@47450 task_guid="job" instance_guid="job" source="APP/TASK/job"]`; task[4] != "job-app" || task[5] != "[APP/TASK/job]" || task[7] != want {
		t.Errorf("task drain message %q: want app job-app, procid [APP/TASK/job], SD %s", task[0], want)
	}

	// The receiver hangs up: the drain reconnects and later lines arrive.
	var last int
	testkit.Eventually(t, 10*time.Second, func() bool {
		last = plain.Count()
		return last > 0
	}, "messages")
	plain.DropConns()
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		conns, msgs := plain.Conns(), plain.Count()
		return conns > 0 && msgs > last+5, fmt.Sprintf("%d connections, %d messages", conns, msgs)
	}, "the drain reconnected and sends again")

	// The dead drain's lines are counted as dropped; the app and its log go on.
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		body := testkit.Scrape(t, r.svc.MetricsAddr())
		return metricAbove(body, "gavel_rep_drain_lines_dropped_total", 0) && metricAbove(body, "gavel_rep_drain_lines_total", 10), "no drops counted yet"
	}, "drops counted")
	// The app goes on printing, and the cell goes on keeping its lines.
	all, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "drained"})
	if err != nil {
		t.Fatal(err)
	}
	next := fmt.Sprintf("line %d", countPrefix(all, "line ")+10)
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		all, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "drained"})
		return err == nil && hasLine(all, "APP/PROC/WEB", next), fmt.Sprintf("%d lines, %v", len(all), err)
	}, "the app's log goes on to "+next)
}

// countPrefix counts the lines whose text starts with prefix.
func countPrefix(lines []*repv1.LogLine, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l.GetText(), prefix) {
			n++
		}
	}
	return n
}

// metricAbove reports whether the sample of series (without labels) in a /metrics body is above v.
func metricAbove(body, series string, v float64) bool {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return err == nil && f > v
		}
	}
	return false
}

// TestLogDrainsUpdated: UpdateDesiredLRP replaces a running LRP's drains — a URL that is not
// syslog is refused naming the field and changes nothing; then the running instance's lines go
// to the new receiver and no longer to the old one, and the stored LRP names the new drain.
func TestLogDrainsUpdated(t *testing.T) {
	first, second := testkit.NewSyslogReceiver(t, nil), testkit.NewSyslogReceiver(t, nil)
	env := bbstest.Start(t)
	r := startRep(t, env, processRep(t.TempDir()))
	ctx := ctxT(t)
	d := shLRP("drained", `i=0; while true; do i=$((i+1)); echo "line $i"; sleep 0.02; done`)
	d.LogDrains = []string{"syslog://" + first.Addr()}
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	waitRunning(t, env, r, "drained", 0)
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		return first.Count() > 5, fmt.Sprintf("%d messages", first.Count())
	}, "lines at the first drain")

	update := func(drains ...string) error {
		_, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "drained",
			Update: &modelsv1.DesiredLRPUpdate{LogDrains: &modelsv1.LogDrainsUpdate{LogDrains: drains}}})
		return err
	}
	if err := update("https://logs.example.com:443"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "update.log_drains.log_drains[0]") {
		t.Fatalf("update to an https drain: %v, want InvalidArgument naming update.log_drains.log_drains[0]", err)
	}
	stored := func() []string {
		resp, err := env.Client.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "drained"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetDesiredLrp().GetLogDrains()
	}
	if got := stored(); !slices.Equal(got, d.LogDrains) {
		t.Fatalf("after a refused update the LRP's drains are %v, want %v", got, d.LogDrains)
	}

	if err := update("syslog://" + second.Addr()); err != nil {
		t.Fatal(err)
	}
	if got := stored(); !slices.Equal(got, []string{"syslog://" + second.Addr()}) {
		t.Fatalf("after the update the LRP's drains are %v", got)
	}
	assertSwitched(t, first, second, "the running instance's lines at the new drain")
}

// eventGate is a BBS client whose event streams the test can break: cut ends the rep's live
// subscriptions and refuses new ones (Unavailable, as an unreachable BBS) until restore.
type eventGate struct {
	bbsv1.BBSServiceClient

	mu       sync.Mutex
	down     bool
	refused  int
	live     []context.CancelFunc
	accepted int
}

func (g *eventGate) SubscribeToEvents(ctx context.Context, in *bbsv1.SubscribeToEventsRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[bbsv1.SubscribeToEventsResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down {
		g.refused++
		return nil, status.Error(codes.Unavailable, "the test cut the event stream")
	}
	ctx, cancel := context.WithCancel(ctx)
	g.live = append(g.live, cancel)
	g.accepted++
	return g.BBSServiceClient.SubscribeToEvents(ctx, in, opts...)
}

func (g *eventGate) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = true
	for _, cancel := range g.live {
		cancel()
	}
	g.live = nil
}

func (g *eventGate) restore() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = false
}

func (g *eventGate) counts() (refused, accepted int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused, g.accepted
}

// TestLogDrainsUpdatedWhileTheEventStreamIsDown: a drain change made while the rep's BBS event
// stream is broken does not reach the running instance while it is broken (nothing at the new
// drain), and does once the stream is back: on subscribing again the rep reconciles its
// instances' drains with the LRPs the BBS lists, so the lines go to the new receiver and no
// longer to the old one, without the instance restarting.
func TestLogDrainsUpdatedWhileTheEventStreamIsDown(t *testing.T) {
	first, second := testkit.NewSyslogReceiver(t, nil), testkit.NewSyslogReceiver(t, nil)
	env := bbstest.Start(t)
	gate := &eventGate{BBSServiceClient: env.Client}
	r := startRepWith(t, env, gate, processRep(t.TempDir()))
	ctx := ctxT(t)
	d := shLRP("drained", `i=0; while true; do i=$((i+1)); echo "line $i"; sleep 0.02; done`)
	d.LogDrains = []string{"syslog://" + first.Addr()}
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	ig := waitRunning(t, env, r, "drained", 0).GetInstanceKey().GetInstanceGuid()
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		return first.Count() > 5, fmt.Sprintf("%d messages", first.Count())
	}, "lines at the first drain")
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		_, accepted := gate.counts()
		return accepted > 0, "no subscription yet"
	}, "the rep follows the BBS's events")

	gate.cut()
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		refused, _ := gate.counts()
		return refused > 0, "no refused subscription yet"
	}, "the rep's event stream is down (a subscription refused)")
	if _, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "drained",
		Update: &modelsv1.DesiredLRPUpdate{LogDrains: &modelsv1.LogDrainsUpdate{LogDrains: []string{"syslog://" + second.Addr()}}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the app prints 50 lines meanwhile
	if n := second.Count(); n != 0 {
		t.Fatalf("the new drain got %d messages while the rep's event stream was down: the test did not cut it", n)
	}

	gate.restore()
	assertSwitched(t, first, second, "the running instance's lines at the new drain once the event stream is back")
	if now := actual(t, env, "drained", 0, modelsv1.ActualLRP_PRESENCE_ORDINARY).GetInstanceKey().GetInstanceGuid(); now != ig {
		t.Fatalf("instance %s replaced by %s: the drains should switch without a restart", ig, now)
	}
}

// assertSwitched waits until the new drain has its first lines (what names that wait), then
// checks it gets 50 more while the old drain gets none: the old one got its last queued lines
// when it was closed, before the new one's first.
func assertSwitched(t *testing.T, oldDrain, newDrain *testkit.SyslogReceiver, what string) {
	t.Helper()
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		return newDrain.Count() > 50, fmt.Sprintf("%d messages", newDrain.Count())
	}, what)
	before, at := oldDrain.Count(), newDrain.Count()
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		return newDrain.Count() > at+50, fmt.Sprintf("%d messages", newDrain.Count())
	}, "more lines at the new drain")
	if got := oldDrain.Count(); got != before {
		t.Fatalf("the old drain got %d more messages after the switch", got-before)
	}
}
