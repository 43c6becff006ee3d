package oci

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/hostports"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/oci/cni"
)

// TestCNINetworkedContainer runs an LRP on the backend with real CNI networking (Debian's
// bridge, host-local and portmap plugins): the container has its own address on the cell
// bridge, and its port answers on that address and on the host port the instance reports;
// once it stops, nothing of its network is left (no veth on the bridge, no iptables rule, no
// pinned namespace).
func TestCNINetworkedContainer(t *testing.T) {
	b := newTestBackend(t)
	for _, need := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/portmap"} {
		if _, err := os.Stat(need); err != nil {
			testkit.SkipWithoutTool(t, need+" is missing: "+cni.InstallHint)
		}
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		testkit.SkipWithoutTool(t, "iptables is missing: apt-get install iptables")
	}
	const bridge, subnet = "gvocitest0", "10.253.77.0/24"
	confDir := t.TempDir()
	ccfg := cni.Default()
	ccfg.ConfDir, ccfg.Bridge, ccfg.Subnet, ccfg.IPAMDataDir = confDir, bridge, subnet, filepath.Join(t.TempDir(), "ipam")
	list, err := cni.DefaultConfList(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "gavel.conflist"), list, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", bridge).Run() })
	network, err := NewCNINetwork(confDir, "", hostports.New(62700, 62799, hostports.Free))
	if err != nil {
		t.Fatalf("NewCNINetwork: %v", err)
	}
	b.cfg.Network, b.cfg.NetnsDir = network, t.TempDir()

	spec := probeLRP(t, "serve", "8080", "0.0.0.0")
	spec.Ports = []uint32{8080}
	c, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	ni := c.NetInfo()
	addr, err := netip.ParseAddr(ni.GetInstanceAddress())
	if err != nil || !netip.MustParsePrefix(subnet).Contains(addr) {
		t.Fatalf("instance address %q is not in %s", ni.GetInstanceAddress(), subnet)
	}
	if len(ni.GetPorts()) != 1 || ni.GetPorts()[0].GetContainerPort() != 8080 ||
		ni.GetPorts()[0].GetHostPort() < 62700 || ni.GetPorts()[0].GetHostPort() > 62799 {
		t.Fatalf("ports %v, want 8080 mapped to a host port in 62700-62799", ni.GetPorts())
	}
	hostPort := strconv.Itoa(int(ni.GetPorts()[0].GetHostPort()))
	for _, target := range []string{net.JoinHostPort(addr.String(), "8080"), net.JoinHostPort("127.0.0.1", hostPort)} {
		var last error
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			conn, err := net.DialTimeout("tcp", target, time.Second)
			if last = err; err == nil {
				_ = conn.Close()
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if last != nil {
			t.Errorf("the container's port does not answer on %s: %v", target, last)
		}
	}

	c.Stop(time.Second)
	<-c.Done()
	assertGone(t, b, spec.Guid)
	if out, _ := exec.Command("ip", "-o", "link", "show", "master", bridge).CombinedOutput(); strings.TrimSpace(string(out)) != "" {
		t.Errorf("veths left on %s: %s", bridge, out)
	}
	if out, _ := exec.Command("iptables-save").CombinedOutput(); strings.Contains(string(out), spec.Guid) {
		t.Errorf("iptables rules left for %s", spec.Guid)
	}
	if entries, _ := os.ReadDir(b.cfg.NetnsDir); len(entries) != 0 {
		t.Errorf("pinned network namespaces left: %v", entries)
	}
}
