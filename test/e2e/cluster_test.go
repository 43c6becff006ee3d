package e2e

// The cluster the end-to-end tests share: processes started from the built binaries, a BBS,
// an auctioneer and three process-backend reps, and helpers to run the sample app on it.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// proc is a process started by a test: its output is kept for failure messages and it is
// stopped when the test ends (SIGINT — a rep would evacuate on SIGTERM —, then SIGKILL after
// 10s).
type proc struct {
	name   string
	pid    int
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
	p.pid = cmd.Process.Pid
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s did not stop within 10s of SIGINT", name)
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
	bbsAddr  string // plaintext gRPC
	hello    string // the sample app's binary
	hookLog  string // where the on-create hook appends the specs it gets
	dockerWD string // work dir of the docker-capable rep
	dir      string // holds every rep's work dir, cell-<zone>
}

// waitFor polls cond until it holds, timeout passes or a process of the cluster exits.
func (c *cluster) waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testkit.EventuallyState(t, timeout, func() (bool, string) {
		ok, state := cond()
		if !ok {
			for _, p := range c.procs {
				select {
				case <-p.exited:
					t.Fatalf("%s exited (%v) while waiting for %s", p.name, p.err, what)
				default:
				}
			}
		}
		return ok, state
	}, what)
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
	return startClusterWith(t)
}

// startClusterWith is startCluster with extra flags for the BBS (e.g. -transformer).
func startClusterWith(t *testing.T, bbsArgs ...string) *cluster {
	t.Helper()
	c := &cluster{hello: binary(t, "hello")}
	bbsBin, auctioneerBin, repBin := binary(t, "bbs"), binary(t, "auctioneer"), binary(t, "rep")
	emb, _ := etcdtest.Start(t)
	etcd := strings.Join(emb.Endpoints(), ",")

	dir := t.TempDir()
	c.dir = dir
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

	bbsAddr, auctioneerAddr := testkit.ReservedAddr(t), testkit.ReservedAddr(t)
	c.bbsAddr = bbsAddr
	c.procs = append(c.procs,
		startProc(t, "bbs", bbsBin, append([]string{"-listen", bbsAddr, "-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-auctioneer-address", auctioneerAddr}, bbsArgs...)...),
		startProc(t, "auctioneer", auctioneerBin, "-listen", auctioneerAddr, "-insecure",
			"-bbs-address", bbsAddr, "-bbs-insecure", "-rep-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-batch-interval", "20ms"))
	for _, zone := range []string{"z1", "z2", "z3"} {
		id := "cell-" + zone
		workDir := filepath.Join(dir, id)
		first, last := testkit.PortBlock(t, 200) // private to this rep among every test running
		args := []string{
			"--cell-id", id, "--zone", zone, "--tags", "e2e,rack-" + zone,
			"--preloaded-rootfses", preloaded, "--backend", "process",
			"--memory-mb", "1024", "--disk-mb", "4096", "--containers", "20",
			"--listen", testkit.ReservedAddr(t), "--insecure", "--bbs-address", bbsAddr, "--bbs-insecure",
			"--etcd-endpoints", etcd, "--etcd-insecure",
			"--port-range", fmt.Sprintf("%d-%d", first, last), "--work-dir", workDir,
			"--on-create-hooks", hook,
		}
		if id == dockerCell {
			c.dockerWD = workDir
			args = append(args, "--supported-root-fs-providers", "docker", "--insecure-registries")
		}
		c.procs = append(c.procs, startProc(t, "rep "+id, repBin, args...))
	}

	conn := testkit.Dial(t, bbsAddr)
	t.Cleanup(func() { conn.Close() })
	c.bbs = bbsv1.NewBBSServiceClient(conn)
	aconn := testkit.Dial(t, auctioneerAddr)
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
