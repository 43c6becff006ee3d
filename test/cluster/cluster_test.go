//go:build cluster

// Package cluster tests Gavel across hosts: every member is a Docker container on a private
// network, built FROM scratch from the project's static binaries (deployments/docker): a
// 3-member etcd, 2 BBS, 2 auctioneers, 3 process-backend reps, the route-emitter and the
// router, with mutual TLS on every hop (etcd included) and each service presenting its own identity, as
// deployments/docker/compose.yaml runs them. A sample app desired through the CLI answers
// through the router, and every service's /metrics shows per-RPC histograms. Faults are real: a
// cell is cut off its network, an etcd member is killed. The test drives the docker CLI and
// reaches the members only through ports published on 127.0.0.1. TestCompose brings up
// deployments/docker/compose.yaml itself, as shipped, and checks the same flow plus nsync.
//
//	make test-cluster     # go test -tags cluster -count=1 -timeout 20m ./test/cluster/
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

const (
	waitLong = 90 * time.Second // bound of every wait for the cluster to settle
	rootfs   = "preloaded:cflinuxfs4"
)

// docker runs the docker CLI and returns its trimmed combined output.
func docker(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

func mustDocker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := docker(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bed is the running test bed.
type bed struct {
	t          *testing.T
	image      string
	prefix     string // of container and network names
	network    string
	subnet     string // "a.b.c." of the private /24
	containers []string
	etcd       []string          // container names
	etcdURLs   []string          // client URLs on the private network
	etcdHost   []string          // client addresses published on 127.0.0.1
	reps       map[string]string // cell id → container name
	repIPs     map[string]string // cell id → address on the private network
	bbs        []bbsv1.BBSServiceClient
	pki        string // host directory of the certificates, mounted at /pki
	certs      map[string]tlsx.Config
	metrics    map[string]string // container → its /metrics address on 127.0.0.1
	bbsAddrs   []string          // on the private network
	router     string            // container name
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newBed builds the image and creates the private network; containers come later.
func newBed(t *testing.T) *bed {
	if _, err := docker("info", "--format", "{{.ServerVersion}}"); err != nil {
		t.Skipf("no docker engine: %v", err)
	}
	id := randomHex(4)
	b := &bed{t: t, image: "gavel-test:" + id, prefix: "gavel-test-" + id, reps: map[string]string{}, repIPs: map[string]string{}}

	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "..", "..", "deployments", "docker", "build.sh")
	start := time.Now()
	out, err := exec.Command(script, b.image).CombinedOutput()
	t.Cleanup(func() { _, _ = docker("rmi", "-f", b.image) })
	if err != nil {
		t.Fatalf("build image: %v\n%s", err, out)
	}
	t.Logf("built %s in %s", b.image, time.Since(start).Round(time.Second))

	// A user-defined subnet, so every member gets a fixed address (reps register theirs).
	b.network = b.prefix
	for attempt := 0; ; attempt++ {
		b.subnet = fmt.Sprintf("10.%d.%d.", 200+mrand.IntN(50), mrand.IntN(256))
		_, err := docker("network", "create", "--label", "gavel-test", "--driver", "bridge", "--subnet", b.subnet+"0/24", b.network)
		if err == nil {
			break
		}
		if attempt == 10 {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range b.containers {
				logs, _ := docker("logs", "--tail", "80", c)
				t.Logf("--- %s (last 80 lines):\n%s", c, logs)
			}
		}
		for _, c := range slices.Backward(b.containers) {
			_, _ = docker("rm", "-f", "-v", c)
		}
		if _, err := docker("network", "rm", b.network); err != nil {
			t.Errorf("remove network: %v", err)
		}
	})
	return b
}

// run starts a container of the image on the private network at address ip; publish lists
// container ports published on 127.0.0.1 (random host ports).
func (b *bed) run(name, ip string, publish []string, cmd ...string) string {
	b.t.Helper()
	full := b.prefix + "-" + name
	args := []string{"run", "-d", "--label", "gavel-test", "--name", full, "--hostname", name, "--network", b.network, "--ip", ip,
		"-v", b.pki + ":/pki:ro"}
	for _, p := range publish {
		args = append(args, "-p", "127.0.0.1::"+p)
	}
	args = append(args, b.image)
	b.containers = append(b.containers, full)
	mustDocker(b.t, append(args, cmd...)...)
	return full
}

// hostAddr is the 127.0.0.1 address a container's port is published on.
func (b *bed) hostAddr(container, port string) string {
	b.t.Helper()
	out := mustDocker(b.t, "port", container, port+"/tcp")
	line, _, _ := strings.Cut(out, "\n")
	return strings.TrimSpace(line)
}

// help is a binary's -h text.
func (b *bed) help(bin string) string {
	out, _ := docker("run", "--rm", "--network", "none", b.image, "/bin/"+bin, "-h")
	return out
}

// listFlag reports whether bin's help says flag takes several comma-separated values: the HA
// clients (several BBS or auctioneer addresses) are used when the binaries have them.
func (b *bed) listFlag(bin, flag string) bool {
	lines := strings.Split(b.help(bin), "\n")
	for i, l := range lines {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "-"+flag && i+1 < len(lines) {
			return strings.Contains(lines[i+1], "comma-separated")
		}
	}
	return false
}

// hasFlag reports whether bin has flag.
func (b *bed) hasFlag(bin, flag string) bool {
	for _, l := range strings.Split(b.help(bin), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "-"+flag {
			return true
		}
	}
	return false
}

// tlsArgs are the flags presenting identity's certificate (mounted at /pki) for each prefix
// ("-tls", "-bbs", ...).
func tlsArgs(identity string, prefixes ...string) []string {
	var args []string
	for _, p := range prefixes {
		args = append(args, p+"-cert", "/pki/"+identity+".crt", p+"-key", "/pki/"+identity+".key", p+"-ca", "/pki/ca.crt")
	}
	return args
}

// start brings the whole cluster up and waits until an auctioneer leads and 3 cells registered.
func (b *bed) start() {
	t := b.t
	// Every identity's certificate, valid for every member's address ("gavel certs --host").
	var hosts []string
	for _, last := range []string{"10", "11", "12", "20", "21", "30", "31", "40", "41", "42", "50", "60"} {
		hosts = append(hosts, b.subnet+last)
	}
	b.pki = t.TempDir()
	var err error
	b.certs, err = tlsx.GenerateDevPKIHosts(b.pki, hosts, "etcd", "bbs", "auctioneer", "route-emitter", "router", "admin",
		"rep/cell-z1", "rep/cell-z2", "rep/cell-z3")
	if err != nil {
		t.Fatal(err)
	}
	b.metrics = map[string]string{}
	var peers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("etcd-%d=https://%s1%d:2380", i, b.subnet, i))
		b.etcdURLs = append(b.etcdURLs, fmt.Sprintf("https://%s1%d:2379", b.subnet, i))
	}
	for i := range 3 {
		ip := fmt.Sprintf("%s1%d", b.subnet, i)
		b.etcd = append(b.etcd, b.run(fmt.Sprintf("etcd-%d", i), ip, []string{"2379"}, "/bin/gavel-etcd",
			"--name", fmt.Sprintf("etcd-%d", i), "--data-dir", "/var/lib/etcd/data",
			"--listen-client-urls", "https://0.0.0.0:2379", "--advertise-client-urls", "https://"+ip+":2379",
			"--listen-peer-urls", "https://0.0.0.0:2380", "--initial-advertise-peer-urls", "https://"+ip+":2380",
			"--initial-cluster", strings.Join(peers, ","), "--initial-cluster-state", "new",
			"--cert-file", "/pki/etcd.crt", "--key-file", "/pki/etcd.key", "--trusted-ca-file", "/pki/ca.crt",
			"--peer-cert-file", "/pki/etcd.crt", "--peer-key-file", "/pki/etcd.key", "--peer-trusted-ca-file", "/pki/ca.crt"))
	}
	for _, c := range b.etcd {
		b.etcdHost = append(b.etcdHost, b.hostAddr(c, "2379"))
	}
	etcd := strings.Join(b.etcdURLs, ",")

	auctioneers := []string{b.subnet + "30:8890", b.subnet + "31:8890"}
	bbsAddrs := []string{b.subnet + "20:8889", b.subnet + "21:8889"}
	auctioneerFlag := auctioneers[0]
	if b.listFlag("bbs", "auctioneer-address") {
		auctioneerFlag = strings.Join(auctioneers, ",")
	} else {
		t.Logf("bbs takes one -auctioneer-address: using %s only", auctioneerFlag)
	}
	bbsFlag := func(bin string) string {
		if b.listFlag(bin, "bbs-address") {
			return strings.Join(bbsAddrs, ",")
		}
		t.Logf("%s takes one -bbs-address: using %s only", bin, bbsAddrs[0])
		return bbsAddrs[0]
	}
	b.bbsAddrs = bbsAddrs
	bbsArgs := append([]string{"-listen", ":8889", "-etcd-endpoints", etcd,
		"-auctioneer-address", auctioneerFlag, "-metrics-address", ":9090"}, tlsArgs("bbs", "-tls", "-etcd")...)
	if b.hasFlag("bbs", "convergence-interval") {
		bbsArgs = append(bbsArgs, "-convergence-interval", "2s")
	}
	var bbsNames []string
	for i := range 2 {
		bbsNames = append(bbsNames, b.run(fmt.Sprintf("bbs-%d", i), fmt.Sprintf("%s2%d", b.subnet, i), []string{"8889", "9090"},
			append([]string{"/bin/bbs"}, bbsArgs...)...))
	}
	auctioneerBBS := bbsFlag("auctioneer")
	var auctNames []string
	for i := range 2 {
		auctNames = append(auctNames, b.run(fmt.Sprintf("auctioneer-%d", i), fmt.Sprintf("%s3%d", b.subnet, i), []string{"8890", "9090"},
			append([]string{"/bin/auctioneer", "-listen", ":8890", "-bbs-address", auctioneerBBS,
				"-etcd-endpoints", etcd, "-batch-interval", "20ms", "-lock-ttl", "5s", "-metrics-address", ":9090"},
				tlsArgs("auctioneer", "-tls", "-bbs", "-rep", "-etcd")...)...))
	}
	repBBS := bbsFlag("rep")
	t.Logf("bbs → auctioneers %s; auctioneers → bbs %s; reps → bbs %s", auctioneerFlag, auctioneerBBS, repBBS)
	for i, zone := range []string{"z1", "z2", "z3"} {
		cell, ip := "cell-"+zone, fmt.Sprintf("%s4%d", b.subnet, i)
		b.reps[cell], b.repIPs[cell] = b.run("rep-"+zone, ip, []string{"9090"}, append([]string{"/bin/rep",
			"--cell-id", cell, "--zone", zone, "--backend", "process",
			"--preloaded-rootfses", `{"cflinuxfs4":"/var/gavel/rootfs/cflinuxfs4"}`,
			"--memory-mb", "1024", "--disk-mb", "4096", "--containers", "20",
			"--listen", ":1800", "--advertise-address", ip + ":1800", "--cell-address", ip,
			"--bbs-address", repBBS, "--etcd-endpoints", etcd,
			"--work-dir", "/var/gavel/rep", "--lease-ttl", "3s", "--bulk-interval", "2s", "--metrics-address", ":9090"},
			tlsArgs("rep/"+cell, "--tls", "--bbs", "--etcd")...)...), ip
	}
	emitter := b.run("routeemitter", b.subnet+"50", []string{"9090"}, append([]string{"/bin/routeemitter", "-listen", ":8893",
		"-bbs-address", repBBS, "-metrics-address", ":9090"}, tlsArgs("route-emitter", "-tls", "-bbs")...)...)
	b.router = b.run("router", b.subnet+"60", []string{"8080", "8081"}, append([]string{"/bin/router", "-http", ":8080", "-admin", ":8081",
		"-routeemitter-address", b.subnet + "50:8893"}, tlsArgs("router", "-routeemitter")...)...)
	for _, c := range append(append(append([]string{emitter}, bbsNames...), auctNames...), b.reps["cell-z1"], b.reps["cell-z2"], b.reps["cell-z3"]) {
		b.metrics[c] = b.hostAddr(c, "9090")
	}
	b.metrics[b.router] = b.hostAddr(b.router, "8081")

	for _, name := range bbsNames {
		conn, err := grpcx.Dial(b.hostAddr(name, "8889"), grpcx.ClientConfig{TLS: b.certs["admin"]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		b.bbs = append(b.bbs, bbsv1.NewBBSServiceClient(conn))
	}
	var health []grpc_health_v1.HealthClient
	for _, name := range auctNames {
		conn, err := grpcx.Dial(b.hostAddr(name, "8890"), grpcx.ClientConfig{TLS: b.certs["admin"]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		health = append(health, grpc_health_v1.NewHealthClient(conn))
	}
	b.waitFor(waitLong, "an auctioneer to lead", func() (bool, string) {
		var states []string
		for _, h := range health {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := h.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "gavel.auctioneer.v1.AuctioneerService"})
			cancel()
			if err == nil && resp.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING {
				return true, ""
			}
			states = append(states, fmt.Sprint(resp.GetStatus(), err))
		}
		return false, strings.Join(states, "; ")
	})
	for i := range b.bbs {
		b.waitFor(waitLong, fmt.Sprintf("bbs-%d to list 3 cells", i), func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			resp, err := b.bbs[i].Cells(ctx, &bbsv1.CellsRequest{})
			if err != nil {
				return false, err.Error()
			}
			return len(resp.GetCells()) == 3, fmt.Sprintf("%d cells", len(resp.GetCells()))
		})
	}
}

// waitFor polls cond until it holds or timeout passes, and then fails the test.
func (b *bed) waitFor(timeout time.Duration, what string, cond func() (bool, string)) {
	b.t.Helper()
	testkit.EventuallyState(b.t, timeout, cond, what)
}

// etcdLeader is the index of the etcd member that leads, asked through the published ports.
func (b *bed) etcdLeader() int {
	b.t.Helper()
	var eps []string
	for _, h := range b.etcdHost {
		eps = append(eps, "https://"+h)
	}
	tlsCfg, err := b.certs["admin"].ClientTLS()
	if err != nil {
		b.t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: tlsCfg})
	if err != nil {
		b.t.Fatal(err)
	}
	defer cli.Close()
	leader := -1
	b.waitFor(waitLong, "an etcd leader", func() (bool, string) {
		var states []string
		for i, ep := range eps {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := cli.Status(ctx, ep)
			cancel()
			if err != nil {
				states = append(states, err.Error())
				continue
			}
			if st.Leader != 0 && st.Header.GetMemberId() == st.Leader {
				leader = i
				return true, ""
			}
		}
		return false, strings.Join(states, "; ")
	})
	return leader
}

func helloLRP(guid string, instances int32) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid,
		Domain:      "cluster",
		Rootfs:      rootfs,
		Instances:   instances,
		MemoryMb:    32,
		DiskMb:      32,
		Ports:       []uint32{8080},
		Action:      &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/hello"}}},
		CheckDefinition: &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{{
			Kind: &modelsv1.Check_Http{Http: &modelsv1.HTTPCheck{Port: 8080, Path: "/health", IntervalMs: 200}},
		}}},
	}
}

// desire desires d through the given BBS, retrying while the cluster is briefly unavailable.
func (b *bed) desire(bbs bbsv1.BBSServiceClient, d *modelsv1.DesiredLRP) {
	b.t.Helper()
	b.waitFor(waitLong, "DesireLRP "+d.GetProcessGuid(), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// instances lists guid's actual LRPs on one BBS.
func instances(bbs bbsv1.BBSServiceClient, guid string) ([]*modelsv1.ActualLRP, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}})
	return resp.GetActualLrps(), err
}

func describe(as []*modelsv1.ActualLRP) string {
	var s []string
	for _, a := range as {
		s = append(s, fmt.Sprintf("%d:%s/%s@%s%s", a.GetKey().GetIndex(),
			strings.TrimPrefix(a.GetState().String(), "STATE_"), strings.TrimPrefix(a.GetPresence().String(), "PRESENCE_"),
			a.GetInstanceKey().GetCellId(), a.GetCrashReason()+a.GetPlacementError().GetMessage()))
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}

// settled reports whether guid has exactly n instances, indices 0..n-1, each a single ordinary
// RUNNING record (no suspect or evacuating copy left).
func settled(as []*modelsv1.ActualLRP, n int) bool {
	if len(as) != n {
		return false
	}
	seen := map[int32]bool{}
	for _, a := range as {
		i := a.GetKey().GetIndex()
		if a.GetState() != modelsv1.ActualLRP_STATE_RUNNING || a.GetPresence() != modelsv1.ActualLRP_PRESENCE_ORDINARY ||
			seen[i] || i < 0 || int(i) >= n {
			return false
		}
		seen[i] = true
	}
	return true
}

// waitSettled waits until guid is settled with n instances on every BBS.
func (b *bed) waitSettled(guid string, n int) []*modelsv1.ActualLRP {
	b.t.Helper()
	var last []*modelsv1.ActualLRP
	for i, bbs := range b.bbs {
		b.waitFor(waitLong, fmt.Sprintf("%d RUNNING instances of %s on bbs-%d", n, guid, i), func() (bool, string) {
			as, err := instances(bbs, guid)
			if err != nil {
				return false, err.Error()
			}
			last = as
			return settled(as, n), describe(as)
		})
	}
	return last
}

// helloProcesses counts the sample app's processes in each rep container, seen from the host
// (docker top), so an instance left running on a cell the BBS forgot is noticed.
func (b *bed) helloProcesses() (map[string]int, int) {
	per, total := map[string]int{}, 0
	for cell, c := range b.reps {
		out, err := docker("top", c, "-o", "pid,args")
		if err != nil {
			per[cell] = -1
			continue
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "/bin/hello") {
				per[cell]++
				total++
			}
		}
	}
	return per, total
}

// waitProcesses waits until exactly n sample-app processes run across the cells.
func (b *bed) waitProcesses(n int) {
	b.t.Helper()
	b.waitFor(waitLong, fmt.Sprintf("exactly %d hello processes across the cells", n), func() (bool, string) {
		per, total := b.helloProcesses()
		return total == n, fmt.Sprint(per)
	})
}

// helloYAML is the sample app as an operator writes it for the CLI.
const helloYAML = `processGuid: hello
domain: cluster
rootfs: preloaded:cflinuxfs4
instances: 2
memoryMb: 32
diskMb: 32
ports: [8080]
routes:
  cf-router: [{"port": 8080, "routes": ["hello.cluster.test"]}]
action:
  run: {path: /bin/hello}
checkDefinition:
  checks: [{http: {port: 8080, path: /health, intervalMs: 200}}]
`

// gavel runs the CLI in a container on the private network with the admin identity.
func (b *bed) gavel(args ...string) (string, error) {
	run := []string{"run", "--rm", "--label", "gavel-test", "--network", b.network, "-v", b.pki + ":/pki:ro", b.image,
		"/bin/gavel", "--bbs", strings.Join(b.bbsAddrs, ","), "--tls-cert", "/pki/admin.crt", "--tls-key", "/pki/admin.key", "--tls-ca", "/pki/ca.crt"}
	return docker(append(run, args...)...)
}

// scrape fetches a /metrics page from the host.
func scrape(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	return string(body), err
}

// perRPCMetrics is a condition for EventuallyState: every /metrics page (service → host address,
// read with scrape)
// has a go-grpc-middleware per-RPC histogram and its patterns in want, and the pages together
// match every pattern of anywhere.
func perRPCMetrics(scrape func(addr string) (string, error), pages map[string]string, want map[string][]*regexp.Regexp, anywhere []*regexp.Regexp) func() (bool, string) {
	histogram := regexp.MustCompile(`grpc_(server|client)_(msg_recv_)?handling_seconds_bucket\{`)
	return func() (bool, string) {
		var all strings.Builder
		for s, addr := range pages {
			body, err := scrape(addr)
			if err != nil {
				return false, err.Error()
			}
			for _, re := range append([]*regexp.Regexp{histogram}, want[s]...) {
				if !re.MatchString(body) {
					return false, fmt.Sprintf("%s: no %s", s, re)
				}
			}
			all.WriteString(body)
		}
		for _, re := range anywhere {
			if !re.MatchString(all.String()) {
				return false, fmt.Sprintf("no service shows %s", re)
			}
		}
		return true, ""
	}
}

// desireFlow are the calls desiring an LRP makes, each counted by some service: the CLI's
// DesireLRP at a BBS, the BBS's auction request, the auctioneer's Perform at a rep and the
// rep's StartActualLRP.
func desireFlow() []*regexp.Regexp {
	return []*regexp.Regexp{
		handled("server", "gavel.bbs.v1.BBSService", "DesireLRP"),
		handled("server", "gavel.auctioneer.v1.AuctioneerService", "RequestLRPAuctions"),
		handled("server", "gavel.rep.v1.RepService", "Perform"),
		handled("client", "gavel.bbs.v1.BBSService", "StartActualLRP"),
	}
}

// handled matches a per-RPC latency histogram's count for one method with a non-zero value.
func handled(side, service, method string) *regexp.Regexp {
	return regexp.MustCompile(`grpc_` + side + `_handling_seconds_count\{grpc_method="` + method + `",grpc_service="` +
		regexp.QuoteMeta(service) + `",grpc_type="[a-z_]+"\} [1-9]`)
}

func TestCluster(t *testing.T) {
	b := newBed(t)
	b.start()

	t.Run("sample app desired through the CLI answers through the router; every /metrics has per-RPC histograms", func(t *testing.T) {
		b := *b
		b.t = t
		if err := os.WriteFile(filepath.Join(b.pki, "hello.yaml"), []byte(helloYAML), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := b.gavel("desire-lrp", "/pki/hello.yaml", "--wait", "--timeout", "90s")
		if err != nil {
			t.Fatalf("gavel desire-lrp --wait: %v", err)
		}
		t.Logf("gavel desire-lrp --wait:\n%s", out)
		router := b.hostAddr(b.router, "8080")
		b.waitFor(waitLong, "hello.cluster.test through the router", func() (bool, string) { return get(router, "hello.cluster.test") })
		if out, err := b.gavel("routes", "--route-emitter", b.subnet+"50:8893"); err != nil || !strings.Contains(out, "hello.cluster.test") {
			t.Fatalf("gavel routes: %v\n%s", err, out)
		}

		// Per-RPC histograms on every server and client, with real calls counted: the CLI's
		// DesireLRP at a BBS, the BBS's auction requests, the auctioneer's Perform at a rep,
		// the reps' BBS calls, the route-emitter's event stream and the router's route stream.
		want := map[string][]*regexp.Regexp{
			b.router: {regexp.MustCompile(`grpc_client_started_total\{grpc_method="WatchRoutes"[^}]*\} [1-9]`)},
		}
		b.waitFor(waitLong, "per-RPC metrics on every service", perRPCMetrics(scrape, b.metrics, want, desireFlow()))

		if out, err := b.gavel("remove-lrp", "hello"); err != nil {
			t.Fatalf("gavel remove-lrp: %v\n%s", err, out)
		}
		b.waitProcesses(0)
	})

	start := time.Now()

	const web = "web"
	b.desire(b.bbs[0], helloLRP(web, 6))
	running := b.waitSettled(web, 6)
	b.waitProcesses(6)
	t.Logf("6 instances running after %s: %s", time.Since(start).Round(time.Millisecond), describe(running))

	t.Run("partitioned cell is replaced, then rejoins", func(t *testing.T) {
		b := *b
		b.t = t
		// The cell running the most instances is cut off.
		count := map[string]int{}
		for _, a := range running {
			count[a.GetInstanceKey().GetCellId()]++
		}
		victim := "cell-z1"
		for cell, n := range count {
			if n > count[victim] || (n == count[victim] && cell < victim) {
				victim = cell
			}
		}
		lost := count[victim]
		t.Logf("disconnecting %s (%d instances)", victim, lost)
		mustDocker(t, "network", "disconnect", b.network, b.reps[victim])
		connected := false
		reconnect := func() {
			if !connected {
				connected = true
				mustDocker(t, "network", "connect", "--ip", b.repIPs[victim], b.network, b.reps[victim])
			}
		}
		defer reconnect()

		cut := time.Now()
		sawSuspect := false
		b.waitFor(waitLong, fmt.Sprintf("the %d instances of %s to run on other cells", lost, victim), func() (bool, string) {
			as, err := instances(b.bbs[0], web)
			if err != nil {
				return false, err.Error()
			}
			elsewhere := map[int32]bool{}
			for _, a := range as {
				sawSuspect = sawSuspect || a.GetPresence() == modelsv1.ActualLRP_PRESENCE_SUSPECT
				if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetInstanceKey().GetCellId() != victim {
					elsewhere[a.GetKey().GetIndex()] = true
				}
			}
			return len(elsewhere) == 6, describe(as)
		})
		t.Logf("replaced %s's instances %s after the cut (SUSPECT copies seen while waiting: %v)",
			victim, time.Since(cut).Round(time.Millisecond), sawSuspect)

		reconnect()
		back := time.Now()
		b.waitFor(waitLong, victim+" to register again", func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			resp, err := b.bbs[0].Cells(ctx, &bbsv1.CellsRequest{})
			if err != nil {
				return false, err.Error()
			}
			return len(resp.GetCells()) == 3, fmt.Sprintf("%d cells", len(resp.GetCells()))
		})
		b.waitSettled(web, 6)
		b.waitProcesses(6)
		t.Logf("settled at 6 instances and 6 processes %s after reconnecting", time.Since(back).Round(time.Millisecond))
	})

	t.Run("etcd leader lost, nothing acknowledged lost", func(t *testing.T) {
		b := *b
		b.t = t
		victim := b.etcd[b.etcdLeader()]
		t.Logf("killing %s, the etcd leader", victim)
		mustDocker(t, "kill", victim)
		killed := time.Now()

		const api = "api"
		b.desire(b.bbs[1], helloLRP(api, 3))
		t.Logf("DesireLRP %s acknowledged %s after the kill", api, time.Since(killed).Round(time.Millisecond))
		b.waitSettled(api, 3)

		want := map[string]int{web: 6, api: 3}
		for i, bbs := range b.bbs {
			b.waitFor(waitLong, fmt.Sprintf("bbs-%d to list every desired LRP", i), func() (bool, string) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				resp, err := bbs.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
				if err != nil {
					return false, err.Error()
				}
				got := map[string]int{}
				for _, d := range resp.GetDesiredLrps() {
					got[d.GetProcessGuid()] = int(d.GetInstances())
				}
				return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
			})
		}
		for guid, n := range want {
			b.waitSettled(guid, n)
		}
		b.waitProcesses(9)
	})
}
