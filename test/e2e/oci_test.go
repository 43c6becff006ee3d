package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/ocitest"
	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// ociNamespace is the cell's containerd namespace. The cell's CNI network (ociCell.bridge,
// ociCell.subnet) is a /24 of 10.253.0.0/16 free on this host, apart from `gavel dev`'s default
// one and from any other run of these tests on the machine.
const ociNamespace = "e2e"

// recordPlugin is a CNI plugin, chained after bridge and portmap, that records its stdin (the
// network config with runtimeConfig and prevResult) and CNI_ARGS in a directory, one file
// each per command and container, then hands over to the reference tuning plugin, which
// passes the previous result on unchanged.
const recordPlugin = `#!/bin/sh
dir=%q
printf '%%s' "$CNI_ARGS" > "$dir/$CNI_COMMAND-$CNI_CONTAINERID.args"
tee "$dir/$CNI_COMMAND-$CNI_CONTAINERID.stdin" | /usr/lib/cni/tuning
`

// ociCell is a cluster of built binaries with one oci cell: a BBS, an auctioneer, a rep with
// -backend oci on a private containerd and a CNI bridge network, a route-emitter and a router.
type ociCell struct {
	*cluster
	routing    *routing
	containerd *ocitest.Containerd
	rep        *proc
	repArgs    []string
	repBin     string
	repAddr    string
	workDir    string
	bridge     string // the cell's CNI bridge
	subnet     string // the bridge's /24
	cniRecord  string // where the recording CNI plugin writes what it got
	firstPort  int    // the rep's host port range
	lastPort   int
	cgroupV2   bool
}

// cgroup is the cgroup directory of container guid for controller (one directory on v2).
func (o *ociCell) cgroup(guid, controller string) string {
	if o.cgroupV2 {
		return filepath.Join("/sys/fs/cgroup/gavel", guid)
	}
	return filepath.Join("/sys/fs/cgroup", controller, "gavel", guid)
}

// skipWithoutOCI skips t, loudly (a failure under CI=true), without root, containerd, runc,
// the CNI plugins or iptables.
func skipWithoutOCI(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e over built binaries: skipped under -short")
	}
	if m := ocitest.Missing(); m != "" {
		testkit.SkipWithoutTool(t, fmt.Sprintf("%s (missing: %s)", ocitest.InstallHint, m))
	}
	for _, p := range ociPlugins {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", p)); err != nil {
			testkit.SkipWithoutTool(t, "SKIP oci end-to-end test: CNI plugin /usr/lib/cni/"+p+" is missing: apt-get install containernetworking-plugins")
		}
	}
	for _, tool := range []string{"iptables", "ctr"} {
		if _, err := exec.LookPath(tool); err != nil {
			testkit.SkipWithoutTool(t, "SKIP oci end-to-end test: "+tool+" is missing: apt-get install iptables containerd")
		}
	}
}

// ociPlugins are the reference CNI plugins the test's network uses.
var ociPlugins = []string{"bridge", "host-local", "portmap", "loopback", "tuning"}

func startOCICell(t *testing.T) *ociCell {
	t.Helper()
	skipWithoutOCI(t)
	d := ocitest.New(t)
	c := &cluster{hello: binary(t, "hello")}
	bbsBin, auctioneerBin, repBin := binary(t, "bbs"), binary(t, "auctioneer"), binary(t, "rep")
	emb, _ := etcdtest.Start(t)
	etcd := strings.Join(emb.Endpoints(), ",")
	dir := t.TempDir()
	c.dir = dir

	// The rootfs: the sample app and the probe (both static) in /bin, users, a shared /tmp.
	rootfs := filepath.Join(dir, "cflinuxfs4")
	for _, sub := range []string{"bin", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\nvcap:x:2000:2001:vcap:/home/vcap:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hello", "probe"} {
		b, err := os.ReadFile(binary(t, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rootfs, "bin", name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// The CNI network: bridge, portmap and the recording plugin, from a plugin directory of
	// links to the reference plugins and the recorder.
	cniDir, binDir := filepath.Join(dir, "cni"), filepath.Join(dir, "cni-bin")
	o := &ociCell{cluster: c, containerd: d, repBin: repBin, repAddr: testkit.ReservedAddr(t),
		workDir: filepath.Join(dir, "cell-oci"), cniRecord: filepath.Join(dir, "cni-record")}
	var third byte
	o.subnet, third = testkit.FreeSubnet(t, 253)
	o.bridge = fmt.Sprintf("gve2e%d", third)
	// Runs once every process of the cluster has stopped (cleanups run last first): a rep
	// stopped with SIGINT stops its containers, so any still recorded were left behind.
	t.Cleanup(func() {
		if left, _ := os.ReadDir(filepath.Join(o.workDir, "containers")); len(left) > 0 {
			var guids []string
			for _, e := range left {
				guids = append(guids, e.Name())
			}
			t.Errorf("containers left on this host after the cluster stopped (their mounts, /run/netns entries, iptables rules and shims need removing by hand): %v", guids)
		}
	})
	for _, sub := range []string{cniDir, binDir, o.cniRecord} {
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ociPlugins {
		if err := os.Symlink(filepath.Join("/usr/lib/cni", p), filepath.Join(binDir, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(binDir, "gavel-record"), fmt.Appendf(nil, recordPlugin, o.cniRecord), 0o755); err != nil {
		t.Fatal(err)
	}
	conflist := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "gavel", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
  {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
  {"type": "gavel-record", "capabilities": {"io.gavel.properties": true}}]}`, o.bridge, o.subnet, filepath.Join(dir, "ipam"))
	if err := os.WriteFile(filepath.Join(cniDir, "gavel.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", o.bridge).Run() })

	bbsAddr, auctioneerAddr := testkit.ReservedAddr(t), testkit.ReservedAddr(t)
	c.bbsAddr = bbsAddr
	c.procs = append(c.procs,
		startProc(t, "bbs", bbsBin, "-listen", bbsAddr, "-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-auctioneer-address", auctioneerAddr),
		startProc(t, "auctioneer", auctioneerBin, "-listen", auctioneerAddr, "-insecure",
			"-bbs-address", bbsAddr, "-bbs-insecure", "-rep-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-batch-interval", "20ms"))
	first, last := testkit.PortBlock(t, 50)
	o.firstPort, o.lastPort = first, last
	o.repArgs = []string{
		"--cell-id", "cell-oci", "--zone", "z1",
		"--preloaded-rootfses", fmt.Sprintf(`{"cflinuxfs4":%q}`, rootfs), "--backend", "oci",
		"--containerd-socket", d.Socket, "--containerd-namespace", ociNamespace,
		"--cni-conf-dir", cniDir, "--cni-bin-dir", binDir,
		"--memory-mb", "1024", "--disk-mb", "4096", "--containers", "20",
		"--listen", o.repAddr, "--insecure", "--bbs-address", bbsAddr, "--bbs-insecure",
		"--etcd-endpoints", etcd, "--etcd-insecure",
		"--port-range", fmt.Sprintf("%d-%d", first, last), "--work-dir", o.workDir,
	}
	o.rep = startProc(t, "rep cell-oci", repBin, o.repArgs...)
	c.procs = append(c.procs, o.rep)
	conn := testkit.Dial(t, bbsAddr)
	t.Cleanup(func() { conn.Close() })
	c.bbs = bbsv1.NewBBSServiceClient(conn)
	c.waitFor(t, 20*time.Second, "the oci cell", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := c.bbs.Cells(ctx, &bbsv1.CellsRequest{})
		return err == nil && len(resp.GetCells()) == 1, fmt.Sprint(resp.GetCells(), err)
	})
	o.routing = startRouting(t, c)
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	o.cgroupV2 = err == nil
	return o
}

// ociWeb is the LRP most of TestOCICell's subtests look at: the sample app, two instances on
// the oci cell, with every limit and property the issue names.
const ociWeb, ociWebHost = "oci-web", "oci.e2e.local"

// ociProps are ociWeb's properties: what a CNI plugin reads (app_guid, network_id), unicode,
// a 4 KiB value, quotes and backslashes, and one with ';' and '=' (which CNI_ARGS cannot carry).
var ociProps = map[string]string{
	"app_guid":           "4a6f1c2e-app",
	"network_id":         "net-1",
	"network.policy":     "ünïcødé ✓ 日本語",
	"network.big":        strings.Repeat("0123456789abcdef", 256),
	"example.com/quoted": `a "b" c\d`,
	"example.com/list":   "a=b;c=d",
}

// TestOCICell runs end-to-end checks on one oci cell of built binaries (a private containerd,
// runc, a CNI bridge with portmap and a recording plugin), each a subtest sharing the cluster:
// the sample app through the router, an OOM kill, a fork bomb, isolation between instances,
// limits and user, properties in the OCI annotations and the CNI plugins, a killed and
// restarted rep, and nothing left once every LRP is removed. Subtests desire what they need
// beyond ociWeb, so each can run alone (-run 'TestOCICell/OutOfMemory').
func TestOCICell(t *testing.T) {
	o := startOCICell(t)
	c := o.cluster
	d := helloLRP(ociWeb, "preloaded:cflinuxfs4", "/bin/hello", 2, ociProps)
	d.MaxPids, d.CpuWeight = 64, 50
	d.Action.GetRun().User, d.Action.GetRun().NofileLimit = "2000:2001", 2048
	d.Routes = map[string][]byte{"cf-router": []byte(`[{"port": 8080, "routes": ["` + ociWebHost + `"]}]`)}
	c.desire(t, d)
	running := c.waitRunning(t, ociWeb, 2, 60*time.Second)

	t.Run("ThroughTheRouter", func(t *testing.T) { testOCIThroughTheRouter(t, o, running) })
	t.Run("OutOfMemory", func(t *testing.T) { testOCIOutOfMemory(t, o) })
	t.Run("ForkBombStopsAtMaxPids", func(t *testing.T) { testOCIForkBomb(t, o) })
	t.Run("InstancesAreIsolated", func(t *testing.T) { testOCIIsolation(t, o, running) })
	t.Run("LimitsAndUser", func(t *testing.T) { testOCILimits(t, o, running) })
	t.Run("PropertiesReachAnnotationsAndCNI", func(t *testing.T) { testOCIProperties(t, o, running) })
	t.Run("DownloadAction", func(t *testing.T) { testOCIDownload(t, o) })
	t.Run("ActionTree", func(t *testing.T) { testOCIActionTree(t, o) })
	t.Run("RepKilledAndRestarted", func(st *testing.T) { testOCIRepKilled(st, t, o, running) })
	t.Run("RemovingEveryLRPLeavesNothing", func(t *testing.T) { testOCIRemoveLeavesNothing(t, o) })
}

// testOCIThroughTheRouter: both instances answer through the router, each pid 1 of its own
// pid namespace, from its own address on the CNI bridge, with its memory and pids limits in
// its cgroup.
func testOCIThroughTheRouter(t *testing.T, o *ociCell, running []*modelsv1.ActualLRP) {
	c := o.cluster
	seen := map[string]bool{}
	c.waitFor(t, 20*time.Second, "both instances through the router", func() (bool, string) {
		a, err := o.routing.get(ociWebHost, "/", false)
		if err != nil || a.app == nil {
			return false, fmt.Sprint(a, err)
		}
		if a.app.pid != 1 {
			t.Fatalf("instance %d is pid %d, want 1 (its own pid namespace)", a.app.index, a.app.pid)
		}
		seen[a.app.guid] = true
		return len(seen) == 2, fmt.Sprint(seen)
	})
	for _, a := range running {
		guid := a.GetInstanceKey().GetInstanceGuid()
		if !seen[guid] {
			t.Errorf("instance %s did not answer through the router (answered: %v)", guid, seen)
		}
		if addr := a.GetNetInfo().GetInstanceAddress(); !strings.HasPrefix(addr, strings.TrimSuffix(o.subnet, "0/24")) {
			t.Errorf("instance %s has address %q, want its own in %s", guid, addr, o.subnet)
		}
		if got := readFirst(t, filepath.Join(o.cgroup(guid, "pids"), "pids.max")); got != "64" {
			t.Errorf("pids.max of %s = %q, want 64", guid, got)
		}
		memFile := filepath.Join(o.cgroup(guid, "memory"), "memory.limit_in_bytes")
		if o.cgroupV2 {
			memFile = filepath.Join(o.cgroup(guid, "memory"), "memory.max")
		}
		if got := readFirst(t, memFile); got != strconv.Itoa(64<<20) {
			t.Errorf("memory limit of %s = %q, want %d", guid, got, 64<<20)
		}
	}
}

// testOCIOutOfMemory: an instance that allocates past memory_mb is killed by the kernel,
// reported crashed with the reason "out of memory" in the BBS, and restarted by the crash
// policy (crash_count 2 means it ran, and crashed, again).
func testOCIOutOfMemory(t *testing.T, o *ociCell) {
	c := o.cluster
	d := &modelsv1.DesiredLRP{
		ProcessGuid: "oci-hog", Domain: "e2e", Rootfs: "preloaded:cflinuxfs4", Instances: 1,
		MemoryMb: 32, DiskMb: 64,
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: []string{"hog"}}}},
	}
	c.desire(t, d)
	defer o.remove(t, d.GetProcessGuid())
	c.waitFor(t, 60*time.Second, "the memory hog crashed twice for want of memory", func() (bool, string) {
		as := c.actualLRPs(t, d.GetProcessGuid())
		if len(as) != 1 {
			return false, fmt.Sprint(as)
		}
		a := as[0]
		if a.GetCrashCount() > 0 && a.GetCrashReason() != "out of memory" {
			t.Fatalf("the memory hog crashed with reason %q, want %q", a.GetCrashReason(), "out of memory")
		}
		return a.GetCrashCount() >= 2, fmt.Sprintf("%s crash_count %d crash_reason %q", a.GetState(), a.GetCrashCount(), a.GetCrashReason())
	})
}

// testOCIForkBomb: a fork bomb run in an instance with max_pids 32 stops at the limit
// (EAGAIN), and the cell (its rep), the sample app's containers and a command in another
// container are unaffected.
func testOCIForkBomb(t *testing.T, o *ociCell) {
	c := o.cluster
	d := &modelsv1.DesiredLRP{
		ProcessGuid: "oci-bomb", Domain: "e2e", Rootfs: "preloaded:cflinuxfs4", Instances: 1,
		MemoryMb: 64, DiskMb: 64, MaxPids: 32,
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: []string{"sleep"}}}},
	}
	c.desire(t, d)
	defer o.remove(t, d.GetProcessGuid())
	c.waitRunning(t, d.GetProcessGuid(), 1, 60*time.Second)
	r := c.exec(t, d.GetProcessGuid(), 0, "/bin/probe", "forkbomb")
	t.Logf("fork bomb in an instance with max_pids 32: %q (exit %d, stderr %q)", r.stdout, r.code, r.stderr)
	var n int
	if _, err := fmt.Sscanf(r.stdout, "forked %d:", &n); err != nil || r.code != 0 {
		t.Fatalf("fork bomb: exit %d, stdout %q, stderr %q (%v)", r.code, r.stdout, r.stderr, err)
	}
	if n >= 32 || !strings.Contains(r.stdout, "resource temporarily unavailable") {
		t.Errorf("fork bomb: %q, want fewer than 32 forks ended by EAGAIN", r.stdout)
	}
	// Unaffected: the bomb's own instance, the sample app (both instances through the router),
	// a new process in another container, and the rep.
	if as := c.actualLRPs(t, d.GetProcessGuid()); len(as) != 1 || as[0].GetState() != modelsv1.ActualLRP_STATE_RUNNING || as[0].GetCrashCount() != 0 {
		t.Errorf("the fork bomb's instance after the bomb: %v", as)
	}
	seen := map[int32]bool{}
	for i := 0; i < 40 && len(seen) < 2; i++ {
		a, err := o.routing.get(ociWebHost, "/", false)
		if err != nil || a.app == nil {
			t.Fatalf("the sample app after the fork bomb: %v %v", a, err)
		}
		seen[a.app.index] = true
	}
	if len(seen) != 2 {
		t.Errorf("after the fork bomb the router reached instances %v, want both", seen)
	}
	if r := c.exec(t, ociWeb, 1, "/bin/probe", "id"); r.code != 0 {
		t.Errorf("a command in another container after the fork bomb: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if _, err := o.repState(t); err != nil {
		t.Errorf("the rep after the fork bomb: %v", err)
	}
}

// testOCIIsolation: an instance sees only its own processes (pid 1, its app, and the
// command) and not a file the other instance wrote; a port it listens on is in its own network
// namespace: reachable on its address, not on the host's.
func testOCIIsolation(t *testing.T, o *ociCell, running []*modelsv1.ActualLRP) {
	c := o.cluster
	for _, i := range []int32{0, 1} {
		r := c.exec(t, ociWeb, i, "/bin/probe", "ps")
		pids := strings.Fields(r.stdout)
		if r.code != 0 || len(pids) != 2 || pids[0] != "1" {
			t.Errorf("instance %d sees pids %q (exit %d, %q), want only 1 and the command itself", i, pids, r.code, r.stderr)
		}
	}
	secret := "/tmp/secret-of-instance-0"
	if r := c.exec(t, ociWeb, 0, "/bin/probe", "write", secret, "mine"); r.code != 0 {
		t.Fatalf("write %s in instance 0: exit %d, %q", secret, r.code, r.stderr)
	}
	if r := c.exec(t, ociWeb, 0, "/bin/probe", "cat", secret); r.code != 0 || r.stdout != "mine\n" {
		t.Errorf("instance 0 reads back %q (exit %d, %q), want %q", r.stdout, r.code, r.stderr, "mine")
	}
	if r := c.exec(t, ociWeb, 1, "/bin/probe", "cat", secret); r.code == 0 || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("instance 1 reads instance 0's %s: exit %d, %q %q; want no such file", secret, r.code, r.stdout, r.stderr)
	}

	// A port bound on 0.0.0.0 inside the container: reachable on the container's address,
	// refused on the host's.
	first, _ := testkit.PortBlock(t, 1)
	port := strconv.Itoa(first)
	s := c.startExec(t, ociWeb, 0, "/bin/probe", "listen", port)
	defer s.cancel()
	if !s.readUntil(t, func() bool { return strings.Contains(s.out.String(), "listening") }) {
		t.Fatalf("probe listen %s ended: exit %d, %q %q", port, s.code, s.out.String(), s.errOut.String())
	}
	addr := running[0].GetNetInfo().GetInstanceAddress()
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort(addr, port), 5*time.Second); err != nil {
		t.Errorf("the port the instance listens on is not reachable on its address %s: %v", addr, err)
	} else {
		conn.Close()
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 5*time.Second); err == nil {
		conn.Close()
		t.Errorf("the instance bound host port %s: 127.0.0.1:%s accepted a connection", port, port)
	}
	s.closeStdin(t)
	if s.readUntil(t, func() bool { return false }); s.code != 0 {
		t.Errorf("probe listen: exit %d, %q", s.code, s.errOut.String())
	}
}

// testOCILimits: cpu_weight is the container cgroup's CPU share, nofile_limit its
// RLIMIT_NOFILE and the run action's user its uid and gid (the latter two read by a command
// exec'd through the BBS, which runs as the instance's process does).
func testOCILimits(t *testing.T, o *ociCell, running []*modelsv1.ActualLRP) {
	c := o.cluster
	for _, a := range running {
		guid := a.GetInstanceKey().GetInstanceGuid()
		// cpu_weight 50: half of 1024 shares; on cgroup v2 runc converts shares to a weight.
		file, want := filepath.Join(o.cgroup(guid, "cpu"), "cpu.shares"), "512"
		if o.cgroupV2 {
			file, want = filepath.Join(o.cgroup(guid, "cpu"), "cpu.weight"), strconv.Itoa(1+(512-2)*9999/262142)
		}
		if got := readFirst(t, file); got != want {
			t.Errorf("%s = %q, want %s (cpu_weight 50)", file, got, want)
		}
	}
	for _, tc := range []struct{ cmd, want string }{{"nofile", "2048 2048"}, {"id", "2000 2001"}} {
		if r := c.exec(t, ociWeb, 0, "/bin/probe", tc.cmd); r.code != 0 || strings.TrimSpace(r.stdout) != tc.want {
			t.Errorf("probe %s in instance 0: %q (exit %d, %q), want %q", tc.cmd, r.stdout, r.code, r.stderr, tc.want)
		}
	}
}

// testOCIProperties: ociWeb's properties are its containers' OCI annotations, and the CNI
// plugin chained after bridge and portmap receives them byte for byte in its runtimeConfig
// (io.gavel.properties) and, where CNI_ARGS can carry them, in CNI_ARGS.
func testOCIProperties(t *testing.T, o *ociCell, running []*modelsv1.ActualLRP) {
	for _, a := range running {
		guid := a.GetInstanceKey().GetInstanceGuid()
		out, err := exec.Command("ctr", "--address", o.containerd.Socket, "-n", ociNamespace, "containers", "info", guid).Output()
		if err != nil {
			t.Fatalf("ctr containers info %s: %v", guid, err)
		}
		var info struct {
			Spec struct {
				Annotations map[string]string `json:"annotations"`
			}
		}
		if err := json.Unmarshal(out, &info); err != nil {
			t.Fatalf("ctr containers info %s: %v", guid, err)
		}
		if !maps.Equal(info.Spec.Annotations, ociProps) {
			t.Errorf("annotations of %s: %q, want %q", guid, info.Spec.Annotations, ociProps)
		}

		raw, err := os.ReadFile(filepath.Join(o.cniRecord, "ADD-"+guid+".stdin"))
		if err != nil {
			t.Fatalf("the recording CNI plugin did not see the ADD of %s: %v", guid, err)
		}
		var conf struct {
			RuntimeConfig map[string]map[string]string `json:"runtimeConfig"`
		}
		if err := json.Unmarshal(raw, &conf); err != nil {
			t.Fatalf("the CNI plugin's stdin: %v: %s", err, raw)
		}
		if got := conf.RuntimeConfig["io.gavel.properties"]; !maps.Equal(got, ociProps) {
			t.Errorf("runtimeConfig io.gavel.properties of %s: %q, want %q", guid, got, ociProps)
		}
		args, err := os.ReadFile(filepath.Join(o.cniRecord, "ADD-"+guid+".args"))
		if err != nil {
			t.Fatal(err)
		}
		want := "IgnoreUnknown=1"
		for _, k := range slices.Sorted(maps.Keys(ociProps)) {
			if !strings.ContainsAny(ociProps[k], ";=") {
				want += ";" + k + "=" + ociProps[k]
			}
		}
		if string(args) != want {
			t.Errorf("CNI_ARGS of %s:\n%q\nwant\n%q", guid, args, want)
		}
	}
}

// testOCIDownload: an LRP whose setup downloads a file (with its checksum) from a server of
// the test's has it in its root filesystem when its process runs, owned by its user.
func testOCIDownload(t *testing.T, o *ociCell) {
	c := o.cluster
	content := "downloaded ✓ " + strings.Repeat("x", 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, content)
	}))
	defer srv.Close()
	sum := sha256.Sum256([]byte(content))
	d := &modelsv1.DesiredLRP{
		ProcessGuid: "oci-download", Domain: "e2e", Rootfs: "preloaded:cflinuxfs4", Instances: 1,
		MemoryMb: 64, DiskMb: 64,
		Setup: &modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{
			From: srv.URL + "/greeting.txt", To: "/srv/", ChecksumAlgorithm: "sha256", ChecksumValue: hex.EncodeToString(sum[:])}}},
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: []string{"sleep"}}}},
	}
	c.desire(t, d)
	defer o.remove(t, d.GetProcessGuid())
	c.waitRunning(t, d.GetProcessGuid(), 1, 60*time.Second)
	if r := c.exec(t, d.GetProcessGuid(), 0, "/bin/probe", "cat", "/srv/greeting.txt"); r.code != 0 || r.stdout != content+"\n" {
		t.Errorf("the downloaded file in the instance: %q (exit %d, %q), want %q", r.stdout, r.code, r.stderr, content)
	}
}

// probeLRP is an LRP of one instance on the oci cell running the oci tests' probe with args,
// without checks (healthy once started).
func probeLRP(guid string, args ...string) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid, Domain: "e2e", Rootfs: "preloaded:cflinuxfs4", Instances: 1,
		MemoryMb: 64, DiskMb: 64, Ports: []uint32{8080},
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: args}}},
	}
}

// testOCIActionTree: an LRP whose action is a tree (a run action before the last, a
// codependent action) and whose health check is a legacy monitor action runs on the oci cell:
// the container's init is the init program, each run action a process exec'd in it.
func testOCIActionTree(t *testing.T, o *ociCell) {
	c := o.cluster
	run := func(args ...string) *modelsv1.Action {
		return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: args}}}
	}
	d := probeLRP("oci-tree")
	d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: []*modelsv1.Action{
		run("write", "/tmp/ready", "ready"),
		{Kind: &modelsv1.Action_Codependent{Codependent: &modelsv1.CodependentAction{Actions: []*modelsv1.Action{run("sleep"), run("sleep")}}}},
	}}}}
	d.Monitor = run("cat", "/tmp/ready")
	c.desire(t, d)
	defer o.remove(t, d.GetProcessGuid())
	c.waitRunning(t, d.GetProcessGuid(), 1, 60*time.Second)
	if r := c.exec(t, d.GetProcessGuid(), 0, "/bin/probe", "cat", "/proc/1/cmdline"); r.code != 0 || !strings.HasPrefix(r.stdout, "/dev/.gavel-init") {
		t.Errorf("pid 1 of the tree's container: %q (exit %d, %q), want the init program", r.stdout, r.code, r.stderr)
	}
	if r := c.exec(t, d.GetProcessGuid(), 0, "/bin/probe", "ps"); r.code != 0 || len(strings.Fields(r.stdout)) != 4 {
		t.Errorf("processes of the tree's container: %q (exit %d), want the init program, two sleeps and ps", r.stdout, r.code)
	}
}

// linkNodes is the number of nodes in the link file db.json of the consumer LRP guid's
// instance (-1 when it cannot be read).
func linkNodes(t *testing.T, c *cluster, guid, instanceGuid string) int {
	r := c.exec(t, guid, 0, "/bin/probe", "cat", "/.gavel/links/"+instanceGuid+"/db.json")
	var doc struct {
		Nodes []json.RawMessage `json:"nodes"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &doc) != nil {
		return -1
	}
	return len(doc.Nodes)
}

// testOCIRepKilled: the rep is killed with SIGKILL and started again under router traffic
// (a bounded request loop): no request fails, the instances are adopted (same instance guids,
// same host processes: nothing started twice) and RUNNING again in the BBS. The new rep
// belongs to the cluster's test, parent, so it outlives the subtest.
func testOCIRepKilled(t, parent *testing.T, o *ociCell, running []*modelsv1.ActualLRP) {
	c := o.cluster
	guids := map[string]bool{}
	hostPids := map[string]string{}
	for _, a := range running {
		guid := a.GetInstanceKey().GetInstanceGuid()
		guids[guid] = true
		hostPids[guid] = readFirst(t, filepath.Join(o.cgroup(guid, "pids"), "cgroup.procs"))
	}
	// A link provider and a consumer with a placement constraint: once adopted, the consumer
	// keeps its constraint in the cell's state and its link file follows the provider.
	const linksDB, linksWeb = "oci-links-db", "oci-links-web"
	provider := probeLRP(linksDB, "sleep")
	provider.Links = &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "db", Type: "db", Port: 8080}}}
	consumer := probeLRP(linksWeb, "sleep")
	consumer.Links = &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "db", Type: "db"}}}
	consumer.PlacementConstraint = &modelsv1.PlacementConstraint{Disallow: []string{"gpu"}}
	c.desire(t, provider)
	defer o.remove(t, linksDB) // after the consumer: a consumed provider cannot be removed
	c.waitRunning(t, linksDB, 1, 60*time.Second)
	c.desire(t, consumer)
	defer o.remove(t, linksWeb)
	webGuid := c.waitRunning(t, linksWeb, 1, 60*time.Second)[0].GetInstanceKey().GetInstanceGuid()
	c.waitFor(t, 20*time.Second, "the consumer's link file with one node", func() (bool, string) {
		n := linkNodes(t, c, linksWeb, webGuid)
		return n == 1, fmt.Sprint(n)
	})

	var mu sync.Mutex
	var sent, failed int
	var failures []string
	stop := make(chan struct{})
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		for i := 0; i < 5000; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			a, err := o.routing.get(ociWebHost, "/", false)
			mu.Lock()
			sent++
			if err != nil || a.app == nil {
				failed++
				failures = append(failures, fmt.Sprint(a.status, a.body, err))
			}
			mu.Unlock()
		}
	}()
	if err := syscall.Kill(o.rep.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-o.rep.Exited
	dead := o.rep
	c.procs = slices.DeleteFunc(c.procs, func(p *proc) bool { return p == dead })
	o.rep = startProc(parent, "rep cell-oci (restarted)", o.repBin, o.repArgs...)
	c.procs = append(c.procs, o.rep)
	c.waitFor(t, 30*time.Second, "the restarted rep to hold both instances", func() (bool, string) {
		st, err := o.repState(t)
		if err != nil {
			return false, err.Error()
		}
		held := 0
		lrps := st.GetLrps()
		for _, l := range lrps {
			if guids[l.GetInstanceGuid()] {
				held++
			}
		}
		return held == 2, fmt.Sprint(lrps)
	})
	// The adopted consumer's placement constraint is in the cell's state, as a started one's.
	c.waitFor(t, 30*time.Second, "the adopted consumer with its placement constraint", func() (bool, string) {
		st, err := o.repState(t)
		if err != nil {
			return false, err.Error()
		}
		for _, l := range st.GetLrps() {
			if l.GetInstanceGuid() == webGuid {
				return slices.Equal(l.GetPlacementConstraint().GetDisallow(), []string{"gpu"}), fmt.Sprint(l)
			}
		}
		return false, "not held"
	})
	// Its link consumer is registered again: a second provider instance reaches its file.
	c.scale(t, linksDB, 2)
	c.waitRunning(t, linksDB, 2, 60*time.Second)
	c.waitFor(t, 30*time.Second, "the adopted consumer's link file with two nodes", func() (bool, string) {
		n := linkNodes(t, c, linksWeb, webGuid)
		return n == 2, fmt.Sprint(n)
	})
	// Reported RUNNING again by the new rep (its bulk loop has not removed them either).
	after := c.waitRunning(t, ociWeb, 2, 30*time.Second)
	for _, a := range after {
		if !guids[a.GetInstanceKey().GetInstanceGuid()] {
			t.Errorf("instance %d has guid %s after the restart, want one of %v", a.GetKey().GetIndex(), a.GetInstanceKey().GetInstanceGuid(), guids)
		}
	}
	// 50 more requests with the new rep in place.
	mu.Lock()
	target := sent + 50
	mu.Unlock()
	for n := 0; n < target; {
		select {
		case <-trafficDone: // the loop's bound
			n = target
		case <-time.After(20 * time.Millisecond):
			mu.Lock()
			n = sent
			mu.Unlock()
		}
	}
	close(stop)
	<-trafficDone
	mu.Lock()
	t.Logf("%d requests through the router while the rep was killed and restarted, %d failed", sent, failed)
	if failed > 0 || sent == 0 {
		t.Errorf("%d of %d requests failed: %v", failed, sent, failures)
	}
	mu.Unlock()
	for guid, pid := range hostPids {
		if got := readFirst(t, filepath.Join(o.cgroup(guid, "pids"), "cgroup.procs")); got != pid {
			t.Errorf("instance %s runs host pid %s after the restart, want %s (started twice)", guid, got, pid)
		}
	}
}

// testOCIRemoveLeavesNothing removes every LRP and lists what is left of any container the
// cell ever networked (every ADD the recording CNI plugin saw): containerd containers and
// snapshots, mounts, cgroups, veths, iptables rules (those naming a container, and DNAT
// rules to the rep's host ports), pinned network namespaces, host-local addresses, libcni's
// cache, and a CNI ADD without its DEL.
func testOCIRemoveLeavesNothing(t *testing.T, o *ociCell) {
	c := o.cluster
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.bbs.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range resp.GetDesiredLrps() {
		o.remove(t, d.GetProcessGuid())
	}
	c.waitFor(t, 60*time.Second, "every instance and container gone", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
		entries, _ := os.ReadDir(filepath.Join(o.workDir, "containers"))
		return err == nil && len(resp.GetActualLrps()) == 0 && len(entries) == 0,
			fmt.Sprintf("%d actual LRPs (%v), container directories %v", len(resp.GetActualLrps()), err, entries)
	})
	if left := o.leftovers(t); len(left) > 0 {
		t.Errorf("left after removing every LRP:\n%s", strings.Join(left, "\n"))
	}
}

// remove removes LRP guid (at the end of a subtest that desired it) and waits until its
// instances are gone, so the next subtest starts on a cell stopping nothing.
func (o *ociCell) remove(t *testing.T, guid string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := o.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: guid}); err != nil {
		t.Errorf("RemoveDesiredLRP %s: %v", guid, err)
		return
	}
	o.waitFor(t, 60*time.Second, "the instances of "+guid+" gone", func() (bool, string) {
		as := o.actualLRPs(t, guid)
		return len(as) == 0, fmt.Sprint(as)
	})
}

// repState asks the rep for its state.
func (o *ociCell) repState(t *testing.T) (*repv1.StateResponse, error) {
	t.Helper()
	conn := testkit.Dial(t, o.repAddr)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return repv1.NewRepServiceClient(conn).State(ctx, &repv1.StateRequest{})
}

// leftovers lists what is left on the host of the containers the cell networked.
func (o *ociCell) leftovers(t *testing.T) []string {
	t.Helper()
	adds, err := filepath.Glob(filepath.Join(o.cniRecord, "ADD-*.stdin"))
	if err != nil || len(adds) == 0 {
		t.Fatalf("the recording CNI plugin saw no ADD (%v)", err)
	}
	var left []string
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	ipt, _ := exec.Command("iptables-save").CombinedOutput()
	for _, line := range strings.Split(string(ipt), "\n") { // portmap's DNAT rules name no container
		var port int
		if _, after, ok := strings.Cut(line, "--dport "); ok && strings.Contains(line, "DNAT") {
			if _, err := fmt.Sscan(after, &port); err == nil && port >= o.firstPort && port <= o.lastPort {
				left = append(left, "iptables rule: "+line)
			}
		}
	}
	if veths, _ := exec.Command("ip", "-o", "link", "show", "master", o.bridge).CombinedOutput(); strings.TrimSpace(string(veths)) != "" {
		left = append(left, "veths on "+o.bridge+": "+strings.TrimSpace(string(veths)))
	}
	for _, what := range []string{"containers", "snapshots", "tasks"} {
		out, err := exec.Command("ctr", "--address", o.containerd.Socket, "-n", ociNamespace, what, "ls").CombinedOutput()
		if err != nil {
			t.Errorf("ctr %s ls: %v: %s", what, err, out)
		} else if _, rows, _ := strings.Cut(strings.TrimSpace(string(out)), "\n"); rows != "" { // after the header
			left = append(left, "containerd "+what+": "+strings.ReplaceAll(rows, "\n", ", "))
		}
	}
	if ips, _ := filepath.Glob(filepath.Join(o.dir, "ipam", "gavel", "1*")); len(ips) > 0 {
		left = append(left, fmt.Sprintf("host-local addresses: %v", ips))
	}
	for _, add := range adds {
		guid := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(add), "ADD-"), ".stdin")
		if _, err := os.Stat(filepath.Join(o.cniRecord, "DEL-"+guid+".stdin")); err != nil {
			left = append(left, "CNI ADD without a DEL: "+guid)
		}
		for _, ctl := range []string{"memory", "pids", "cpu"} {
			if _, err := os.Stat(o.cgroup(guid, ctl)); err == nil {
				left = append(left, "cgroup "+o.cgroup(guid, ctl))
			}
		}
		for _, line := range strings.Split(string(mounts), "\n") {
			if strings.Contains(line, guid) {
				left = append(left, "mount: "+line)
			}
		}
		for _, line := range strings.Split(string(ipt), "\n") {
			if strings.Contains(line, guid) {
				left = append(left, "iptables rule: "+line)
			}
		}
		if _, err := os.Stat(filepath.Join("/run/netns", guid)); err == nil {
			left = append(left, "network namespace /run/netns/"+guid)
		}
		if cached, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", "*"+guid+"*")); len(cached) > 0 {
			left = append(left, fmt.Sprintf("libcni cache: %v", cached))
		}
	}
	return left
}

// readFirst is the first line of a file.
func readFirst(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("read %s: %v", path, err)
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}
