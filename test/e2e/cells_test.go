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
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
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
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// proc is a process started by a test: its output is kept for failure messages and it is
// stopped when the test ends (SIGTERM, then SIGKILL after 10s).
type proc struct {
	name   string
	out    *syncBuffer
	exited chan struct{}
	err    error // once exited is closed
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &syncBuffer{}, exited: make(chan struct{})}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s did not stop within 10s of SIGTERM", name)
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out.String())
		}
	})
	return p
}

// cluster is a BBS, an auctioneer and three process-backend reps, all built binaries.
type cluster struct {
	procs    []*proc
	bbs      bbsv1.BBSServiceClient
	hello    string // the sample app's binary
	hookLog  string // where the on-create hook appends the specs it gets
	dockerWD string // work dir of the docker-capable rep
}

// waitFor polls cond every 50ms until it holds, timeout passes or a process of the cluster
// exits.
func (c *cluster) waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		for _, p := range c.procs {
			select {
			case <-p.exited:
				t.Fatalf("%s exited (%v) while waiting for %s", p.name, p.err, what)
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

const (
	dockerCell = "cell-z3"
	hookScript = `#!/bin/sh
# Appends the container spec on stdin to the log, one JSON document per line.
tmp=$(mktemp) || exit 1
cat > "$tmp"
echo >> "$tmp"
cat "$tmp" >> %q
rm -f "$tmp"
`
)

func startCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{hello: binary(t, "hello")}
	bbsBin, auctioneerBin, repBin := binary(t, "bbs"), binary(t, "auctioneer"), binary(t, "rep")
	emb, _ := etcdtest.Start(t)
	etcd := strings.Join(emb.Endpoints(), ",")

	dir := t.TempDir()
	c.hookLog = filepath.Join(dir, "on-create.jsonl")
	hook := filepath.Join(dir, "on-create.sh")
	if err := os.WriteFile(hook, fmt.Appendf(nil, hookScript, c.hookLog), 0o755); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(dir, "cflinuxfs4")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	preloaded := fmt.Sprintf(`{"cflinuxfs4":%q}`, rootfs)

	bbsAddr, auctioneerAddr := freeAddr(t), freeAddr(t)
	c.procs = append(c.procs,
		startProc(t, "bbs", bbsBin, "-listen", bbsAddr, "-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-auctioneer-address", auctioneerAddr),
		startProc(t, "auctioneer", auctioneerBin, "-listen", auctioneerAddr, "-insecure",
			"-bbs-address", bbsAddr, "-bbs-insecure", "-rep-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-batch-interval", "20ms"))
	for i, zone := range []string{"z1", "z2", "z3"} {
		id := "cell-" + zone
		workDir := filepath.Join(dir, id)
		base := 20000 + os.Getpid()%40*600 + 200*i // distinct per rep, and likely per test run
		args := []string{
			"--cell-id", id, "--zone", zone, "--tags", "e2e,rack-" + zone,
			"--preloaded-rootfses", preloaded, "--backend", "process",
			"--memory-mb", "1024", "--disk-mb", "4096", "--containers", "20",
			"--listen", freeAddr(t), "--insecure", "--bbs-address", bbsAddr, "--bbs-insecure",
			"--etcd-endpoints", etcd, "--etcd-insecure",
			"--port-range", fmt.Sprintf("%d-%d", base, base+199), "--work-dir", workDir,
			"--on-create-hooks", hook,
		}
		if id == dockerCell {
			c.dockerWD = workDir
			args = append(args, "--supported-root-fs-providers", "docker", "--insecure-registries")
		}
		c.procs = append(c.procs, startProc(t, "rep "+id, repBin, args...))
	}

	conn, err := grpcx.Dial(bbsAddr, grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c.bbs = bbsv1.NewBBSServiceClient(conn)
	aconn, err := grpcx.Dial(auctioneerAddr, grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { aconn.Close() })
	health := grpc_health_v1.NewHealthClient(aconn)

	// Work desired before the auctioneer leads would wait for convergence: wait for the
	// leader and for every cell.
	c.waitFor(t, 20*time.Second, "the auctioneer to lead", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := health.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "gavel.auctioneer.v1.AuctioneerService"})
		if err != nil {
			return false, err.Error()
		}
		return resp.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING, resp.GetStatus().String()
	})
	c.waitFor(t, 20*time.Second, "3 cells", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := c.bbs.Cells(ctx, &bbsv1.CellsRequest{})
		if err != nil {
			return false, err.Error()
		}
		return len(resp.GetCells()) == 3, fmt.Sprintf("%d cells", len(resp.GetCells()))
	})
	return c
}

func (c *cluster) actualLRPs(t *testing.T, guid string) []*modelsv1.ActualLRP {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}})
	if err != nil {
		t.Fatalf("ActualLRPs: %v", err)
	}
	return resp.GetActualLrps()
}

// waitRunning waits until guid has n ordinary RUNNING instances and returns them by index.
func (c *cluster) waitRunning(t *testing.T, guid string, n int, timeout time.Duration) []*modelsv1.ActualLRP {
	t.Helper()
	var running []*modelsv1.ActualLRP
	c.waitFor(t, timeout, fmt.Sprintf("%d running instances of %s", n, guid), func() (bool, string) {
		running = running[:0]
		var states []string
		for _, a := range c.actualLRPs(t, guid) {
			states = append(states, fmt.Sprintf("%d:%s/%s@%s %s", a.GetKey().GetIndex(), a.GetState(), a.GetPresence(),
				a.GetInstanceKey().GetCellId(), a.GetCrashReason()+a.GetPlacementError().GetMessage()))
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
				running = append(running, a)
			}
		}
		return len(running) == n, strings.Join(states, ", ")
	})
	slices.SortFunc(running, func(a, b *modelsv1.ActualLRP) int { return int(a.GetKey().GetIndex() - b.GetKey().GetIndex()) })
	return running
}

var helloRE = regexp.MustCompile(`^hello from instance (\d+) \(guid ([^,]+), pid (\d+)\)`)

// hello is what one instance of the sample app answered.
type hello struct {
	index int32
	guid  string
	pid   int
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// get asks an instance's host port for 8080 on 127.0.0.1 who it is.
func get(a *modelsv1.ActualLRP) (hello, error) {
	var hostPort uint32
	for _, pm := range a.GetNetInfo().GetPorts() {
		if pm.GetContainerPort() == 8080 {
			hostPort = pm.GetHostPort()
		}
	}
	if hostPort == 0 {
		return hello{}, fmt.Errorf("instance %d maps no host port to 8080: %v", a.GetKey().GetIndex(), a.GetNetInfo())
	}
	resp, err := httpClient.Get(fmt.Sprintf("http://127.0.0.1:%d/", hostPort))
	if err != nil {
		return hello{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return hello{}, err
	}
	m := helloRE.FindStringSubmatch(string(body))
	if resp.StatusCode != http.StatusOK || m == nil {
		return hello{}, fmt.Errorf("GET :%d answered %s: %q", hostPort, resp.Status, body)
	}
	index, _ := strconv.Atoi(m[1])
	pid, _ := strconv.Atoi(m[3])
	return hello{index: int32(index), guid: m[2], pid: pid}, nil
}

// helloLRP is the sample app on rootfs with the given instances, checked over HTTP.
func helloLRP(guid, rootfs, path string, instances int32, props map[string]string) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid,
		Domain:      "e2e",
		Rootfs:      rootfs,
		Instances:   instances,
		MemoryMb:    64,
		DiskMb:      64,
		Ports:       []uint32{8080},
		Properties:  props,
		Action:      &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path}}},
		CheckDefinition: &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{{
			Kind: &modelsv1.Check_Http{Http: &modelsv1.HTTPCheck{Port: 8080, Path: "/health", IntervalMs: 200}},
		}}},
	}
}

func (c *cluster) desire(t *testing.T, d *modelsv1.DesiredLRP) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatalf("DesireLRP %s: %v", d.GetProcessGuid(), err)
	}
}

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
