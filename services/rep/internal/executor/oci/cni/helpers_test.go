package cni

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gavel-sched/gavel/internal/testkit"
)

// The test binary doubles as two CNI plugins, linked into a temporary bin dir under these
// names: gavel-record writes what it was given (stdin, CNI_ARGS) into the "recordDir" of its
// configuration and passes prevResult on; gavel-fail refuses every ADD.
const (
	recordPlugin = "gavel-record"
	failPlugin   = "gavel-fail"
)

func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case recordPlugin:
		os.Exit(runPlugin(false))
	case failPlugin:
		os.Exit(runPlugin(true))
	}
	os.Exit(m.Run())
}

// runPlugin is a CNI plugin speaking spec 1.0.0.
func runPlugin(fail bool) int {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return pluginError("read stdin: " + err.Error())
	}
	cmd := os.Getenv("CNI_COMMAND")
	if cmd == "VERSION" {
		fmt.Print(`{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}`)
		return 0
	}
	var conf struct {
		RecordDir  string          `json:"recordDir"`
		PrevResult json.RawMessage `json:"prevResult"`
	}
	if err := json.Unmarshal(in, &conf); err != nil {
		return pluginError("parse config: " + err.Error())
	}
	if conf.RecordDir != "" {
		base := filepath.Join(conf.RecordDir, cmd)
		if err := os.WriteFile(base+".stdin", in, 0o644); err != nil {
			return pluginError(err.Error())
		}
		if err := os.WriteFile(base+".args", []byte(os.Getenv("CNI_ARGS")), 0o644); err != nil {
			return pluginError(err.Error())
		}
	}
	if cmd != "ADD" {
		return 0
	}
	if fail {
		return pluginError(failPlugin + " refuses on purpose")
	}
	if len(conf.PrevResult) == 0 {
		conf.PrevResult = json.RawMessage(`{"cniVersion":"1.0.0"}`)
	}
	os.Stdout.Write(conf.PrevResult)
	return 0
}

func pluginError(msg string) int {
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "code": 100, "msg": msg})
	os.Stdout.Write(b)
	return 1
}

// needNetworking skips, with one loud line, unless this is root with ip, iptables and the
// reference CNI plugins.
func needNetworking(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		missing = append(missing, "containernetworking-plugins")
	}
	for _, bin := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, map[string]string{"ip": "iproute2", "iptables": "iptables"}[bin])
		}
	}
	if len(missing) > 0 {
		testkit.SkipWithoutTool(t, "CNI tests need real plugins: apt-get install "+strings.Join(missing, " "))
	}
	if os.Geteuid() != 0 {
		t.Skipf("SKIP %s: CNI tests create network namespaces, bridges and iptables rules: run as root", t.Name())
	}
}

func randHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// testNetns is a network namespace the test created, removed at its end.
type testNetns struct{ name, path string }

func newNetns(t *testing.T) testNetns {
	t.Helper()
	name := "gavel-cni-" + randHex(t, 4)
	path, err := NewNetns(NetnsDir, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := RemoveNetns(path); err != nil {
			t.Error(err)
		}
	})
	return testNetns{name: name, path: path}
}

// testEnv is a Config on a bridge and subnet of the test's own, with a bin dir holding the
// test plugins before /usr/lib/cni and every state directory under t.TempDir().
type testEnv struct {
	cfg       Config
	bin       string // the test plugins
	recordDir string // where gavel-record writes
}

func newTestEnv(t *testing.T) testEnv {
	t.Helper()
	dir := t.TempDir()
	e := testEnv{bin: filepath.Join(dir, "bin"), recordDir: filepath.Join(dir, "record")}
	for _, d := range []string{e.bin, e.recordDir, filepath.Join(dir, "conf")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{recordPlugin, failPlugin} {
		if err := os.Symlink(self, filepath.Join(e.bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	e.cfg = Default()
	e.cfg.ConfDir = filepath.Join(dir, "conf")
	e.cfg.BinDirs = []string{e.bin, "/usr/lib/cni"}
	e.cfg.NetworkName = "gavel-test-" + randHex(t, 3)
	e.cfg.Bridge = "gvt" + randHex(t, 3)
	e.cfg.Subnet, _ = testkit.FreeSubnet(t, 254)
	e.cfg.IPAMDataDir = filepath.Join(dir, "ipam")
	e.cfg.CacheDir = filepath.Join(dir, "cache")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", e.cfg.Bridge).Run() })
	return e
}

// writeConfList writes the operator's configuration: the generated chain with extra plugins
// appended.
func (e testEnv) writeConfList(t *testing.T, extra ...map[string]any) {
	t.Helper()
	b, err := DefaultConfList(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	plugins := conf["plugins"].([]any)
	for _, p := range extra {
		plugins = append(plugins, p)
	}
	conf["plugins"] = plugins
	b, err = json.MarshalIndent(conf, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.cfg.ConfDir, "10-gavel.conflist"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// testPorts is a PortAllocator of ports free on this host, remembering what came back.
type testPorts struct {
	mu       sync.Mutex
	out      map[uint32]bool
	released []uint32
}

func (p *testPorts) Acquire(n int) ([]uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.out == nil {
		p.out = map[uint32]bool{}
	}
	var got []uint32
	for range n {
		l, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			return nil, err
		}
		port := uint32(l.Addr().(*net.TCPAddr).Port)
		_ = l.Close()
		p.out[port] = true
		got = append(got, port)
	}
	return got, nil
}

func (p *testPorts) Release(ports []uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, port := range ports {
		delete(p.out, port)
		p.released = append(p.released, port)
	}
}

func (p *testPorts) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out)
}

// serveInNetns listens on port in the namespace at path (the socket belongs to that
// namespace for good) and answers every connection with reply.
func serveInNetns(t *testing.T, path string, port uint32, reply string) {
	t.Helper()
	type res struct {
		l   net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// The thread enters the namespace; if it cannot come back it is never unlocked, so
		// the runtime ends it with this goroutine.
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			ch <- res{err: fmt.Errorf("setns %s: %w", path, err)}
			return
		}
		l, lerr := net.Listen("tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(int(port))))
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			ch <- res{l: l, err: fmt.Errorf("setns back: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- res{l: l, err: lerr}
	}()
	r := <-ch
	if r.err != nil {
		if r.l != nil {
			_ = r.l.Close()
		}
		t.Fatalf("listen on %d in %s: %v", port, path, r.err)
	}
	t.Cleanup(func() { _ = r.l.Close() })
	go func() {
		for {
			c, err := r.l.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, reply)
			_ = c.Close()
		}
	}()
}

// fetch dials addr from the host and returns what it answers. The deadline only keeps a
// broken network from hanging the test.
func fetch(addr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// iptablesMentioning returns the nat and filter rules whose text holds s.
func iptablesMentioning(t *testing.T, s string) []string {
	t.Helper()
	var got []string
	for _, table := range []string{"nat", "filter"} {
		for _, line := range strings.Split(run(t, "iptables", "-w", "-t", table, "-S"), "\n") {
			if strings.Contains(line, s) {
				got = append(got, table+": "+line)
			}
		}
	}
	return got
}

// ipamHolding returns the host-local allocation files that name containerID.
func ipamHolding(t *testing.T, cfg Config, containerID string) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(cfg.IPAMDataDir, cfg.NetworkName, "*"))
	var got []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && bytes.Contains(b, []byte(containerID)) {
			got = append(got, filepath.Base(f))
		}
	}
	return got
}

// linksOn returns the host interfaces enslaved to bridge.
func linksOn(t *testing.T, bridge string) []string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show", "master", bridge).CombinedOutput()
	if err != nil {
		return nil // no bridge: nothing on it
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			got = append(got, strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
		}
	}
	return got
}

// netnsAddrs returns the IPv4 addresses in the namespace, as "dev addr/len".
func netnsAddrs(t *testing.T, ns testNetns) []string {
	t.Helper()
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(run(t, "ip", "-n", ns.name, "-4", "-o", "addr", "show")), "\n") {
		if f := strings.Fields(line); len(f) > 3 {
			got = append(got, f[1]+" "+f[3])
		}
	}
	return got
}
