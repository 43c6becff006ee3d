package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// TestCellsRunRealWork runs the BBS, the auctioneer and three reps with the process backend
// as built binaries, and drives real work through them.
func TestCellsRunRealWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the process backend needs Linux")
	}
	c := startCluster(t)

	const app = "e2e-hello"
	props := map[string]string{"network.app_guid": "app-1234", "network.network_id": "net-5678"}
	var first []hello
	if !t.Run("HTTP app spreads over the cells", func(t *testing.T) {
		c.desire(t, helloLRP(app, "preloaded:cflinuxfs4", c.hello, 3, props))
		running := c.waitRunning(t, app, 3, 20*time.Second)
		cells := map[string]bool{}
		for i, a := range running {
			cells[a.GetInstanceKey().GetCellId()] = true
			if a.GetKey().GetIndex() != int32(i) {
				t.Fatalf("instances %v: want indexes 0..2", running)
			}
			if addr := a.GetNetInfo().GetAddress(); addr != "127.0.0.1" {
				t.Errorf("instance %d: address %q, want 127.0.0.1", i, addr)
			}
			h, err := get(a)
			if err != nil {
				t.Fatalf("instance %d: %v", i, err)
			}
			if h.index != int32(i) || h.guid != a.GetInstanceKey().GetInstanceGuid() {
				t.Errorf("instance %d (guid %s) answered as %+v", i, a.GetInstanceKey().GetInstanceGuid(), h)
			}
			first = append(first, h)
		}
		if len(cells) != 3 {
			t.Errorf("3 instances on %d cells (%v), want one per cell", len(cells), slices.Sorted(maps.Keys(cells)))
		}

		// The on-create hook got every instance's spec with the properties untouched.
		specs := hookSpecs(t, c.hookLog)
		indexes := map[int32]bool{}
		for _, s := range specs {
			if s.Kind == "lrp" && s.ProcessGuid == app && maps.Equal(s.Properties, props) {
				indexes[s.Index] = true
			}
		}
		if len(indexes) != 3 {
			t.Errorf("on-create hook saw the properties for instances %v, want 0, 1 and 2; log:\n%s", indexes, readFile(t, c.hookLog))
		}
	}) {
		return
	}

	t.Run("killed instance restarts", func(t *testing.T) {
		victim := first[1]
		if err := syscall.Kill(victim.pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill instance 1 (pid %d): %v", victim.pid, err)
		}
		var last string
		c.waitFor(t, 20*time.Second, "instance 1 to crash once and run again", func() (bool, string) {
			for _, a := range c.actualLRPs(t, app) {
				if a.GetKey().GetIndex() != 1 || a.GetPresence() != modelsv1.ActualLRP_PRESENCE_ORDINARY {
					continue
				}
				last = fmt.Sprintf("%s crash_count %d (%s)", a.GetState(), a.GetCrashCount(), a.GetCrashReason())
				if a.GetState() != modelsv1.ActualLRP_STATE_RUNNING || a.GetCrashCount() != 1 {
					return false, last
				}
				h, err := get(a)
				if err != nil {
					return false, last + ": " + err.Error()
				}
				if h.index != 1 || h.pid == victim.pid {
					return false, fmt.Sprintf("%s: answered as %+v", last, h)
				}
				return true, ""
			}
			return false, last
		})
		for _, a := range c.actualLRPs(t, app) {
			if a.GetKey().GetIndex() != 1 && a.GetCrashCount() != 0 {
				t.Errorf("instance %d crashed too: %v", a.GetKey().GetIndex(), a)
			}
		}
	})

	t.Run("task completes through its callback", func(t *testing.T) {
		callbacks := make(chan []byte, 10)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			select {
			case callbacks <- body:
			default:
			}
		}))
		defer srv.Close()
		const guid = "e2e-task"
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.bbs.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: guid, Domain: "e2e", Definition: &modelsv1.TaskDefinition{
			Rootfs:                "preloaded:cflinuxfs4",
			Action:                &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/sh", Args: []string{"-c", "echo -n 42 > result.txt"}}}},
			MemoryMb:              32,
			DiskMb:                32,
			ResultFile:            "result.txt",
			CompletionCallbackUrl: srv.URL + "/done",
		}})
		if err != nil {
			t.Fatalf("DesireTask: %v", err)
		}
		var body []byte
		select {
		case body = <-callbacks:
		case <-time.After(20 * time.Second):
			resp, err := c.bbs.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: guid})
			t.Fatalf("no completion callback within 20s; task: %v %v", resp.GetTask(), err)
		}
		task := &modelsv1.Task{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, task); err != nil {
			t.Fatalf("callback body %q: %v", body, err)
		}
		if task.GetTaskGuid() != guid || task.GetFailed() || task.GetResult() != "42" || task.GetState() != modelsv1.Task_STATE_COMPLETED {
			t.Fatalf("callback got %v, want task %s completed with result 42", task, guid)
		}
		c.waitFor(t, 10*time.Second, "the resolved task to be deleted", func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			resp, err := c.bbs.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: guid})
			if status.Code(err) == codes.NotFound {
				return true, ""
			}
			return false, fmt.Sprintf("%v %v", resp.GetTask().GetState(), err)
		})
	})

	t.Run("docker image runs chrooted", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("chroot needs root")
		}
		ref := pushHelloImage(t, c.hello)
		const guid = "e2e-docker"
		c.desire(t, helloLRP(guid, "docker://"+ref.Context().RegistryStr()+"/"+ref.Context().RepositoryStr()+"#"+ref.TagStr(), "/hello", 1, nil))
		a := c.waitRunning(t, guid, 1, 20*time.Second)[0]
		if cell := a.GetInstanceKey().GetCellId(); cell != dockerCell {
			t.Errorf("docker instance on %s, want %s (the only docker cell)", cell, dockerCell)
		}
		h, err := get(a)
		if err != nil {
			t.Fatal(err)
		}
		if h.index != 0 || h.guid != a.GetInstanceKey().GetInstanceGuid() {
			t.Errorf("docker instance answered as %+v", h)
		}
		root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", h.pid))
		if err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(c.dockerWD, "rootfs", "containers", h.guid)
		if root != want {
			t.Errorf("docker instance's root is %q, want its rootfs copy %q", root, want)
		}
	})
}

// hookSpec is the part of a hook's spec JSON the tests check.
type hookSpec struct {
	Kind        string            `json:"kind"`
	ProcessGuid string            `json:"process_guid"`
	Index       int32             `json:"index"`
	Properties  map[string]string `json:"properties"`
}

// hookSpecs parses the hook log; lines that do not parse (hooks of two containers may
// interleave) are skipped.
func hookSpecs(t *testing.T, path string) []hookSpec {
	t.Helper()
	var specs []hookSpec
	sc := bufio.NewScanner(bytes.NewReader([]byte(readFile(t, path))))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s hookSpec
		if json.Unmarshal(sc.Bytes(), &s) == nil {
			specs = append(specs, s)
		}
	}
	return specs
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// pushHelloImage pushes an image whose only layer holds the static sample app at /hello to an
// in-process registry on 127.0.0.1 and returns its reference.
func pushHelloImage(t *testing.T, helloBin string) name.Tag {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	bin, err := os.ReadFile(helloBin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(bin); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layerTar := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(strings.TrimPrefix(srv.URL, "http://")+"/hello:latest", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}
