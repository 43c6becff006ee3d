package e2e

import (
	"context"
	"fmt"
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
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// ociBridge and ociSubnet are the test's CNI network, apart from `gavel dev`'s default one.
const ociBridge, ociSubnet = "gve2e0", "10.253.90.0/24"

// ociCell is a cluster of built binaries with one oci cell: a BBS, an auctioneer, a rep with
// -backend oci on a private containerd and a CNI bridge network, a route-emitter and a router.
type ociCell struct {
	*cluster
	routing *routing
	rep     *proc
	repArgs []string
	repBin  string
	repAddr string
	workDir string
	cgroup  func(guid, controller string) string // the cgroup directory of a container
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
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", p)); err != nil {
			testkit.SkipWithoutTool(t, "SKIP oci end-to-end test: CNI plugin /usr/lib/cni/"+p+" is missing: apt-get install containernetworking-plugins")
		}
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		testkit.SkipWithoutTool(t, "SKIP oci end-to-end test: iptables is missing: apt-get install iptables")
	}
}

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

	// The rootfs: the sample app (built static) in /bin.
	rootfs := filepath.Join(dir, "cflinuxfs4")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	app, err := os.ReadFile(c.hello)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "hello"), app, 0o755); err != nil {
		t.Fatal(err)
	}
	cniDir := filepath.Join(dir, "cni")
	if err := os.Mkdir(cniDir, 0o755); err != nil {
		t.Fatal(err)
	}
	conflist := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "gavel", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
  {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}]}`, ociBridge, ociSubnet, filepath.Join(dir, "ipam"))
	if err := os.WriteFile(filepath.Join(cniDir, "gavel.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", ociBridge).Run() })

	bbsAddr, auctioneerAddr := testkit.ReservedAddr(t), testkit.ReservedAddr(t)
	c.bbsAddr = bbsAddr
	c.procs = append(c.procs,
		startProc(t, "bbs", bbsBin, "-listen", bbsAddr, "-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-auctioneer-address", auctioneerAddr),
		startProc(t, "auctioneer", auctioneerBin, "-listen", auctioneerAddr, "-insecure",
			"-bbs-address", bbsAddr, "-bbs-insecure", "-rep-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-batch-interval", "20ms"))
	first, last := testkit.PortBlock(t, 50)
	o := &ociCell{cluster: c, repBin: repBin, repAddr: testkit.ReservedAddr(t), workDir: filepath.Join(dir, "cell-oci")}
	o.repArgs = []string{
		"--cell-id", "cell-oci", "--zone", "z1",
		"--preloaded-rootfses", fmt.Sprintf(`{"cflinuxfs4":%q}`, rootfs), "--backend", "oci",
		"--containerd-socket", d.Socket, "--containerd-namespace", "e2e", "--cni-conf-dir", cniDir,
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

	o.cgroup = func(guid, controller string) string {
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
			return filepath.Join("/sys/fs/cgroup/gavel", guid)
		}
		return filepath.Join("/sys/fs/cgroup", controller, "gavel", guid)
	}
	return o
}

// TestOCICellThroughTheRouter runs the sample app as two containers of an oci cell (built
// binaries, a private containerd, runc, a CNI bridge): both answer through the router, each
// is pid 1 of its own pid namespace, its memory and pids limits are in its cgroup and its
// instance address is its own. The rep is killed with SIGKILL and started again: the router
// keeps answering throughout (no failed request), the instances are adopted (same instance
// guids, same host processes: nothing started twice). Removing the LRP leaves nothing: no
// container directory or mount, cgroup, veth, iptables rule or pinned network namespace.
func TestOCICellThroughTheRouter(t *testing.T) {
	o := startOCICell(t)
	c := o.cluster
	d := helloLRP("oci-hello", "preloaded:cflinuxfs4", "/bin/hello", 2, map[string]string{"network.app_guid": "app-1"})
	d.MaxPids = 64
	d.Routes = map[string][]byte{"cf-router": []byte(`[{"port": 8080, "routes": ["oci.e2e.local"]}]`)}
	c.desire(t, d)
	running := c.waitRunning(t, "oci-hello", 2, 60*time.Second)

	// Through the router, both instances, each pid 1 in its own namespace.
	seen := map[string]bool{}
	c.waitFor(t, 20*time.Second, "both instances through the router", func() (bool, string) {
		a, err := o.routing.get("oci.e2e.local", "/", false)
		if err != nil || a.app == nil {
			return false, fmt.Sprint(a, err)
		}
		if a.app.pid != 1 {
			t.Fatalf("instance %d is pid %d, want 1 (its own pid namespace)", a.app.index, a.app.pid)
		}
		seen[a.app.guid] = true
		return len(seen) == 2, fmt.Sprint(seen)
	})
	guids := map[string]bool{}
	hostPids := map[string]string{}
	for _, a := range running {
		guid := a.GetInstanceKey().GetInstanceGuid()
		guids[guid] = true
		if !seen[guid] {
			t.Errorf("instance %s did not answer through the router (answered: %v)", guid, seen)
		}
		if addr := a.GetNetInfo().GetInstanceAddress(); !strings.HasPrefix(addr, "10.253.90.") {
			t.Errorf("instance %s has address %q, want its own in %s", guid, addr, ociSubnet)
		}
		if got := readFirst(t, filepath.Join(o.cgroup(guid, "pids"), "pids.max")); got != "64" {
			t.Errorf("pids.max of %s = %q, want 64", guid, got)
		}
		memFile := filepath.Join(o.cgroup(guid, "memory"), "memory.limit_in_bytes")
		if strings.HasPrefix(o.cgroup(guid, "memory"), "/sys/fs/cgroup/gavel") {
			memFile = filepath.Join(o.cgroup(guid, "memory"), "memory.max")
		}
		if got := readFirst(t, memFile); got != strconv.Itoa(64<<20) {
			t.Errorf("memory limit of %s = %q, want %d", guid, got, 64<<20)
		}
		hostPids[guid] = readFirst(t, filepath.Join(o.cgroup(guid, "pids"), "cgroup.procs"))
	}

	// Traffic through the router while the rep is killed and started again.
	var mu sync.Mutex
	var sent, failed int
	var failures []string
	stop := make(chan struct{})
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			a, err := o.routing.get("oci.e2e.local", "/", false)
			mu.Lock()
			sent++
			if err != nil || a.app == nil {
				failed++
				failures = append(failures, fmt.Sprint(a.status, a.body, err))
			}
			mu.Unlock()
		}
	}()
	if err := syscall.Kill(o.rep.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-o.rep.exited
	dead := o.rep
	c.procs = slices.DeleteFunc(c.procs, func(p *proc) bool { return p == dead })
	o.rep = startProc(t, "rep cell-oci (restarted)", o.repBin, o.repArgs...)
	c.procs = append(c.procs, o.rep)
	repConn := testkit.Dial(t, o.repAddr)
	t.Cleanup(func() { repConn.Close() })
	rep := repv1.NewRepServiceClient(repConn)
	c.waitFor(t, 30*time.Second, "the restarted rep to hold both instances", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := rep.State(ctx, &repv1.StateRequest{})
		if err != nil {
			return false, err.Error()
		}
		held := 0
		for _, l := range st.GetLrps() {
			if guids[l.GetInstanceGuid()] {
				held++
			}
		}
		return held == 2 && len(st.GetLrps()) == 2, fmt.Sprint(st.GetLrps())
	})
	// Reported RUNNING again by the new rep (its bulk loop has not removed them either).
	after := c.waitRunning(t, "oci-hello", 2, 30*time.Second)
	for _, a := range after {
		if !guids[a.GetInstanceKey().GetInstanceGuid()] {
			t.Errorf("instance %d has guid %s after the restart, want one of %v", a.GetKey().GetIndex(), a.GetInstanceKey().GetInstanceGuid(), guids)
		}
	}
	time.Sleep(time.Second) // more traffic with the new rep in place
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

	// Removing the LRP leaves nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "oci-hello"}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, 60*time.Second, "the instances and their containers gone", func() (bool, string) {
		entries, _ := os.ReadDir(filepath.Join(o.workDir, "containers"))
		return len(c.actualLRPs(t, "oci-hello")) == 0 && len(entries) == 0, fmt.Sprintf("%d records, containers %v", len(c.actualLRPs(t, "oci-hello")), entries)
	})
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	ipt, _ := exec.Command("iptables-save").CombinedOutput()
	veths, _ := exec.Command("ip", "-o", "link", "show", "master", ociBridge).CombinedOutput()
	if strings.TrimSpace(string(veths)) != "" {
		t.Errorf("veths left on %s: %s", ociBridge, veths)
	}
	for guid := range guids {
		for _, ctl := range []string{"memory", "pids"} {
			if _, err := os.Stat(o.cgroup(guid, ctl)); err == nil {
				t.Errorf("cgroup %s left", o.cgroup(guid, ctl))
			}
		}
		if strings.Contains(string(mounts), guid) {
			t.Errorf("a mount of %s left", guid)
		}
		if strings.Contains(string(ipt), guid) {
			t.Errorf("an iptables rule of %s left", guid)
		}
		if _, err := os.Stat(filepath.Join("/run/netns", guid)); err == nil {
			t.Errorf("network namespace of %s left", guid)
		}
	}
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
