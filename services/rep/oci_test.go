package rep_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/ocitest"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// TestOCIBackend: a rep with -backend oci runs LRPs and tasks as containers of a private
// containerd: an LRP runs and its stdout and stderr lines stream from StreamLogs, a memory hog
// crashes with "out of memory" in the BBS and in its CELL lines, a task completes with its
// result (the container's hostname: the task guid).
func TestOCIBackend(t *testing.T) {
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
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := rootfstest.BuildStatic(".", filepath.Join(root, "bin"), "./internal/executor/oci/testdata/probe"); err != nil {
		t.Fatal(err)
	}
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) {
		c.Backend = rep.BackendOCI
		c.OCI.ContainerdSocket = d.Socket
		c.PreloadedRootfses = map[string]string{"cflinuxfs4": root}
	})

	// The cell says what its containers are and what it enforces.
	st, err := r.client.State(ctxT(t), &repv1.StateRequest{Summary: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetIsolation() != "oci" || !slices.Contains(st.GetEnforced(), "memory") {
		t.Errorf("state: isolation %q, enforced %v; want oci enforcing memory", st.GetIsolation(), st.GetEnforced())
	}

	probe := func(args ...string) *modelsv1.Action {
		return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: args}}}
	}
	web := desiredLRP("web", 1)
	web.Action, web.MemoryMb = probe("say", "hello from oci", "oops from oci"), 64
	hog := desiredLRP("hog", 1)
	hog.Action, hog.MemoryMb = probe("hog"), 32
	desire(t, env, web)
	desire(t, env, hog)
	perform(t, r, []*repv1.LRPInstance{lrpWork(web, 0), lrpWork(hog, 0)}, nil)
	waitRunning(t, env, r, "web", 0)
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		a := actual(t, env, "hog", 0, ordinary)
		return a.GetCrashCount() >= 1 && a.GetCrashReason() == "out of memory", fmt.Sprint(a)
	}, "hog crashed out of memory")
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		web, err := readLogs(ctxT(t), r, &repv1.StreamLogsRequest{ProcessGuid: "web"})
		hog, err2 := readLogs(ctxT(t), r, &repv1.StreamLogsRequest{ProcessGuid: "hog", Index: proto.Int32(0)})
		return hasLine(web, "APP/PROC/WEB", "hello from oci") && hasLine(web, "APP/PROC/WEB", "oops from oci") &&
				hasLine(hog, "CELL", "crashed: out of memory"),
			fmt.Sprintf("web %q (%v), hog %q (%v)", texts(web), err, texts(hog), err2)
	}, "the oci containers' lines")

	def := taskDefinition()
	def.Action = probe("hostname")
	def.Env = []*modelsv1.EnvironmentVariable{{Name: "RESULT", Value: "/tmp/result"}}
	if _, err := env.Client.DesireTask(ctxT(t), &bbsv1.DesireTaskRequest{TaskGuid: "job-hostname", Domain: "jobs", Definition: def}); err != nil {
		t.Fatalf("DesireTask: %v", err)
	}
	tw := &repv1.TaskWork{TaskGuid: "job-hostname", Domain: "jobs", Resources: &modelsv1.Resources{MemoryMb: def.GetMemoryMb(), DiskMb: def.GetDiskMb()}, Rootfs: def.GetRootfs()}
	perform(t, r, nil, []*repv1.TaskWork{tw})
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		tk := task(t, env, "job-hostname")
		return tk.GetState() == modelsv1.Task_STATE_COMPLETED, fmt.Sprint(tk)
	}, "task COMPLETED")
	if tk := task(t, env, "job-hostname"); tk.GetFailed() || tk.GetResult() != "job-hostname" {
		t.Fatalf("task %v, want success with its guid as result", tk)
	}
}
