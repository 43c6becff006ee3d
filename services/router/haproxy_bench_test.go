package router

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// The load of BenchmarkRouterVsHAProxy, as issue 23 measured it: wrk with this many
// connections for this long per path, the paths interleaved, this many rounds, over this many
// instances of the sample app, for this Host.
const (
	vsConnections = 32
	vsDuration    = 8 * time.Second
	vsRounds      = 3
	vsInstances   = 3
	vsHost        = "hello.gavel.local"
	vsManyRoutes  = 1_000
)

// BenchmarkRouterVsHAProxy is `make bench-router`: the sample app (examples/hello) runs as
// vsInstances processes on loopback, and wrk loads, in turn and for vsRounds interleaved
// rounds, one instance directly, HAProxy (http mode, round-robin by Host over the instances)
// and the router (a route over the same instances, fed over WatchRoutes), each over plain
// HTTP, over TLS, and with vsManyRoutes routes in the table. It prints req/s, p50 and p99 per
// path (median and range over the rounds) and the router's ratios to HAProxy in the same
// round. Every process is bound to 127.0.0.1 and killed at the end. It skips (a failure under
// CI=true) without haproxy or wrk. Run with -benchtime 1x; -cpuprofile profiles the router,
// which runs in the benchmark's process.
func BenchmarkRouterVsHAProxy(b *testing.B) {
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		testkit.SkipWithoutTool(b, "bench-router needs haproxy (apt-get install haproxy)")
	}
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		testkit.SkipWithoutTool(b, "bench-router needs wrk (apt-get install wrk)")
	}
	dir := b.TempDir()
	root, err := filepath.Abs("../..")
	if err != nil {
		b.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "hello"), "./examples/hello")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the sample app: %v\n%s", err, out)
	}

	// The instances.
	instances := make([]string, vsInstances)
	for i := range instances {
		port := testkit.ReservedPort(b)
		instances[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		_ = startProcess(b, filepath.Join(dir, "hello"), nil, "PORT="+strconv.Itoa(port), "INSTANCE_INDEX="+strconv.Itoa(i),
			fmt.Sprintf("INSTANCE_GUID=bench-%d", i))
	}

	// The routers: one route, served on HTTP and HTTPS; and one of vsManyRoutes routes.
	pki, err := tlsx.GenerateDevPKI(filepath.Join(dir, "pki"), "router")
	if err != nil {
		b.Fatal(err)
	}
	fake := startFake(b, "127.0.0.1:0", "bench", httpRoute(vsHost, false, instances...))
	cfg := testConfig(fake.addr)
	cfg.HTTPSAddress = "127.0.0.1:0"
	cfg.HTTPSCertFile, cfg.HTTPSKeyFile = pki["router"].CertFile, pki["router"].KeyFile
	one := startRouter(b, cfg)
	waitSynced(b, one)
	many := make([]*routeemitterv1.Route, 0, vsManyRoutes)
	many = append(many, httpRoute(vsHost, false, instances...))
	for i := 1; i < vsManyRoutes; i++ {
		many = append(many, httpRoute(fmt.Sprintf("app-%d.gavel.local", i), false, instances...))
	}
	fakeMany := startFake(b, "127.0.0.1:0", "bench-many", many...)
	manyRouter := startRouter(b, testConfig(fakeMany.addr))
	waitSynced(b, manyRouter)

	// HAProxy: the same three paths.
	hp := startHAProxy(b, haproxy, dir, pki["router"], instances)

	haproxyCPU := func() time.Duration { return processCPU(b, hp.pid) }
	routerCPU := func() time.Duration { return processCPU(b, os.Getpid()) }
	paths := []struct {
		name, url string
		cpu       func() time.Duration // the proxy's CPU time so far; nil for the direct path
	}{
		{"one instance directly", "http://" + instances[0] + "/", nil},
		{"HAProxy, http", "http://" + hp.http + "/", haproxyCPU},
		{"router, http", httpBase(one) + "/", routerCPU},
		{"HAProxy, https", "https://" + hp.https + "/", haproxyCPU},
		{"router, https", "https://" + one.HTTPSAddr().String() + "/", routerCPU},
		{fmt.Sprintf("HAProxy, http, %d routes", vsManyRoutes), "http://" + hp.many + "/", haproxyCPU},
		{fmt.Sprintf("router, http, %d routes", vsManyRoutes), httpBase(manyRouter) + "/", routerCPU},
	}
	client := caClient(b, pki["router"])
	for _, p := range paths { // every path answers before the clock starts
		waitOK(b, client, p.url)
	}
	client.CloseIdleConnections()
	loadBefore := loadAverage()
	results := make([][]wrkResult, len(paths))
	b.ResetTimer()
	for range b.N {
		for round := range vsRounds {
			for i, p := range paths {
				var cpu0 time.Duration
				if p.cpu != nil {
					cpu0 = p.cpu()
				}
				r := runWrk(b, wrk, p.url)
				if p.cpu != nil && r.requests > 0 {
					r.cpuPerReq = (p.cpu() - cpu0) / time.Duration(r.requests)
				}
				b.Logf("round %d, %s: %.0f req/s, p50 %v, p99 %v, proxy CPU %v/request", round+1, p.name, r.rps, r.p50, r.p99, r.cpuPerReq)
				results[i] = append(results[i], r)
			}
		}
	}
	b.StopTimer()
	loadAfter := loadAverage()

	var out bytes.Buffer
	fmt.Fprintf(&out, "\nbench-router: %d connections, %v per path, %d interleaved rounds, Host %s, %d instances of examples/hello\n",
		vsConnections, vsDuration, len(results[0]), vsHost, vsInstances)
	fmt.Fprintf(&out, "load average before: %s; after: %s\n\n", loadBefore, loadAfter)
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "path\treq/s median [range]\tp50 median [range]\tp99 median [range]\tproxy CPU µs/request\terrors")
	failed := 0
	for i, p := range paths {
		rs := results[i]
		errs := 0
		for _, r := range rs {
			errs += r.errors
		}
		failed += errs
		cpu := "-"
		if p.cpu != nil {
			cpu = spread(rs, func(r wrkResult) float64 { return float64(r.cpuPerReq) / 1e3 },
				func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) })
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", p.name,
			spread(rs, func(r wrkResult) float64 { return r.rps }, func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }),
			spread(rs, func(r wrkResult) float64 { return float64(r.p50) }, fmtDur),
			spread(rs, func(r wrkResult) float64 { return float64(r.p99) }, fmtDur), cpu, errs)
	}
	tw.Flush()
	fmt.Fprintln(&out, "\nrouter ÷ HAProxy, per round (median [range]); goal: req/s ≥ 0.9, p99 ≤ 1.2")
	tw = tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "pair\treq/s ratio\tp99 ratio\tCPU/request ratio")
	for _, pair := range [][2]int{{1, 2}, {3, 4}, {5, 6}} {
		h, r := results[pair[0]], results[pair[1]]
		rps := make([]wrkResult, len(h))
		p99 := make([]wrkResult, len(h))
		cpu := make([]wrkResult, len(h))
		for k := range h {
			rps[k].rps = r[k].rps / h[k].rps
			p99[k].rps = float64(r[k].p99) / float64(h[k].p99)
			cpu[k].rps = float64(r[k].cpuPerReq) / float64(max(h[k].cpuPerReq, 1))
		}
		ratio := func(r wrkResult) float64 { return r.rps }
		two := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", strings.TrimPrefix(paths[pair[1]].name, "router, "),
			spread(rps, ratio, two), spread(p99, ratio, two), spread(cpu, ratio, two))
		if pair[0] == 1 {
			b.ReportMetric(median(rps, ratio), "http-rps-ratio")
			b.ReportMetric(median(p99, ratio), "http-p99-ratio")
			b.ReportMetric(median(cpu, ratio), "http-cpu-per-request-ratio")
		}
	}
	tw.Flush()
	fmt.Print(out.String())
	b.ReportMetric(0, "ns/op")
	if failed > 0 {
		b.Fatalf("%d requests failed (non-2xx/3xx answers or socket errors)", failed)
	}
}

// wrkResult is one wrk run's throughput, latency percentiles and failures.
type wrkResult struct {
	rps       float64
	requests  int
	p50, p99  time.Duration
	errors    int           // non-2xx/3xx answers plus socket errors
	cpuPerReq time.Duration // the proxy process's CPU time (user and system) per request
}

// The parts of wrk's report that runWrk reads.
var (
	wrkPercentile = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$`)
	wrkRPS        = regexp.MustCompile(`(?m)^Requests/sec:\s+([\d.]+)`)
	wrkRequests   = regexp.MustCompile(`(?m)^\s+(\d+) requests in `)
	wrkNon2xx     = regexp.MustCompile(`(?m)^\s+Non-2xx or 3xx responses:\s+(\d+)`)
	wrkSocket     = regexp.MustCompile(`(?m)^\s+Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// runWrk loads url with wrk (vsConnections connections, 2 threads, vsDuration, Host vsHost).
func runWrk(b *testing.B, wrk, url string) wrkResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), vsDuration+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, wrk, "-t", "2", "-c", strconv.Itoa(vsConnections),
		"-d", strconv.Itoa(int(vsDuration/time.Second))+"s", "--latency", "-H", "Host: "+vsHost, url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("wrk %s: %v\n%s", url, err, out)
	}
	var r wrkResult
	m := wrkRPS.FindSubmatch(out)
	if m == nil {
		b.Fatalf("wrk %s: no Requests/sec in\n%s", url, out)
	}
	r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	if m := wrkRequests.FindSubmatch(out); m != nil {
		r.requests, _ = strconv.Atoi(string(m[1]))
	}
	for _, m := range wrkPercentile.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(m[2]), 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[string(m[3])]
		d := time.Duration(math.Round(v * float64(unit)))
		if string(m[1]) == "50" {
			r.p50 = d
		} else {
			r.p99 = d
		}
	}
	if r.p50 == 0 || r.p99 == 0 {
		b.Fatalf("wrk %s: no latency distribution in\n%s", url, out)
	}
	if m := wrkNon2xx.FindSubmatch(out); m != nil {
		n, _ := strconv.Atoi(string(m[1]))
		r.errors += n
	}
	if m := wrkSocket.FindSubmatch(out); m != nil {
		for _, s := range m[1:] {
			n, _ := strconv.Atoi(string(s))
			r.errors += n
		}
	}
	return r
}

// haproxyAddrs are the frontends of the benchmark's HAProxy.
type haproxyAddrs struct {
	http, https, many string
	pid               int
}

// startHAProxy runs HAProxy until the benchmark ends, with a config in dir: a frontend on
// plain HTTP and one on TLS (the router's certificate) that send Host vsHost round-robin to
// instances, and a frontend that picks one of vsManyRoutes backends by Host from a map. Like
// the router it sets X-Forwarded-For and X-Forwarded-Proto and keeps connections to the
// instances alive.
func startHAProxy(b *testing.B, haproxy, dir string, cert tlsx.Config, instances []string) haproxyAddrs {
	b.Helper()
	a := haproxyAddrs{http: testkit.ReservedAddr(b), https: testkit.ReservedAddr(b), many: testkit.ReservedAddr(b)}
	var pem []byte
	for _, f := range []string{cert.CertFile, cert.KeyFile} {
		p, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		pem = append(pem, p...)
	}
	pemFile := filepath.Join(dir, "haproxy.pem")
	if err := os.WriteFile(pemFile, pem, 0o600); err != nil {
		b.Fatal(err)
	}
	servers := func(cfg *strings.Builder) {
		cfg.WriteString("    balance roundrobin\n")
		for i, in := range instances {
			fmt.Fprintf(cfg, "    server i%d %s\n", i, in)
		}
	}
	var cfg, hosts strings.Builder
	fmt.Fprintf(&cfg, `global
    maxconn 4096
defaults
    mode http
    option forwardfor
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend http
    bind %s
    bind %s ssl crt %s
    http-request set-header X-Forwarded-Proto https if { ssl_fc }
    http-request set-header X-Forwarded-Proto http if !{ ssl_fc }
    use_backend hello if { req.hdr(host),field(1,:),lower -m str %s }
frontend many
    bind %s
    http-request set-header X-Forwarded-Proto http
    use_backend %%[req.hdr(host),field(1,:),lower,map(%s)]
backend hello
`, a.http, a.https, pemFile, vsHost, a.many, filepath.Join(dir, "hosts.map"))
	servers(&cfg)
	fmt.Fprintf(&hosts, "%s hello\n", vsHost)
	for i := 1; i < vsManyRoutes; i++ {
		fmt.Fprintf(&cfg, "backend app-%d\n", i)
		servers(&cfg)
		fmt.Fprintf(&hosts, "app-%d.gavel.local app-%d\n", i, i)
	}
	cfgFile := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.map"), []byte(hosts.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	a.pid = startProcess(b, haproxy, []string{"-db", "-f", cfgFile})
	return a
}

// startProcess runs path with args and returns its pid and env added to the benchmark's environment until the
// benchmark ends, then kills it and waits for it.
func startProcess(b *testing.B, path string, args []string, env ...string) int {
	b.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", path, err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if b.Failed() && stderr.Len() > 0 {
			b.Logf("%s: %s", filepath.Base(path), stderr.String())
		}
	})
	return cmd.Process.Pid
}

// waitOK waits until a GET of url with Host vsHost through client answers 200.
func waitOK(b *testing.B, client *http.Client, url string) {
	b.Helper()
	var last string
	ok := func() bool {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			b.Fatal(err)
		}
		req.Host = vsHost
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK
	}
	testkit.Eventually(b, 20*time.Second, ok, fmt.Sprintf("%s answers 200 (last: %s)", url, last))
}

// caClient is an HTTP client that trusts the CA of cert.
func caClient(b *testing.B, cert tlsx.Config) *http.Client {
	b.Helper()
	caPEM, err := os.ReadFile(cert.CAFile)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// loadAverage is the 1-, 5- and 15-minute load averages, as uptime prints them.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}

// processCPU is the user plus system CPU time process pid has used (testkit.ProcessCPU).
func processCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	d, err := testkit.ProcessCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// median is the median of f over rs.
func median(rs []wrkResult, f func(wrkResult) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// spread formats the median of f over rs with its range, "m [lo–hi]".
func spread(rs []wrkResult, f func(wrkResult) float64, format func(float64) string) string {
	lo, hi := f(rs[0]), f(rs[0])
	for _, r := range rs {
		lo, hi = min(lo, f(r)), max(hi, f(r))
	}
	return fmt.Sprintf("%s [%s–%s]", format(median(rs, f)), format(lo), format(hi))
}

// fmtDur formats nanoseconds as milliseconds with two decimals.
func fmtDur(ns float64) string { return strconv.FormatFloat(ns/1e6, 'f', 2, 64) + " ms" }
