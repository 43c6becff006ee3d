package cell

import (
	"context"
	"encoding/json"
	"runtime"
	"testing"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

func TestStaticResolver(t *testing.T) {
	r := NewStaticResolver(map[string]string{"cflinuxfs4": "/rootfs/cf4"}, []string{"docker"})
	for uri, want := range map[string]bool{
		"preloaded:cflinuxfs4":      true,
		"preloaded://cflinuxfs4":    true,
		"PRELOADED:cflinuxfs4":      true,
		"preloaded:///cflinuxfs4/":  true,
		"preloaded:lucid64":         false,
		"docker:///library/redis#7": true,
		"oci:///x":                  false,
		"nonsense":                  false,
	} {
		if got := r.Supports(uri); got != want {
			t.Errorf("Supports(%q) = %v, want %v", uri, got, want)
		}
	}
	rfs, err := r.Resolve(context.Background(), "preloaded:cflinuxfs4", "g", ImageAuth{})
	if err != nil || rfs.Path != "/rootfs/cf4" {
		t.Fatalf("Resolve = %+v, %v", rfs, err)
	}
	if _, err := r.Resolve(context.Background(), "preloaded:lucid64", "g", ImageAuth{}); err == nil {
		t.Fatal("Resolve of an unknown preloaded rootfs succeeded")
	}
}

func TestHookPayload(t *testing.T) {
	d := &modelsv1.DesiredLRP{
		ProcessGuid: "web", Domain: "apps", Rootfs: "preloaded:cflinuxfs4", Ports: []uint32{8080},
		Properties:      map[string]string{"network.app_guid": "a1"},
		Env:             []*modelsv1.EnvironmentVariable{{Name: "A", Value: "b"}},
		Action:          &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app", Args: []string{"-x"}}}},
		CheckDefinition: &modelsv1.CheckDefinition{LogSource: "HEALTH"},
		StartTimeoutMs:  1500,
	}
	spec := lrpSpec(d, &modelsv1.ActualLRPKey{ProcessGuid: "web", Index: 3, Domain: "apps"}, "inst-1")
	b, err := HookPayload(spec)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	action, _ := got["action"].(map[string]any)
	run, _ := action["run"].(map[string]any)
	checks, _ := got["checks"].(map[string]any)
	props, _ := got["properties"].(map[string]any)
	env, _ := got["env"].([]any)
	if got["kind"] != "lrp" || got["guid"] != "inst-1" || got["index"] != 3.0 || run["path"] != "/bin/app" ||
		checks["logSource"] != "HEALTH" || props["network.app_guid"] != "a1" || len(env) != 5 || got["start_timeout"] != "1.5s" {
		t.Fatalf("payload %s", b)
	}
	if _, ok := got["setup"]; ok {
		t.Fatalf("payload has an empty setup: %s", b)
	}
	task := taskSpec(&modelsv1.Task{TaskGuid: "t1", Domain: "jobs", Definition: &modelsv1.TaskDefinition{Rootfs: "preloaded:x", ResultFile: "/r"}})
	if task.Kind != executor.KindTask || task.Guid != "t1" || task.ResultFile != "/r" {
		t.Fatalf("task spec %+v", task)
	}
}

// TestSpecLimits: the limits a backend enforces reach the container spec, for LRPs and tasks
// (cpu_weight on the spec, user and nofile_limit on the run action it carries).
func TestSpecLimits(t *testing.T) {
	run := &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app", User: "vcap", NofileLimit: 4096}}}
	for _, tc := range []struct {
		name string
		spec executor.Spec
	}{
		{"lrp", lrpSpec(&modelsv1.DesiredLRP{ProcessGuid: "web", MemoryMb: 64, MaxPids: 20, CpuWeight: 30, Action: run},
			&modelsv1.ActualLRPKey{ProcessGuid: "web"}, "i")},
		{"task", taskSpec(&modelsv1.Task{TaskGuid: "t", Definition: &modelsv1.TaskDefinition{MemoryMb: 64, MaxPids: 20, CpuWeight: 30, Action: run}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.spec
			r := s.Action.GetRun()
			if s.MemoryMB != 64 || s.MaxPids != 20 || s.CPUWeight != 30 || r.GetUser() != "vcap" || r.GetNofileLimit() != 4096 {
				t.Fatalf("spec limits: memory %d, pids %d, cpu %d, user %q, nofile %d", s.MemoryMB, s.MaxPids, s.CPUWeight, r.GetUser(), r.GetNofileLimit())
			}
		})
	}
}

// TestUntilClosed: the context of a report ends when the container's done channel closes or
// its parent ends, and its watcher goroutine is gone once it is released.
func TestUntilClosed(t *testing.T) {
	before := runtime.NumGoroutine()
	done := make(chan struct{})
	ctx, end := untilClosed(context.Background(), done)
	if ctx.Err() != nil {
		t.Fatal("ended before done was closed")
	}
	close(done)
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not ended within 5s of done closing")
	}
	end()

	parent, cancel := context.WithCancel(context.Background())
	ctx, end = untilClosed(parent, make(chan struct{}))
	cancel()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not ended within 5s of its parent")
	}
	end()

	_, end = untilClosed(context.Background(), make(chan struct{}))
	end()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > before {
		t.Fatalf("%d goroutines after every context was released, %d before", g, before)
	}
}
