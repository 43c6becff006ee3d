package oci

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	const bridge, subnet = "gvocitest0", "10.253.77.0/24"
	confDir := cniConfDir(t, bridge, subnet)
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
		if err := dialEventually(target); err != nil {
			t.Errorf("the container's port does not answer on %s: %v", target, err)
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

// cniConfDir skips t without the CNI plugins or iptables, and otherwise writes the default
// network's configuration on bridge and subnet (IPAM data in a temporary directory) into a
// new directory, removing the bridge when t ends.
func cniConfDir(t *testing.T, bridge, subnet string) string {
	t.Helper()
	for _, need := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/portmap"} {
		if _, err := os.Stat(need); err != nil {
			testkit.SkipWithoutTool(t, need+" is missing: "+cni.InstallHint)
		}
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		testkit.SkipWithoutTool(t, "iptables is missing: apt-get install iptables")
	}
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
	return confDir
}

// dialEventually dials target until it answers (at most 10s).
func dialEventually(target string) error {
	var last error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := net.DialTimeout("tcp", target, time.Second)
		if last = err; err == nil {
			_ = conn.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return last
}

// TestAdoptNetworkedContainer: a networked container left by a rep is adopted with its address
// and host port (taken out of the new allocator, still answering); a network attachment left
// without a container (its pinned namespace, veth, address and port rules) is removed; the
// adopted container's stop leaves nothing and gives its host port back.
func TestAdoptNetworkedContainer(t *testing.T) {
	newTestBackend(t) // skips without containerd
	const bridge, subnet = "gvocitest1", "10.253.78.0/24"
	confDir := cniConfDir(t, bridge, subnet)
	cfg := adoptionConfig(t)
	newNetwork := func() (Network, *hostports.Allocator) {
		ports := hostports.New(62810, 62812, hostports.Free)
		n, err := NewCNINetwork(confDir, "", ports)
		if err != nil {
			t.Fatalf("NewCNINetwork: %v", err)
		}
		return n, ports
	}
	cfg.Network, _ = newNetwork()
	b1 := adoptionBackend(t, daemon.Socket, cfg)
	spec := probeLRP(t, "serve", "8080", "0.0.0.0")
	spec.Ports = []uint32{8080}
	c1, err := b1.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	want := c1.NetInfo()
	// A leftover attachment: a container directory, a pinned namespace attached to the
	// network, no containerd container.
	stray := guid(t)
	if err := os.MkdirAll(b1.containerDir(stray), 0o755); err != nil {
		t.Fatal(err)
	}
	strayNs, err := cni.NewNetns(cfg.NetnsDir, stray)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Network.Attach(context.Background(), stray, strayNs, []uint32{9090}, nil); err != nil {
		t.Fatalf("attach the stray namespace: %v", err)
	}
	_ = b1.Close() // the rep dies

	var ports *hostports.Allocator
	cfg.Network, ports = newNetwork()
	b2 := adoptionBackend(t, daemon.Socket, cfg)
	adopted, err := b2.Adopt(context.Background(), nil)
	if err != nil || len(adopted) != 1 {
		t.Fatalf("Adopt: %v, %v; want the container", adopted, err)
	}
	c2 := adopted[0].Container
	got := c2.NetInfo()
	if got.GetInstanceAddress() != want.GetInstanceAddress() || len(got.GetPorts()) != 1 || got.GetPorts()[0].GetHostPort() != want.GetPorts()[0].GetHostPort() {
		t.Errorf("adopted net info %v, want %v", got, want)
	}
	hostPort := want.GetPorts()[0].GetHostPort()
	if err := dialEventually(net.JoinHostPort("127.0.0.1", strconv.Itoa(int(hostPort)))); err != nil {
		t.Errorf("adopted container's host port: %v", err)
	}
	free, err := ports.Acquire(2) // the range has 3 ports; the adopted one is taken
	if err != nil || slices.Contains(free, int(hostPort)) {
		t.Errorf("new allocator handed out %v (%v); the adopted container holds %d", free, err, hostPort)
	}
	ports.Release(free)
	if _, err := os.Stat(strayNs); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stray namespace %s still there: %v", strayNs, err)
	}
	if out, _ := exec.Command("iptables-save").CombinedOutput(); strings.Contains(string(out), stray) {
		t.Errorf("iptables rules left for %s", stray)
	}
	assertGone(t, b2, stray)

	c2.Stop(time.Second)
	assertGone(t, b2, spec.Guid)
	if out, _ := exec.Command("ip", "-o", "link", "show", "master", bridge).CombinedOutput(); strings.TrimSpace(string(out)) != "" {
		t.Errorf("veths left on %s: %s", bridge, out)
	}
	if out, _ := exec.Command("iptables-save").CombinedOutput(); strings.Contains(string(out), spec.Guid) {
		t.Errorf("iptables rules left for %s", spec.Guid)
	}
	if entries, _ := os.ReadDir(cfg.NetnsDir); len(entries) != 0 {
		t.Errorf("pinned network namespaces left: %v", entries)
	}
	if all, err := ports.Acquire(3); err != nil {
		t.Errorf("host ports after the stop: %v (the adopted one was not given back)", err)
	} else {
		ports.Release(all)
	}
}
