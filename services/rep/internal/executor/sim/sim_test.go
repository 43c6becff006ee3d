package sim

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

func newBackend(t *testing.T, o executor.Options) *Backend {
	t.Helper()
	b, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s not within 5s", what)
	}
}

func TestLRPLifecycle(t *testing.T) {
	b := newBackend(t, executor.Options{CellAddress: "10.0.0.1", PortRangeStart: 61000, PortRangeEnd: 61001, SimStartLatency: 10 * time.Millisecond})
	c, err := b.Start(context.Background(), executor.Spec{Guid: "i1", Kind: executor.KindLRP, Ports: []uint32{8080, 9090}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	net := c.NetInfo()
	if net.GetAddress() != "10.0.0.1" || len(net.GetPorts()) != 2 || net.GetPorts()[0].GetHostPort() != 61000 || net.GetPorts()[1].GetHostPort() != 61001 {
		t.Fatalf("net info %v", net)
	}
	if _, err := b.Start(context.Background(), executor.Spec{Guid: "i2", Ports: []uint32{8080}}); err == nil {
		t.Fatal("Start with the port range used up succeeded")
	}
	wait(t, c.Healthy(), "healthy")
	if r := <-c.Routable(); !r {
		t.Fatal("not routable")
	}
	c.Stop(time.Second)
	c.Stop(time.Second) // idempotent
	if res := c.Result(); !res.Failed || res.Reason != ReasonStopped {
		t.Fatalf("result %+v", res)
	}
	if _, ok := <-c.Routable(); ok {
		t.Fatal("Routable not closed after Done")
	}
	// The ports are free again.
	c2, err := b.Start(context.Background(), executor.Spec{Guid: "i3", Ports: []uint32{8080, 9090}})
	if err != nil {
		t.Fatalf("Start after stop: %v", err)
	}
	c2.Stop(0)
}

func TestTaskAndCrashAndTimeout(t *testing.T) {
	b := newBackend(t, executor.Options{SimStartLatency: 10 * time.Millisecond, SimCrashRate: 1})
	task, _ := b.Start(context.Background(), executor.Spec{Guid: "t", Kind: executor.KindTask})
	wait(t, task.Done(), "task done")
	if res := task.Result(); res.Failed || res.Output != TaskOutput {
		t.Fatalf("task result %+v", res)
	}
	lrp, _ := b.Start(context.Background(), executor.Spec{Guid: "l", Kind: executor.KindLRP})
	wait(t, lrp.Healthy(), "healthy")
	wait(t, lrp.Done(), "crash")
	if res := lrp.Result(); !res.Failed || res.Reason != ReasonCrash {
		t.Fatalf("crash result %+v", res)
	}
	slow := newBackend(t, executor.Options{SimStartLatency: time.Hour})
	c, _ := slow.Start(context.Background(), executor.Spec{Guid: "s", Kind: executor.KindLRP, StartTimeout: 10 * time.Millisecond})
	wait(t, c.Done(), "start timeout")
	if res := c.Result(); res.Reason != ReasonStartTimeout {
		t.Fatalf("timeout result %+v", res)
	}
}

func TestRegistered(t *testing.T) {
	if _, err := executor.New(Name, executor.Options{}); err != nil {
		t.Fatalf("executor.New(%q): %v", Name, err)
	}
	if _, err := New(executor.Options{SimCrashRate: 2}); err == nil {
		t.Fatal("crash rate 2 accepted")
	}
}

// TestTenThousandContainers: the scale the backend exists for — 100 cells × 100 containers.
func TestTenThousandContainers(t *testing.T) {
	const n = 10_000
	b := newBackend(t, executor.Options{PortRangeStart: 1, PortRangeEnd: 65535, SimStartLatency: 50 * time.Millisecond})
	start := time.Now()
	cs := make([]executor.Container, 0, n)
	for i := range n {
		c, err := b.Start(context.Background(), executor.Spec{Guid: "c", Kind: executor.KindLRP, Ports: []uint32{8080}, Index: int32(i)})
		if err != nil {
			t.Fatalf("Start %d: %v", i, err)
		}
		cs = append(cs, c)
	}
	for _, c := range cs {
		wait(t, c.Healthy(), "healthy")
	}
	// A running container is timers, not a goroutine: the scale harness's sim hosts run tens of
	// thousands.
	if g := runtime.NumGoroutine(); g > n/100 {
		t.Errorf("%d goroutines with %d containers running, want no goroutine per container", g, n)
	}
	for _, c := range cs {
		c.Stop(0)
	}
	t.Logf("%d containers started, healthy and stopped in %s", n, time.Since(start))
}

// lines is a LogSink that keeps the lines it gets.
type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) Line(_, _, text string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, text)
}

func (l *lines) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.got)
}

// TestStopBeforeHealthyAndLogLines: a container stopped during its start latency ends stopped
// and never becomes healthy; a running one writes a line every log interval, numbered from 1,
// and none after it was stopped.
func TestStopBeforeHealthyAndLogLines(t *testing.T) {
	slow := newBackend(t, executor.Options{SimStartLatency: time.Hour})
	c, _ := slow.Start(context.Background(), executor.Spec{Guid: "early", Kind: executor.KindLRP})
	c.Stop(0)
	if res := c.Result(); !res.Failed || res.Reason != ReasonStopped {
		t.Fatalf("result of a container stopped while starting: %+v", res)
	}
	select {
	case <-c.Healthy():
		t.Fatal("a container stopped while starting became healthy")
	default:
	}

	log := &lines{}
	b := newBackend(t, executor.Options{SimStartLatency: time.Millisecond, SimLogInterval: 5 * time.Millisecond})
	c, _ = b.Start(context.Background(), executor.Spec{Guid: "talks", Kind: executor.KindLRP, Log: log})
	wait(t, c.Healthy(), "healthy")
	deadline := time.Now().Add(5 * time.Second)
	for log.count() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	c.Stop(0)
	n := log.count()
	if n < 3 {
		t.Fatalf("%d log lines within 5s at one every 5ms", n)
	}
	if want := "sim: talks index 0 line 1"; log.got[0] != want {
		t.Errorf("first line %q, want %q", log.got[0], want)
	}
	time.Sleep(30 * time.Millisecond)
	if after := log.count(); after != n {
		t.Errorf("%d lines written after Stop", after-n)
	}
}
