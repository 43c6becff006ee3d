package rep_test

import (
	"archive/tar"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/ocitest"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/oci"
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

// TestOCIImage: on a rep with -backend oci and the docker provider, an LRP of a docker://
// image (in a registry on 127.0.0.1) runs from containerd's content store, the image's
// binary printing its line, and an LRP whose image cannot be pulled crashes with the pull's
// failure in crash_reason.
func TestOCIImage(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: needs containerd")
	}
	d := ocitest.New(t)
	host := rootfstest.NewRegistry(t)
	uri, _ := rootfstest.Push(t, host, "gavel/probe", "v1", probeLayer(t))
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) {
		c.Backend = rep.BackendOCI
		c.OCI.ContainerdSocket = d.Socket
		c.SupportedRootfsProviders = []string{"docker"}
	})

	probe := &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: []string{"say", "hello from the image", ""}}}}
	web := desiredLRP("image-web", 1)
	web.Rootfs, web.Action, web.MemoryMb = uri, probe, 64
	gone := desiredLRP("image-gone", 1)
	gone.Rootfs, gone.Action, gone.MemoryMb = "docker://127.0.0.1:1/gavel/probe#v1", probe, 64
	desire(t, env, web)
	desire(t, env, gone)
	perform(t, r, []*repv1.LRPInstance{lrpWork(web, 0), lrpWork(gone, 0)}, nil)
	waitRunning(t, env, r, "image-web", 0)
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		a := actual(t, env, "image-gone", 0, ordinary)
		return a.GetCrashCount() >= 1 && strings.Contains(a.GetCrashReason(), "pull image 127.0.0.1:1/gavel/probe:v1: "), fmt.Sprint(a)
	}, "image-gone crashed with the pull's failure")
	t.Logf("crash_reason: %s", actual(t, env, "image-gone", 0, ordinary).GetCrashReason())
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		lines, err := readLogs(ctxT(t), r, &repv1.StreamLogsRequest{ProcessGuid: "image-web"})
		return hasLine(lines, "APP/PROC/WEB", "hello from the image"), fmt.Sprintf("%q (%v)", texts(lines), err)
	}, "the image's binary's line")

	// Pulled into containerd's store, the rootfs provider's cache unused.
	client, err := containerd.New(d.Socket, containerd.WithDefaultNamespace(oci.DefaultNamespace))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.GetImage(ctxT(t), host+"/gavel/probe:v1"); err != nil {
		t.Errorf("image not in containerd's store: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(r.cfg.WorkDir, "rootfs", "images")); len(entries) > 0 {
		t.Errorf("the docker rootfs provider unpacked the image too: %v", entries)
	}
}

// TestOCIPrivateImage: on an oci cell, an LRP of an image in a registry that requires basic
// authentication runs with the right image_username/image_password, and one with a wrong
// password crashes with a crash_reason naming the image and the registry's 401 (never the
// password).
func TestOCIPrivateImage(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: needs containerd")
	}
	d := ocitest.New(t)
	host := rootfstest.NewAuthRegistry(t, "deploy", "registry-s3cret")
	uri, _ := rootfstest.PushAuth(t, host, "gavel/private", "v1", "deploy", "registry-s3cret", probeLayer(t))
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) {
		c.Backend = rep.BackendOCI
		c.OCI.ContainerdSocket = d.Socket
		c.SupportedRootfsProviders = []string{"docker"}
	})
	probe := &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: []string{"sleep"}}}}
	good := desiredLRP("private-good", 1)
	good.Rootfs, good.Action, good.MemoryMb = uri, probe, 64
	good.ImageUsername, good.ImagePassword = "deploy", "registry-s3cret"
	bad := desiredLRP("private-bad", 1)
	bad.Rootfs, bad.Action, bad.MemoryMb = uri, probe, 64
	bad.ImageUsername, bad.ImagePassword = "deploy", "wrong-s3cret"
	desire(t, env, good)
	desire(t, env, bad)
	perform(t, r, []*repv1.LRPInstance{lrpWork(good, 0), lrpWork(bad, 0)}, nil)
	waitRunning(t, env, r, "private-good", 0)
	want := "pull image " + host + "/gavel/private:v1: "
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		a := actual(t, env, "private-bad", 0, ordinary)
		return a.GetCrashCount() >= 1 && strings.Contains(a.GetCrashReason(), want) && strings.Contains(a.GetCrashReason(), "401 Unauthorized"), fmt.Sprint(a)
	}, "private-bad crashed with the registry's refusal")
	reason := actual(t, env, "private-bad", 0, ordinary).GetCrashReason()
	t.Logf("crash_reason: %s", reason)
	if strings.Contains(reason, "s3cret") {
		t.Errorf("the crash reason shows a password: %s", reason)
	}
}

// probeLayer is an image layer holding the oci backend's test probe (built static) as
// /bin/probe, and /tmp.
func probeLayer(t *testing.T) v1.Layer {
	t.Helper()
	bin := t.TempDir()
	if err := rootfstest.BuildStatic(".", bin, "./internal/executor/oci/testdata/probe"); err != nil {
		t.Fatal(err)
	}
	probeBin, err := os.ReadFile(filepath.Join(bin, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	return rootfstest.Layer(t,
		rootfstest.File{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		rootfstest.File{Name: "bin/probe", Mode: 0o755, Body: probeBin},
		rootfstest.File{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	)
}
