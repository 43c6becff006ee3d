package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/rep"
)

// target is the cluster a run drives: every service in this process over plaintext
// (inProcess), or as deployed, each service a process of its own with mutual TLS on every hop
// (deployed).
type target interface {
	// BBS is the run's BBS client (retrying load the BBS sheds, as bbsclient's connection does).
	BBS() bbsv1.BBSServiceClient
	// RouteEmitter is a client of the route-emitter.
	RouteEmitter() routeemitterv1.RouteEmitterServiceClient
	// Etcd is a client of the cluster's etcd (for the ceiling of the same run).
	Etcd() *clientv3.Client
	// Hosts is how many hosts hold the cells; HostCells lists one's cells.
	Hosts() int
	HostCells(h int) []string
	// LoseHost cuts host h off: its cells stop refreshing their presence.
	LoseHost(t testing.TB, h int)
	// DialRep connects to a cell's rep as the audit's identity.
	DialRep(addr string) (*grpc.ClientConn, error)
	// Usage is CPU time and peak RSS by process.
	Usage() []procUsage
}

// The names of the usage entries that are not a service: the harness itself (as deployed) and
// the one process of an in-process run.
const (
	harnessProc = "harness"
	oneProcess  = "everything (one process)"
)

// procUsage is what one process (or a group of like processes) used.
type procUsage struct {
	name    string
	n       int           // processes in the group
	cpu     time.Duration // user + system, summed over the group
	peakRSS uint64        // the largest of the group's peaks, bytes
	cells   int           // cells the group hosts
}

// inProcess is the devcluster of a run in this process.
type inProcess struct {
	c     *devcluster.Cluster
	re    routeemitterv1.RouteEmitterServiceClient
	cells int
}

func (p *inProcess) BBS() bbsv1.BBSServiceClient                            { return p.c.BBS }
func (p *inProcess) RouteEmitter() routeemitterv1.RouteEmitterServiceClient { return p.re }
func (p *inProcess) Etcd() *clientv3.Client                                 { return p.c.Etcd }
func (p *inProcess) Hosts() int                                             { return p.c.Hosts() }
func (p *inProcess) HostCells(h int) []string                               { return p.c.HostCells(h) }

func (p *inProcess) LoseHost(t testing.TB, h int) {
	if err := p.c.DisconnectHost(h); err != nil {
		t.Fatalf("disconnect host %d: %v", h, err)
	}
}

func (p *inProcess) DialRep(addr string) (*grpc.ClientConn, error) {
	return grpcx.Dial(addr, grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}})
}

func (p *inProcess) Usage() []procUsage {
	u, _ := usageOf(os.Getpid())
	u.name, u.n, u.cells = oneProcess, 1, p.cells
	return []procUsage{u}
}

// deployed is a run's cluster of built binaries: gavel-etcd, the BBS, the auctioneer, the
// route-emitter, the router and sim hosts (rep -sim-cells), each cell with an identity of its
// own, every hop over mutual TLS.
type deployed struct {
	pki                     map[string]tlsx.Config
	services                []*testkit.Proc
	hosts                   []*testkit.Proc
	hostCells               [][]string
	usageAtLoss             map[int]procUsage // of each lost host, read before the kill
	bbs                     bbsv1.BBSServiceClient
	re                      routeemitterv1.RouteEmitterServiceClient
	etcd                    *clientv3.Client
	bbsAddr, auctioneerAddr string
	emitterAddr             string
	// profileDir and metrics: with -profile-dir, the services' metrics addresses (name, address),
	// saved as DIR/NAME.metrics at the end of the run.
	profileDir string
	metrics    [][2]string
	// lastProgress is when start-up progress was last printed; registered holds every cell
	// seen registered during start-up.
	lastProgress time.Time
	registered   map[string]bool
}

// hostID is the cell-id prefix of sim host h.
func hostID(h int) string { return fmt.Sprintf("rack-%03d", h) }

// hostSizes is how many cells each sim host runs: hosts of perHost, with the one that holds
// the rest first (so that the hosts lost from the end are whole), then, when small is not 0, a
// last host of exactly small cells (the first, small loss). A host never runs a single cell
// when it can be avoided.
func hostSizes(cells, perHost, small int) []int {
	n := cells - small
	var sizes []int
	if rest := n % perHost; rest > 0 {
		sizes = append(sizes, rest)
	}
	for range n / perHost {
		sizes = append(sizes, perHost)
	}
	if len(sizes) > 1 && sizes[0] == 1 {
		sizes = append([]int{perHost + 1}, sizes[2:]...)
	}
	if small > 0 {
		sizes = append(sizes, small)
	}
	return sizes
}

// startDeployed starts the processes of a deployed run under dir and waits until every cell
// is registered and the auctioneer leads.
func startDeployed(t testing.TB, cfg runConfig, dir string) *deployed {
	t.Helper()
	perHost := max(cfg.CellsPerHost, 2) // a sim host runs at least two cells
	d := &deployed{usageAtLoss: map[int]procUsage{}, profileDir: cfg.ProfileDir, lastProgress: time.Now(), registered: map[string]bool{}}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range hostSizes(cfg.Cells, perHost, smallLossCells(cfg)) {
		h := len(d.hostCells)
		cells := make([]string, n)
		for i := range cells {
			cells[i] = rep.SimCellID(hostID(h), i)
		}
		d.hostCells = append(d.hostCells, cells)
	}
	names := []string{"etcd", "bbs", "auctioneer", "route-emitter", "router", "admin"}
	for _, cells := range d.hostCells {
		for _, id := range cells {
			names = append(names, "rep/"+id)
		}
	}
	pki, err := tlsx.GenerateDevPKI(filepath.Join(dir, "pki"), names...)
	if err != nil {
		t.Fatal(err)
	}
	d.pki = pki
	flags := func(prefix, identity string) []string {
		id := pki[identity]
		return []string{"-" + prefix + "-cert", id.CertFile, "-" + prefix + "-key", id.KeyFile, "-" + prefix + "-ca", id.CAFile}
	}
	start := func(name string, args ...string) *testkit.Proc {
		if cfg.ProfileDir != "" && name != "router" {
			// Beside the profiles, each service's metrics at the end of the run (saveRunFiles).
			addr := testkit.ReservedAddr(t)
			d.metrics = append(d.metrics, [2]string{name, addr})
			args = append(args, "-metrics-address", addr)
		}
		p := testkit.StartProcEnv(t, time.Minute, cfg.serviceEnv(name), name, testkit.Binary(t, binaryOf(name)), args...)
		d.services = append(d.services, p)
		return p
	}

	clientURL, etcdProc := startGavelEtcd(t, "scale", filepath.Join(dir, "etcd"), pki["etcd"], cfg.profileEnv("gavel-etcd")...)
	d.services = append(d.services, etcdProc)
	etcdFlags := func(identity string) []string {
		return append([]string{"-etcd-endpoints", clientURL}, flags("etcd", identity)...)
	}

	d.bbsAddr, d.auctioneerAddr, d.emitterAddr = testkit.ReservedAddr(t), testkit.ReservedAddr(t), testkit.ReservedAddr(t)
	bbsArgs := append([]string{"-listen", d.bbsAddr, "-auctioneer-address", d.auctioneerAddr, "-log-level", "error"}, flags("tls", "bbs")...)
	bbsArgs = append(bbsArgs, etcdFlags("bbs")...)
	if cfg.ProfileDir != "" {
		bbsArgs = append(bbsArgs, "-log-level", "info") // its convergence passes, in DIR/bbs.log
	}
	if cfg.BBSMaxInflightWrites >= 0 {
		path := filepath.Join(dir, "bbs.json")
		if err := os.WriteFile(path, fmt.Appendf(nil, `{"max_inflight_writes": %d}`, cfg.BBSMaxInflightWrites), 0o644); err != nil {
			t.Fatal(err)
		}
		bbsArgs = append(bbsArgs, "-config", path)
	}
	start("bbs", bbsArgs...)
	auctArgs := append([]string{"-listen", d.auctioneerAddr, "-bbs-address", d.bbsAddr, "-log-level", "error"}, flags("tls", "auctioneer")...)
	auctArgs = append(auctArgs, flags("bbs", "auctioneer")...)
	auctArgs = append(auctArgs, flags("rep", "auctioneer")...)
	auctArgs = append(auctArgs, etcdFlags("auctioneer")...)
	if cfg.ProfileDir != "" {
		auctArgs = append(auctArgs, "-log-level", "info") // its rounds, in DIR/auctioneer.log
	}
	if cfg.AuctioneerMaxInflight >= 0 {
		auctArgs = append(auctArgs, "-max-inflight-starts", strconv.Itoa(cfg.AuctioneerMaxInflight))
	}
	if cfg.AuctioneerSampleCells >= 0 {
		auctArgs = append(auctArgs, "-sample-cells", strconv.Itoa(cfg.AuctioneerSampleCells))
	}
	start("auctioneer", auctArgs...)
	reArgs := append([]string{"-listen", d.emitterAddr, "-bbs-address", d.bbsAddr, "-log-level", "error"}, flags("tls", "route-emitter")...)
	reArgs = append(reArgs, flags("bbs", "route-emitter")...)
	if cfg.ProfileDir != "" {
		reArgs = append(reArgs, "-log-level", "debug") // its listings, in DIR/route-emitter.log
	}
	if cfg.RouteSyncInterval > 0 {
		reArgs = append(reArgs, "-sync-interval", cfg.RouteSyncInterval.String())
	}
	start("route-emitter", reArgs...)
	start("router", append([]string{"-http", testkit.ReservedAddr(t), "-https", "", "-admin", "", "-tcp-bind", "127.0.0.1",
		"-routeemitter-address", d.emitterAddr, "-log-level", "error"}, flags("routeemitter", "router")...)...)

	admin := pki["admin"]
	conn, err := bbsclient.Dial(bbsclient.Config{BBSAddress: d.bbsAddr, BBSTLS: admin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	d.bbs = bbsv1.NewBBSServiceClient(conn)

	perCell := 2*cfg.Instances/cfg.Cells + 20
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	cellPath := func(path, id string) string { return strings.ReplaceAll(path, id, rep.CellPlaceholder) }
	for h, cells := range d.hostCells {
		id := pki["rep/"+cells[0]]
		cert, key := cellPath(id.CertFile, cells[0]), cellPath(id.KeyFile, cells[0])
		args := []string{"-backend", "sim", "-sim-cells", strconv.Itoa(len(cells)), "-cell-id", hostID(h),
			"-zone", fmt.Sprintf("z%d", h%3), "-listen", "127.0.0.1:0", "-cell-address", "127.0.0.1",
			"-preloaded-rootfses", fmt.Sprintf(`{"cflinuxfs4":%q}`, rootfs),
			"-memory-mb", strconv.Itoa(64 * perCell), "-disk-mb", strconv.Itoa(64 * perCell), "-containers", strconv.Itoa(perCell),
			"-sim-start-latency", cfg.StartLatency.String(), "-sim-log-interval", "0", "-lease-ttl", cfg.LeaseTTL.String(),
			"-bulk-interval", "1h", // nothing may depend on the bulk loop
			"-work-dir", filepath.Join(dir, hostID(h)), "-bbs-address", d.bbsAddr, "-etcd-endpoints", clientURL,
			"-log-level", "warn", // a cell's presence warns when its renewals stop or come late: cellLogs
			"-tls-cert", cert, "-tls-key", key, "-tls-ca", id.CAFile,
			"-bbs-cert", cert, "-bbs-key", key, "-bbs-ca", id.CAFile,
			"-etcd-cert", cert, "-etcd-key", key, "-etcd-ca", id.CAFile}
		d.awaitHostsRegistered(t, cfg, h-hostsStartingAtOnce)
		bin := testkit.Binary(t, "rep")
		if cfg.HostNice != 0 {
			// nice execs the rep: the process (and its pid, which the report reads) is the rep's.
			args = append([]string{"-n", strconv.Itoa(cfg.HostNice), bin}, args...)
			bin = "nice"
		}
		d.hosts = append(d.hosts, testkit.StartProcEnv(t, time.Minute, cfg.hostEnv(hostID(h)), hostID(h), bin, args...))
	}

	reConn, err := grpcx.Dial(d.emitterAddr, grpcx.ClientConfig{TLS: admin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reConn.Close() })
	d.re = routeemitterv1.NewRouteEmitterServiceClient(reConn)
	if d.etcd, err = etcdx.Connect([]string{clientURL}, admin, logtest.New(t).Named("etcd")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.etcd.Close() })

	auctConn, err := grpcx.Dial(d.auctioneerAddr, grpcx.ClientConfig{TLS: admin})
	if err != nil {
		t.Fatal(err)
	}
	defer auctConn.Close()
	d.wait(t, cfg.PhaseTimeout, "the auctioneer to lead", func() (bool, string) {
		return testkit.Serving(auctConn, testkit.AuctioneerService)
	})
	return d
}

// hostsStartingAtOnce bounds the sim hosts whose cells register at once. All 5,000 cells
// starting together on two cores (15,000 TLS handshakes with etcd, the BBS and the auctioneer)
// starved the lease keepalives of the cells that had registered: cells lost their presence as
// fast as others registered, and the count never reached 5,000.
const hostsStartingAtOnce = 4

// awaitHostsRegistered waits until every cell of hosts 0..last is registered (nothing when last
// is negative).
func (d *deployed) awaitHostsRegistered(t testing.TB, cfg runConfig, last int) {
	t.Helper()
	if last < 0 {
		return
	}
	d.wait(t, cfg.PhaseTimeout, fmt.Sprintf("the cells of hosts 0-%d registered", last), func() (bool, string) {
		resp, err := d.bbs.Cells(context.Background(), &bbsv1.CellsRequest{})
		if err != nil {
			return false, err.Error()
		}
		present := make(map[string]bool, len(resp.GetCells()))
		for _, c := range resp.GetCells() {
			present[c.GetCellId()] = true
		}
		missing, lost := 0, 0
		for _, cells := range d.hostCells[:last+1] {
			for _, id := range cells {
				if present[id] {
					d.registered[id] = true
				} else {
					missing++
					if d.registered[id] {
						lost++
					}
				}
			}
		}
		state := fmt.Sprintf("%d cells missing", missing)
		if lost > 0 {
			// Cells that registered lose their presence when the machine cannot keep every
			// cell's keepalives going: at rest each hosted cell costs about 0.015-0.03% of a core, and
			// the start-up's TLS handshakes far more.
			state += fmt.Sprintf(", %d of them registered earlier and lost their presence since (too many cells for this machine's CPU?)", lost)
		}
		if time.Since(d.lastProgress) >= 30*time.Second {
			d.lastProgress = time.Now()
			fmt.Printf("start-up: %d sim hosts of %d started, %d cells registered; %s\n", last+hostsStartingAtOnce, len(d.hostCells), len(resp.GetCells()), state)
		}
		return missing == 0, state
	})
}

// profileEnv is the environment that makes process name write its CPU and heap profiles into
// cfg.ProfileDir (servicemain.CPUProfileEnv, HeapProfileEnv), or none without one.
func (cfg runConfig) profileEnv(name string) []string {
	if cfg.ProfileDir == "" {
		return nil
	}
	return []string{
		servicemain.CPUProfileEnv + "=" + filepath.Join(cfg.ProfileDir, name+".cpu"),
		servicemain.HeapProfileEnv + "=" + filepath.Join(cfg.ProfileDir, name+".heap"),
	}
}

// serviceEnv is the environment of service name: its profiles' (profileEnv), with them a
// line per garbage collection in DIR/NAME.log (gctrace: "@Ns" is seconds since the process
// started, its log's first line), and, for the BBS, its GOMEMLIMIT (cfg.BBSMemoryLimit).
func (cfg runConfig) serviceEnv(name string) []string {
	env := cfg.profileEnv(name)
	if cfg.ProfileDir != "" {
		env = append(env, "GODEBUG=gctrace=1")
	}
	if name == "bbs" && cfg.BBSMemoryLimit != "" {
		env = append(env, "GOMEMLIMIT="+cfg.BBSMemoryLimit)
	}
	return env
}

// hostEnv is the environment of sim host name: its profiles' (profileEnv) and, with
// cfg.HostProcs, its GOMAXPROCS.
func (cfg runConfig) hostEnv(name string) []string {
	env := cfg.profileEnv(name)
	if cfg.HostProcs > 0 {
		env = append(env, "GOMAXPROCS="+strconv.Itoa(cfg.HostProcs))
	}
	return env
}

// binaryOf is the binary a deployed service runs.
func binaryOf(service string) string {
	if service == "route-emitter" {
		return "routeemitter"
	}
	return service
}

// wait is waitUntil failing at once when one of the processes exited.
func (d *deployed) wait(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	waitUntil(t, timeout, what, func() (bool, string) {
		d.alive(t, what)
		return cond()
	})
}

// alive fails t, with the process's output, when a service or a host not lost on purpose has
// exited while waiting for what.
func (d *deployed) alive(t testing.TB, what string) {
	t.Helper()
	for _, p := range d.services {
		d.failIfExited(t, p, what)
	}
	for h, p := range d.hosts {
		if _, lost := d.usageAtLoss[h]; !lost {
			d.failIfExited(t, p, what)
		}
	}
}

// failIfExited fails t when p has exited while waiting for what.
func (d *deployed) failIfExited(t testing.TB, p *testkit.Proc, what string) {
	if p.Done() {
		t.Fatalf("%s exited (%v) while waiting for %s; output:\n%s", p.Name, p.Err, what, tail(p.Out.String(), 4000))
	}
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

func (d *deployed) BBS() bbsv1.BBSServiceClient                            { return d.bbs }
func (d *deployed) RouteEmitter() routeemitterv1.RouteEmitterServiceClient { return d.re }
func (d *deployed) Etcd() *clientv3.Client                                 { return d.etcd }
func (d *deployed) Hosts() int                                             { return len(d.hosts) }
func (d *deployed) HostCells(h int) []string                               { return d.hostCells[h] }

// cellLogs is what the sim hosts logged about each of ids (the hosts log at warn), at most n
// lines per cell, the last ones: why a healthy cell lost its presence, in its rep's words. Each
// host's output is read once, however many of its cells are asked about.
func (d *deployed) cellLogs(ids []string, n int) map[string][]string {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	out := make(map[string][]string, len(ids))
	for h, cells := range d.hostCells {
		if !slices.ContainsFunc(cells, func(c string) bool { return want[c] }) {
			continue
		}
		for line := range strings.Lines(d.hosts[h].Out.String()) {
			for _, f := range strings.Fields(line) {
				if id, ok := strings.CutPrefix(f, "cell_id="); ok && want[id] {
					out[id] = append(out[id], strings.TrimRight(line, "\n"))
					break
				}
			}
		}
	}
	for id, lines := range out {
		out[id] = lines[max(len(lines)-n, 0):]
	}
	return out
}

// listerEnv, set in the environment of this test binary, makes it a list client (runLister)
// instead of running tests: its value is a listerSpec in JSON.
const listerEnv = "GAVEL_SCALE_LISTER"

// listerSpec is what a list client does: n lists of every actual LRP from the BBS at address.
type listerSpec struct {
	Address string      `json:"address"`
	TLS     tlsx.Config `json:"tls"`
	N       int         `json:"n"`
}

// listerResult is a list client's answer, on its standard output.
type listerResult struct {
	Took      []time.Duration `json:"took"`
	Instances int             `json:"instances"`
	Error     string          `json:"error,omitempty"`
}

// runLister is the test binary as a client of its own, as an operator's tool or a dashboard
// would list: a process whose heap holds nothing but the list, unlike this harness's, which
// holds what the observer saw of every instance. It lists spec.N times and prints each list's
// time as a listerResult; it returns the process's exit code.
func runLister(spec string) int {
	var s listerSpec
	res := listerResult{}
	defer func() { _ = json.NewEncoder(os.Stdout).Encode(res) }()
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		res.Error = err.Error()
		return 2
	}
	conn, err := bbsclient.Dial(bbsclient.Config{BBSAddress: s.Address, BBSTLS: s.TLS})
	if err != nil {
		res.Error = err.Error()
		return 1
	}
	defer conn.Close()
	bbs := bbsv1.NewBBSServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for range s.N {
		t0 := time.Now()
		resp, err := bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{}, grpc.MaxCallRecvMsgSize(1<<30))
		if err != nil {
			res.Error = err.Error()
			return 1
		}
		res.Took = append(res.Took, time.Since(t0))
		res.Instances = len(resp.GetActualLrps())
	}
	return 0
}

// listFromOwnProcess runs this test binary as a list client of its own (runLister) with the
// admin's identity, n lists, and returns each list's time and the instances the last one held.
func (d *deployed) listFromOwnProcess(ctx context.Context, n int) ([]time.Duration, int, error) {
	spec, err := json.Marshal(listerSpec{Address: d.bbsAddr, TLS: d.pki["admin"], N: n})
	if err != nil {
		return nil, 0, err
	}
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), listerEnv+"="+string(spec))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var res listerResult
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, 0, fmt.Errorf("list client: %v (%v; %s)", err, runErr, tail(stderr.String(), 2000))
	}
	if res.Error != "" || runErr != nil {
		return nil, 0, fmt.Errorf("list client: %s (%v)", res.Error, runErr)
	}
	return res.Took, res.Instances, nil
}

// LoseHost kills sim host h with SIGKILL, as a rack losing power: its cells' leases expire.
func (d *deployed) LoseHost(t testing.TB, h int) {
	u, err := usageOf(d.hosts[h].Pid)
	if err != nil {
		t.Fatalf("usage of %s: %v", d.hosts[h].Name, err)
	}
	u.name = hostID(h)
	d.usageAtLoss[h] = u
	d.hosts[h].Kill(t)
}

func (d *deployed) DialRep(addr string) (*grpc.ClientConn, error) {
	return grpcx.Dial(addr, grpcx.ClientConfig{TLS: d.pki["admin"]})
}

// Usage is each service's process, then the sim hosts as one group (CPU summed, the largest
// peak RSS), read now or, for a lost host, when it was killed.
func (d *deployed) Usage() []procUsage {
	var out []procUsage
	for _, p := range d.services {
		u, _ := usageOf(p.Pid)
		u.name, u.n = p.Name, 1
		out = append(out, u)
	}
	hosts := procUsage{name: "sim hosts (rep)"}
	for h, p := range d.hosts {
		u, ok := d.usageAtLoss[h]
		if !ok {
			u, _ = usageOf(p.Pid)
		}
		hosts.n++
		hosts.cells += len(d.hostCells[h])
		hosts.cpu += u.cpu
		hosts.peakRSS = max(hosts.peakRSS, u.peakRSS)
	}
	return append(out, hosts)
}

// withHarness is us with this process's own usage (the harness: clients, observer, and in
// process everything) added as the last entry.
func withHarness(us []procUsage) []procUsage {
	self, _ := usageOf(os.Getpid())
	self.name, self.n = harnessProc, 1
	return append(us, self)
}

// usageSince is the CPU each process of after used since before (matched by name; a group's
// processes summed).
func usageSince(before, after []procUsage) []procUsage {
	was := make(map[string]time.Duration, len(before))
	for _, u := range before {
		was[u.name] = u.cpu
	}
	out := make([]procUsage, 0, len(after))
	for _, u := range after {
		u.cpu -= was[u.name]
		out = append(out, u)
	}
	return out
}

// usageOf reads the CPU time (user + system) and peak RSS of process pid.
func usageOf(pid int) (procUsage, error) {
	cpu, err := testkit.ProcessCPU(pid)
	if err != nil {
		return procUsage{}, err
	}
	rss, err := testkit.PeakRSS(pid)
	return procUsage{cpu: cpu, peakRSS: rss}, err
}

// saveRunFiles writes, with -profile-dir, each service's /metrics to DIR/NAME.metrics (the
// counters of a run: the BBS's calls by method and code, the auctioneer's rounds and failures)
// to read beside its profiles, and each service's output to DIR/NAME.log (the auctioneer logs
// every round at info: its work, placed, deferred, reused states and phase timings). A service
// that does not answer is skipped.
func (d *deployed) saveRunFiles() {
	if d.profileDir == "" {
		return
	}
	for _, p := range d.services {
		_ = os.WriteFile(filepath.Join(d.profileDir, p.Name+".log"), []byte(p.Out.String()), 0o644)
	}
	for _, m := range d.metrics {
		resp, err := http.Get("http://" + m[1] + "/metrics")
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			_ = os.WriteFile(filepath.Join(d.profileDir, m[0]+".metrics"), b, 0o644)
		}
	}
}

// TestHostSizes checks the deployed layout: every cell on one host, whole hosts of perHost
// lost from the end, the small loss's host last, no host of a single cell.
func TestHostSizes(t *testing.T) {
	for _, tc := range []struct {
		cells, perHost, small int
		want                  []int
	}{
		{5000, 100, 50, append(append([]int{50}, slices.Repeat([]int{100}, 49)...), 50)},
		{1000, 100, 10, append(append([]int{90}, slices.Repeat([]int{100}, 9)...), 10)},
		{5000, 100, 0, slices.Repeat([]int{100}, 50)},
		{20, 5, 2, []int{3, 5, 5, 5, 2}},
		{501, 100, 0, append([]int{101}, slices.Repeat([]int{100}, 4)...)},
	} {
		if got := hostSizes(tc.cells, tc.perHost, tc.small); !slices.Equal(got, tc.want) {
			t.Errorf("hostSizes(%d, %d, %d) = %v, want %v", tc.cells, tc.perHost, tc.small, got, tc.want)
		}
	}
}

// TestShare checks the loss lines' share of the cells, rounded to a tenth of a per cent.
func TestShare(t *testing.T) {
	for _, tc := range []struct {
		n, all int
		want   string
	}{{50, 5000, "1%"}, {500, 5000, "10%"}, {5, 20, "25%"}, {7, 300, "2.3%"}, {1, 0, "100%"}} {
		if got := share(tc.n, tc.all); got != tc.want {
			t.Errorf("share(%d, %d) = %q, want %q", tc.n, tc.all, got, tc.want)
		}
	}
}

// TestCellLog checks that a cell's lines are picked out of its sim host's log: its own, not a
// cell whose id it prefixes, the last n.
func TestCellLog(t *testing.T) {
	host := &testkit.Proc{Out: &testkit.SyncBuffer{}}
	for _, l := range []string{
		"[WARN]  rep.presence: cell presence renewal answered late: cell_id=rack-001-0001 waited=4s ttl=10s",
		"[WARN]  rep.presence: cell presence renewal answered late: cell_id=rack-001-00010 waited=5s ttl=10s",
		"[WARN]  rep.presence: no cell presence renewal answered for the lease's TTL: cell_id=rack-001-0001",
		"[WARN]  rep.presence: cell presence keepalive ended; asking etcd whether the lease lives: cell_id=rack-001-0001 reason=\"keepalive ended\"",
	} {
		_, _ = host.Out.Write([]byte(l + "\n"))
	}
	d := &deployed{hosts: []*testkit.Proc{{Out: &testkit.SyncBuffer{}}, host}, hostCells: [][]string{{"rack-000-0001"}, {"rack-001-0001", "rack-001-00010"}}}
	got := d.cellLogs([]string{"rack-001-0001"}, 2)["rack-001-0001"]
	if len(got) != 2 || !strings.Contains(got[0], "no cell presence renewal") || !strings.Contains(got[1], "keepalive ended") {
		t.Errorf("cellLogs: %q", got)
	}
	if got := d.cellLogs([]string{"rack-001-0001"}, 10)["rack-001-0001"]; len(got) != 3 {
		t.Errorf("cellLogs of all: %d lines, want 3: %q", len(got), got)
	}
	if got := d.cellLogs([]string{"rack-000-0001"}, 10)["rack-000-0001"]; len(got) != 0 {
		t.Errorf("a quiet cell's log: %q", got)
	}
}
