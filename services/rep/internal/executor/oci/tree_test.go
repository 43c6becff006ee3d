package oci

import (
	"context"
	"strings"
	"testing"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// Action tree builders for the tree tests.
func probeRun(args ...string) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: args}}}
}

func serialOf(as ...*modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: as}}}
}

func parallelOf(as ...*modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Parallel{Parallel: &modelsv1.ParallelAction{Actions: as}}}
}

func codependentOf(as ...*modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Codependent{Codependent: &modelsv1.CodependentAction{Actions: as}}}
}

func tryOf(a *modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Try{Try: &modelsv1.TryAction{Action: a}}}
}

func timeoutOf(ms int64, a *modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Timeout{Timeout: &modelsv1.TimeoutAction{TimeoutMs: ms, Action: a}}}
}

// TestActionTree: an action that is not a run action (after downloads) runs with the init
// program as the container's init and every run action exec'd in the container, with the
// process backend's tree semantics (package actions): serial, try, parallel (the processes
// share the container's filesystem), timeout, codependent. A failing run action's reason reads
// as a simple container's: exit status and stderr tail, or out of memory. Nothing is left.
func TestActionTree(t *testing.T) {
	if len(pauseProgram) == 0 {
		t.Skip("no init program for this architecture")
	}
	b := newTestBackend(t)
	for _, tc := range []struct {
		name   string
		setup  *modelsv1.Action
		action *modelsv1.Action
		memory int32
		failed bool
		want   string // the result's output, or its reason when failed
	}{
		{
			name: "serial try and parallel",
			action: serialOf(
				tryOf(probeRun("exit", "3")),
				parallelOf(probeRun("write", "/tmp/a", "from a"), probeRun("write", "/tmp/b", "from b")),
				probeRun("cat", "/tmp/a"),
			),
			want: "from a",
		},
		{name: "setup runs first", setup: probeRun("write", "/tmp/s", "set up"), action: probeRun("cat", "/tmp/s"), want: "set up"},
		{name: "serial stops at a failure", action: serialOf(probeRun("exit", "3"), probeRun("hostname")), failed: true, want: "exit status 3"},
		{name: "stderr tail in the reason", action: serialOf(probeRun("hostname"), probeRun("no-such-command")), failed: true, want: "exit status 1: unknown command no-such-command"},
		{name: "timeout", action: timeoutOf(300, probeRun("sleep")), failed: true, want: "timed out after 300ms"},
		{name: "codependent stops the others", action: codependentOf(probeRun("sleep"), probeRun("exit", "4")), failed: true, want: "exit status 4"},
		{name: "out of memory", action: serialOf(probeRun("hostname"), probeRun("hog")), memory: 32, failed: true, want: ReasonOutOfMemory},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := probeTask(t)
			spec.Setup, spec.Action, spec.MemoryMB = tc.setup, tc.action, tc.memory
			if !IsTree(spec) && tc.setup == nil {
				t.Fatalf("not a tree")
			}
			start := time.Now()
			res := run(t, b, spec)
			got := res.Output
			if tc.failed {
				got = res.Reason
			}
			if res.Failed != tc.failed || got != tc.want {
				t.Errorf("Result = %+v, want failed %v with %q", res, tc.failed, tc.want)
			}
			t.Logf("%s: %v", tc.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestActionTreeLRP: a tree LRP's monitor action is its health check (a failing one never
// makes it healthy); Stop ends every process of the tree with reason "stopped" and leaves
// nothing; a run action as root in unprivileged work is refused at Start.
func TestActionTreeLRP(t *testing.T) {
	if len(pauseProgram) == 0 {
		t.Skip("no init program for this architecture")
	}
	b := newTestBackend(t)
	spec := probeLRP(t)
	spec.Env = []*modelsv1.EnvironmentVariable{{Name: "GOMAXPROCS", Value: "1"}} // no RESULT: probe prints
	spec.Action = serialOf(probeRun("write", "/tmp/x", "x"), parallelOf(probeRun("sleep"), probeRun("sleep")))
	spec.Monitor = probeRun("cat", "/tmp/x")
	c := startHealthy(t, b, spec)
	// The container's processes: the init program, the two sleeps (once both started) and the
	// exec'd ps.
	var pids []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var out strings.Builder
		code, err := c.(executor.Execer).Exec(context.Background(), executor.ExecSpec{Command: []string{"/bin/probe", "ps"}, Stdout: &out, Stderr: &out})
		if err != nil || code != 0 {
			t.Fatalf("exec ps: %d %v %s", code, err, out.String())
		}
		if pids = strings.Fields(out.String()); len(pids) == 4 {
			break
		}
	}
	if len(pids) != 4 || pids[0] != "1" {
		t.Errorf("pids %q; want 1 (the init program), the two sleeps and ps", pids)
	}
	t0 := time.Now()
	c.Stop(5 * time.Second)
	if res := c.Result(); !res.Failed || res.Reason != ReasonStopped {
		t.Errorf("Result = %+v, want %q", res, ReasonStopped)
	}
	if d := time.Since(t0); d > 4*time.Second {
		t.Errorf("stop took %v: the run actions did not get SIGTERM", d)
	}
	assertGone(t, b, spec.Guid)

	unhealthy := probeLRP(t, "sleep")
	unhealthy.Monitor = probeRun("exit", "1")
	unhealthy.StartTimeout = time.Second
	if res := run(t, b, unhealthy); !res.Failed || res.Reason != "health check never passed" {
		t.Errorf("failing monitor action: Result = %+v, want never healthy", res)
	}

	root := probeTask(t)
	root.Action = serialOf(probeRun("hostname"), &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", User: "root"}}})
	if _, err := b.Start(context.Background(), root); err == nil || !strings.Contains(err.Error(), "only privileged work may run as root") {
		t.Errorf("Start with a root run action: %v", err)
	}
	assertGone(t, b, root.Guid)
}

// TestActionTreeNotAdopted: a restarted rep does not take over a tree container (its tree ran
// in the rep that stopped): Adopt removes it with everything it left, and adopts a simple
// container beside it.
func TestActionTreeNotAdopted(t *testing.T) {
	if len(pauseProgram) == 0 {
		t.Skip("no init program for this architecture")
	}
	newTestBackend(t) // skips without containerd
	cfg := adoptionConfig(t)
	first := adoptionBackend(t, daemon.Socket, cfg)
	tree := probeLRP(t)
	tree.Action = serialOf(probeRun("hostname"), probeRun("sleep"))
	simple := probeLRP(t, "sleep")
	for _, spec := range []executor.Spec{tree, simple} {
		c, err := first.Start(context.Background(), spec)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		<-c.Healthy()
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := adoptionBackend(t, daemon.Socket, cfg)
	adopted, err := second.Adopt(context.Background(), nil)
	if err != nil || len(adopted) != 1 || adopted[0].Spec.Guid != simple.Guid {
		t.Fatalf("Adopt = %+v, %v; want only %s", adopted, err, simple.Guid)
	}
	assertGone(t, second, tree.Guid)
	adopted[0].Container.Stop(time.Second)
	assertGone(t, second, simple.Guid)
}
