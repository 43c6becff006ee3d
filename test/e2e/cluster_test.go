package e2e

// The cluster the end-to-end tests share: processes started from the built binaries, a BBS,
// an auctioneer and three process-backend reps, and helpers to run the sample app on it.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// proc is a process started by a test (testkit.StartProc).
type proc = testkit.Proc

// startProc starts bin as name until the test ends (testkit.StartProc).
func startProc(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	return testkit.StartProc(t, name, bin, args...)
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
	bbsProc  *proc
	pki      map[string]tlsx.Config // with clusterOptions.tls
	// repMetrics is each rep's /metrics address by cell id (with clusterOptions.repMetrics).
	repMetrics map[string]string
}

// kill sends SIGKILL to the cluster's process named name, waits until it is gone and forgets
// it (so that waitFor does not take its exit for a failure).
func (c *cluster) kill(t *testing.T, name string) {
	t.Helper()
	i := slices.IndexFunc(c.procs, func(p *proc) bool { return p.Name == name })
	if i < 0 {
		t.Fatalf("no process %q", name)
	}
	c.procs[i].Kill(t)
	c.procs = slices.Delete(c.procs, i, i+1)
}

// waitFor polls cond until it holds, timeout passes or a process of the cluster exits.
func (c *cluster) waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testkit.EventuallyState(t, timeout, func() (bool, string) {
		ok, state := cond()
		if !ok {
			for _, p := range c.procs {
				select {
				case <-p.Exited:
					t.Fatalf("%s exited (%v) while waiting for %s", p.Name, p.Err, what)
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

func startCluster(t testing.TB) *cluster {
	t.Helper()
	return startClusterWith(t)
}

// startClusterWith is startCluster with extra flags for the BBS (e.g. -transformer).
func startClusterWith(t testing.TB, bbsArgs ...string) *cluster {
	t.Helper()
	return startClusterOpts(t, clusterOptions{bbsArgs: bbsArgs})
}

// clusterOptions vary the cluster of startClusterOpts.
type clusterOptions struct {
	bbsArgs []string // extra flags of the BBS
	repArgs []string // extra flags of every rep
	// tls runs every hop over mutual TLS, each component with its own identity of a
	// development PKI (cluster.pki: bbs, auctioneer, admin, read-only, rep/cell-z1..z3); the
	// test's BBS client is admin.
	tls bool
	// repMetrics serves every rep's /metrics on a loopback port (cluster.repMetrics).
	repMetrics bool
}

// tlsArgs are the flags of one TLS side (prefix tls, bbs or rep) presenting identity, or its
// insecure flag without TLS.
func (c *cluster) tlsArgs(prefix, insecure, identity string) []string {
	if c.pki == nil {
		return []string{insecure}
	}
	id := c.pki[identity]
	return []string{"-" + prefix + "-cert", id.CertFile, "-" + prefix + "-key", id.KeyFile, "-" + prefix + "-ca", id.CAFile}
}

func startClusterOpts(t testing.TB, opts clusterOptions) *cluster {
	t.Helper()
	c := &cluster{hello: binary(t, "hello")}
	bbsBin, auctioneerBin, repBin := binary(t, "bbs"), binary(t, "auctioneer"), binary(t, "rep")
	emb, _ := etcdtest.Start(t)
	etcd := strings.Join(emb.Endpoints(), ",")

	dir := t.TempDir()
	c.dir = dir
	zones := []string{"z1", "z2", "z3"}
	if opts.tls {
		names := []string{"bbs", "auctioneer", "admin", "read-only"}
		for _, zone := range zones {
			names = append(names, "rep/cell-"+zone)
		}
		var err error
		if c.pki, err = tlsx.GenerateDevPKI(filepath.Join(dir, "pki"), names...); err != nil {
			t.Fatal(err)
		}
	}
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
	bbsFlags := append([]string{"-listen", bbsAddr}, c.tlsArgs("tls", "-insecure", "bbs")...)
	bbsFlags = append(bbsFlags, "-etcd-endpoints", etcd, "-etcd-insecure", "-auctioneer-address", auctioneerAddr)
	auctioneerFlags := append([]string{"-listen", auctioneerAddr}, c.tlsArgs("tls", "-insecure", "auctioneer")...)
	auctioneerFlags = append(auctioneerFlags, "-bbs-address", bbsAddr)
	auctioneerFlags = append(auctioneerFlags, c.tlsArgs("bbs", "-bbs-insecure", "auctioneer")...)
	auctioneerFlags = append(auctioneerFlags, c.tlsArgs("rep", "-rep-insecure", "auctioneer")...)
	auctioneerFlags = append(auctioneerFlags, "-etcd-endpoints", etcd, "-etcd-insecure", "-batch-interval", "20ms")
	c.bbsProc = startProc(t, "bbs", bbsBin, append(bbsFlags, opts.bbsArgs...)...)
	c.procs = append(c.procs, c.bbsProc, startProc(t, "auctioneer", auctioneerBin, auctioneerFlags...))
	for _, zone := range zones {
		id := "cell-" + zone
		workDir := filepath.Join(dir, id)
		first, last := testkit.PortBlock(t, 200) // private to this rep among every test running
		args := []string{
			"--cell-id", id, "--zone", zone, "--tags", "e2e,rack-" + zone,
			"--preloaded-rootfses", preloaded, "--backend", "process",
			"--memory-mb", "1024", "--disk-mb", "4096", "--containers", "20",
			"--listen", testkit.ReservedAddr(t), "--bbs-address", bbsAddr,
			"--etcd-endpoints", etcd, "--etcd-insecure",
			"--port-range", fmt.Sprintf("%d-%d", first, last), "--work-dir", workDir,
			"--on-create-hooks", hook,
		}
		args = append(args, c.tlsArgs("tls", "-insecure", "rep/"+id)...)
		args = append(args, c.tlsArgs("bbs", "-bbs-insecure", "rep/"+id)...)
		if opts.repMetrics {
			if c.repMetrics == nil {
				c.repMetrics = map[string]string{}
			}
			c.repMetrics[id] = testkit.ReservedAddr(t)
			args = append(args, "--metrics-address", c.repMetrics[id])
		}
		if id == dockerCell {
			c.dockerWD = workDir
			args = append(args, "--supported-root-fs-providers", "docker", "--insecure-registries")
		}
		c.procs = append(c.procs, startProc(t, "rep "+id, repBin, append(args, opts.repArgs...)...))
	}

	c.bbs = bbsv1.NewBBSServiceClient(c.dial(t, bbsAddr, "admin"))
	auctioneerConn := c.dial(t, auctioneerAddr, "admin")

	// Work desired before the auctioneer leads would wait for convergence: wait for the
	// leader and for every cell.
	c.waitFor(t, 20*time.Second, "the auctioneer to lead", func() (bool, string) {
		return testkit.Serving(auctioneerConn, testkit.AuctioneerService)
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

// dial connects to addr as identity (plaintext when the cluster has no TLS); the connection is
// closed when the test ends.
func (c *cluster) dial(t testing.TB, addr, identity string) *grpc.ClientConn {
	t.Helper()
	if c.pki == nil {
		conn := testkit.Dial(t, addr)
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	conn, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: c.pki[identity]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (c *cluster) actualLRPs(t testing.TB, guid string) []*modelsv1.ActualLRP {
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
func (c *cluster) waitRunning(t testing.TB, guid string, n int, timeout time.Duration) []*modelsv1.ActualLRP {
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

func (c *cluster) desire(t testing.TB, d *modelsv1.DesiredLRP) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatalf("DesireLRP %s: %v", d.GetProcessGuid(), err)
	}
}

// execResult is what a command run through the BBS's Exec printed and how it ended.
type execResult struct {
	stdout, stderr string
	code           int32
}

// exec runs command in instance index of LRP guid through the BBS's Exec, with no input, and
// returns what it printed and its exit code.
func (c *cluster) exec(t *testing.T, guid string, index int32, command ...string) execResult {
	t.Helper()
	s := c.startExec(t, guid, index, command...)
	defer s.cancel()
	s.closeStdin(t)
	s.readUntil(t, func() bool { return false })
	return execResult{stdout: s.out.String(), stderr: s.errOut.String(), code: s.code}
}

// execSession is an Exec stream through the BBS, read as it goes.
type execSession struct {
	stream      bbsv1.BBSService_ExecClient
	cancel      context.CancelFunc // ends the stream (and kills the command if it runs)
	out, errOut bytes.Buffer
	code        int32
	ended       bool // the exit code came
}

// startExec opens an Exec stream to instance index of LRP guid running command; the caller
// closes it.
func (c *cluster) startExec(t *testing.T, guid string, index int32, command ...string) *execSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	stream, err := c.bbs.Exec(ctx)
	if err != nil {
		cancel()
		t.Fatalf("Exec: %v", err)
	}
	if err := stream.Send(&bbsv1.ExecRequest{Start: &repv1.ExecStart{ProcessGuid: guid, Index: index, Command: command}}); err != nil {
		cancel()
		t.Fatalf("Exec %v: %v", command, err)
	}
	return &execSession{stream: stream, cancel: cancel}
}

// closeStdin ends the command's input.
func (s *execSession) closeStdin(t *testing.T) {
	t.Helper()
	if err := s.stream.Send(&bbsv1.ExecRequest{CloseStdin: true}); err != nil {
		t.Fatalf("Exec: close stdin: %v", err)
	}
	if err := s.stream.CloseSend(); err != nil {
		t.Fatalf("Exec: %v", err)
	}
}

// readUntil reads the stream until cond holds (true) or the command ends (false).
func (s *execSession) readUntil(t *testing.T, cond func() bool) bool {
	t.Helper()
	for !s.ended {
		if cond() {
			return true
		}
		m, err := s.stream.Recv()
		if err != nil {
			t.Fatalf("Exec: %v (stdout %q, stderr %q)", err, s.out.String(), s.errOut.String())
		}
		s.out.Write(m.GetStdout())
		s.errOut.Write(m.GetStderr())
		if m.ExitCode != nil {
			s.code, s.ended = m.GetExitCode(), true
		}
	}
	return cond()
}
