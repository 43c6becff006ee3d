package rep_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gavel-sched/gavel/internal/ocitest"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// BenchmarkDesireToRunning measures, for the process and oci backends on the same machine in
// one run, how long an LRP instance takes from its desire (DesireLRP, then Perform on the cell,
// standing in for the auction) until the BBS has it RUNNING, with a preloaded rootfs and no
// checks, one instance at a time; each is stopped before the next. It reports p50 and p99.
// oci-cni is oci networked as a cell runs it: a CNI bridge, host-local and portmap, with one
// host port per instance. The goal for oci: p50 under 300 ms, p99 under 1 s.
func BenchmarkDesireToRunning(b *testing.B) {
	root := probeRootfs(b)
	env := bbstest.Start(b)
	for _, variant := range []string{rep.BackendProcess, rep.BackendOCI, rep.BackendOCI + "-cni"} {
		b.Run(variant, func(b *testing.B) {
			path := filepath.Join(root, "bin", "probe") // the process backend runs it from the host
			configure := func(c *rep.Config) {
				c.Backend = rep.BackendProcess
				c.PreloadedRootfses = map[string]string{"cflinuxfs4": root}
				c.Capacity.Containers = 100
			}
			withCNI := variant == rep.BackendOCI+"-cni"
			if variant != rep.BackendProcess {
				path = "/bin/probe"
				configure = ociCell(b, root, withCNI, 100)
			}
			r := startRep(b, env, configure)
			var took []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d := desiredLRP(fmt.Sprintf("bench-%s-%d", variant, i), 1)
				d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path, Args: []string{"sleep"}}}}
				d.Ports, d.MemoryMb = nil, 64
				if withCNI {
					d.Ports = []uint32{8080}
				}
				t0 := time.Now()
				desire(b, env, d)
				perform(b, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
				a := waitRunningFast(b, env, d.GetProcessGuid())
				took = append(took, time.Since(t0))
				b.StopTimer()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				if _, err := r.client.StopLRPInstance(ctx, &repv1.StopLRPInstanceRequest{Key: a.GetKey(), InstanceKey: a.GetInstanceKey()}); err != nil {
					b.Fatalf("StopLRPInstance: %v", err)
				}
				if _, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: d.GetProcessGuid()}); err != nil {
					b.Fatalf("RemoveDesiredLRP: %v", err)
				}
				cancel()
				b.StartTimer()
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// Each oci benchmark cell with CNI has its own bridge and subnet, apart from `gavel dev`'s
// and the tests'.
const benchBridge, benchSubnet = "gvbench0", "10.253.91.0/24"

// ociCell configures an oci rep on a private containerd, rootfs preloaded as cflinuxfs4,
// room for containers, and with CNI a bridge + host-local + portmap network on benchBridge
// with host ports from a block of its own. It skips b, with one line, where containerd, runc
// or the CNI plugins are missing.
func ociCell(b *testing.B, root string, withCNI bool, containers int) func(*rep.Config) {
	if m := ocitest.Missing(); m != "" {
		b.Skipf("%s (missing: %s)", ocitest.InstallHint, m)
	}
	var confDir string
	if withCNI {
		for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
			if _, err := os.Stat(filepath.Join("/usr/lib/cni", p)); err != nil {
				b.Skipf("SKIP oci benchmark with CNI: /usr/lib/cni/%s is missing: apt-get install containernetworking-plugins", p)
			}
		}
		dir := b.TempDir()
		confDir = filepath.Join(dir, "conf")
		if err := os.Mkdir(confDir, 0o755); err != nil {
			b.Fatal(err)
		}
		conflist := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "gavel", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}},
  {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}]}`, benchBridge, benchSubnet, filepath.Join(dir, "ipam"))
		if err := os.WriteFile(filepath.Join(confDir, "gavel.conflist"), []byte(conflist), 0o644); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = exec.Command("ip", "link", "del", benchBridge).Run() })
	}
	first, last := testkit.PortBlock(b, containers)
	d := ocitest.New(b)
	return func(c *rep.Config) {
		c.Backend = rep.BackendOCI
		c.OCI.ContainerdSocket = d.Socket
		c.OCI.CNIConfDir = confDir
		c.PortRange = fmt.Sprintf("%d-%d", first, last)
		c.PreloadedRootfses = map[string]string{"cflinuxfs4": root}
		c.Capacity = rep.Capacity{MemoryMB: int32(containers) * 64, DiskMB: int32(containers) * 64, Containers: int32(containers)}
	}
}

// BenchmarkHundredOCIInstances starts 100 instances of one LRP on one oci cell (preloaded
// rootfs, no checks; without and with CNI, then each instance has its address on the cell
// bridge and a host port) with a single Perform, as an auction's batch would place them, and
// reports the start rate (instances RUNNING in the BBS per second, from the Perform) and
// memory with the 100 running: the growth of this process's resident set (the rep, and the
// BBS and etcd it shares the process with, whose share for 100 records is small), the Go heap
// growth per instance, and the containerd shims' resident sets (one shim per container,
// outside the rep) per container. Then it stops them all and reports the stop rate.
func BenchmarkHundredOCIInstances(b *testing.B) {
	const n = 100
	root := probeRootfs(b)
	env := bbstest.Start(b)
	for _, variant := range []string{"no-cni", "cni"} {
		b.Run(variant, func(b *testing.B) {
			configure := ociCell(b, root, variant == "cni", n)
			var socket string
			r := startRep(b, env, configure, func(c *rep.Config) { socket = c.OCI.ContainerdSocket })
			for i := 0; i < b.N; i++ {
				hundredInstances(b, env, r, socket, fmt.Sprintf("hundred-%s-%d", variant, i), n, variant == "cni")
			}
		})
	}
}

// hundredInstances is one round of BenchmarkHundredOCIInstances: n instances of LRP guid.
func hundredInstances(b *testing.B, env *bbstest.Env, r *repEnv, socket, guid string, n int, ports bool) {
	lrp := desiredLRP(guid, int32(n))
	lrp.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/probe", Args: []string{"sleep"}}}}
	lrp.Ports, lrp.MemoryMb, lrp.DiskMb = nil, 16, 16
	if ports {
		lrp.Ports = []uint32{8080}
	}
	desire(b, env, lrp)
	work := make([]*repv1.LRPInstance, n)
	for j := range work {
		work[j] = lrpWork(lrp, int32(j))
	}
	runtime.GC()
	rss0, heap0 := residentKiB(b, os.Getpid()), heapInUse()
	t0 := time.Now()
	if resp := perform(b, r, work, nil); len(resp.GetFailedLrps()) > 0 {
		b.Fatalf("Perform refused %d instances", len(resp.GetFailedLrps()))
	}
	running := waitAllRunning(b, env, lrp.GetProcessGuid(), n)
	took := time.Since(t0)
	runtime.GC()
	rss1, heap1 := residentKiB(b, os.Getpid()), heapInUse()
	shims := 0
	for _, pid := range shimsOf(b, socket) {
		shims += residentKiB(b, pid)
	}
	b.ReportMetric(float64(n)/took.Seconds(), "starts/s")
	b.ReportMetric(float64(rss1)/1024, "rss-MiB")
	b.ReportMetric(float64(rss1-rss0)/1024, "rss-growth-MiB")
	b.ReportMetric(float64(heap1-heap0)/float64(n)/1024, "heap-KiB/instance")
	b.ReportMetric(float64(shims)/float64(n)/1024, "shim-rss-MiB/instance")

	t0 = time.Now()
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(16)
	for _, a := range running {
		g.Go(func() error {
			_, err := r.client.StopLRPInstance(ctx, &repv1.StopLRPInstanceRequest{Key: a.GetKey(), InstanceKey: a.GetInstanceKey()})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatalf("StopLRPInstance: %v", err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for len(runningContainers(b, r)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if left := runningContainers(b, r); len(left) > 0 {
		b.Fatalf("%d containers still on the cell 5 minutes after their stop", len(left))
	}
	b.ReportMetric(float64(n)/time.Since(t0).Seconds(), "stops/s")
	if _, err := env.Client.RemoveDesiredLRP(context.Background(), &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: guid}); err != nil {
		b.Fatalf("RemoveDesiredLRP: %v", err)
	}
}

// waitAllRunning polls the BBS every 20 ms until n instances of guid are RUNNING, and
// returns them.
func waitAllRunning(b *testing.B, env *bbstest.Env, guid string, n int) []*modelsv1.ActualLRP {
	deadline := time.Now().Add(10 * time.Minute)
	var running []*modelsv1.ActualLRP
	for time.Now().Before(deadline) {
		resp, err := env.Client.ActualLRPs(context.Background(), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}})
		if err != nil {
			b.Fatalf("ActualLRPs: %v", err)
		}
		running = running[:0]
		for _, a := range resp.GetActualLrps() {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				running = append(running, a)
			} else if a.GetCrashCount() > 0 {
				b.Fatalf("instance %d crashed: %s", a.GetKey().GetIndex(), a.GetCrashReason())
			}
		}
		if len(running) == n {
			return running
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("%d of %d instances of %s RUNNING after 10 minutes", len(running), n, guid)
	return nil
}

// runningContainers are the LRP containers the rep holds.
func runningContainers(b *testing.B, r *repEnv) []*repv1.LRPInstance {
	resp, err := r.client.State(context.Background(), &repv1.StateRequest{})
	if err != nil {
		b.Fatalf("State: %v", err)
	}
	return resp.GetLrps()
}

// residentKiB is VmRSS of process pid.
func residentKiB(b *testing.B, pid int) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				b.Fatalf("VmRSS of %d: %q", pid, line)
			}
			return kib
		}
	}
	b.Fatalf("no VmRSS for %d", pid)
	return 0
}

// shimsOf are the containerd shims of the containerd at socket (named in their arguments).
func shimsOf(b *testing.B, socket string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(cmdline), "containerd-shim") && strings.Contains(string(cmdline), socket) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// heapInUse is the Go heap in use, in bytes.
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// probeRootfs is a preloaded rootfs holding the oci backend's probe (static) in /bin.
func probeRootfs(b *testing.B) string {
	root := b.TempDir()
	for _, dir := range []string{"bin", "etc", "tmp"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := rootfstest.BuildStatic(".", filepath.Join(root, "bin"), "./internal/executor/oci/testdata/probe"); err != nil {
		b.Fatal(err)
	}
	return root
}

// waitRunningFast polls the BBS every 2 ms until index 0 of guid is RUNNING.
func waitRunningFast(b *testing.B, env *bbstest.Env, guid string) *modelsv1.ActualLRP {
	deadline := time.Now().Add(time.Minute)
	index := int32(0)
	for time.Now().Before(deadline) {
		resp, err := env.Client.ActualLRPs(context.Background(), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}, Index: &index})
		if err != nil {
			b.Fatalf("ActualLRPs: %v", err)
		}
		for _, a := range resp.GetActualLrps() {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				return a
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.Fatalf("%s not RUNNING within a minute", guid)
	return nil
}
