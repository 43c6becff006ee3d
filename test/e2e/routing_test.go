package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// routing is a route-emitter and a router, built binaries, in front of a cluster. The
// route-emitter reads the BBS in plaintext (the cluster's BBS is insecure); the router and the
// test talk to the route-emitter over mutual TLS.
type routing struct {
	emitter   routeemitterv1.RouteEmitterServiceClient
	httpAddr  string
	httpsAddr string
	caPool    *x509.CertPool
	plain     *http.Client // to the router's HTTP listener; redirects are not followed
	secure    *http.Client // to the router's TLS listener
}

func startRouting(t *testing.T, c *cluster) *routing {
	t.Helper()
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "route-emitter", "router", "router-https", "read-only")
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(pki["read-only"].CAFile)
	if err != nil {
		t.Fatal(err)
	}
	r := &routing{httpAddr: testkit.ReservedAddr(t), httpsAddr: testkit.ReservedAddr(t), caPool: x509.NewCertPool()}
	if !r.caPool.AppendCertsFromPEM(caPEM) {
		t.Fatal("dev CA: no certificate")
	}
	emitterAddr, adminAddr := testkit.ReservedAddr(t), testkit.ReservedAddr(t)
	c.procs = append(c.procs,
		startProc(t, "route-emitter", binary(t, "routeemitter"), "-listen", emitterAddr,
			"-tls-cert", pki["route-emitter"].CertFile, "-tls-key", pki["route-emitter"].KeyFile,
			"-tls-ca", pki["route-emitter"].CAFile, "-bbs-address", c.bbsAddr, "-bbs-insecure"),
		startProc(t, "router", binary(t, "router"), "-http", r.httpAddr, "-https", r.httpsAddr,
			"-https-cert", pki["router-https"].CertFile, "-https-key", pki["router-https"].KeyFile,
			"-admin", adminAddr, "-tcp-bind", "127.0.0.1", "-routeemitter-address", emitterAddr,
			"-routeemitter-cert", pki["router"].CertFile, "-routeemitter-key", pki["router"].KeyFile,
			"-routeemitter-ca", pki["router"].CAFile))
	conn, err := grpcx.Dial(emitterAddr, grpcx.ClientConfig{TLS: pki["read-only"]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.emitter = routeemitterv1.NewRouteEmitterServiceClient(conn)

	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	r.plain = &http.Client{Timeout: 3 * time.Second, CheckRedirect: noRedirect}
	// The router's certificate is a dev PKI leaf, valid for localhost and 127.0.0.1 only, so
	// the client sends the route's hostname as SNI (the transport sets ServerName from the URL
	// host, here the route's hostname) and checks the chain against the dev CA and the name
	// the certificate carries.
	r.secure = &http.Client{Timeout: 3 * time.Second, CheckRedirect: noRedirect, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, r.httpsAddr)
		},
		TLSClientConfig: &tls.Config{
			InsecureSkipVerify: true, // replaced by VerifyConnection
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("no server certificate")
				}
				inter := x509.NewCertPool()
				for _, cert := range cs.PeerCertificates[1:] {
					inter.AddCert(cert)
				}
				_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
					Roots: r.caPool, Intermediates: inter, DNSName: "127.0.0.1",
				})
				return err
			},
		},
	}}
	t.Cleanup(r.plain.CloseIdleConnections)
	t.Cleanup(r.secure.CloseIdleConnections)
	return r
}

// table is the route-emitter's RoutingTable keyed "http:<hostname>", "tcp:<port>", "udp:<port>".
func (r *routing) table(t *testing.T) (map[string]*routeemitterv1.Route, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := r.emitter.RoutingTable(ctx, &routeemitterv1.RoutingTableRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]*routeemitterv1.Route{}
	for _, rt := range resp.GetRoutes() {
		out[routeKey(rt)] = rt
	}
	return out, nil
}

func routeKey(rt *routeemitterv1.Route) string {
	switch rt.GetProtocol() {
	case routeemitterv1.Route_PROTOCOL_TCP:
		return fmt.Sprintf("tcp:%d", rt.GetIncomingPort())
	case routeemitterv1.Route_PROTOCOL_UDP:
		return fmt.Sprintf("udp:%d", rt.GetIncomingPort())
	}
	return "http:" + rt.GetHostname()
}

// indexes lists the instance indexes of a route's endpoints.
func indexes(rt *routeemitterv1.Route) []int32 {
	var out []int32
	for _, e := range rt.GetEndpoints() {
		out = append(out, e.GetIndex())
	}
	slices.Sort(out)
	return out
}

var routedRE = regexp.MustCompile(`^hello from instance (\d+) \(guid ([^,]+), pid (\d+)\) on container port (\d+), host (\S+), path (\S+)`)

// answer is a response through the router; when it came from the sample app, app holds who
// answered.
type answer struct {
	status   int
	body     string
	location string
	app      *routed
}

// routed is what an instance of the sample app answered through the router.
type routed struct {
	hello
	containerPort int
	host          string
}

// get sends GET path to the router with the given Host, over TLS when secure.
func (r *routing) get(host, path string, secure bool) (answer, error) {
	client, url := r.plain, "http://"+r.httpAddr+path
	if secure {
		// The URL names the route's hostname, so the Host header and SNI are both it; the
		// transport dials the router's TLS listener whatever the URL says.
		client, url = r.secure, "https://"+host+path
	}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return answer{}, err
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, body: string(body), location: resp.Header.Get("Location")}
	if m := routedRE.FindStringSubmatch(a.body); m != nil && a.status == http.StatusOK {
		index, _ := strconv.Atoi(m[1])
		pid, _ := strconv.Atoi(m[3])
		port, _ := strconv.Atoi(m[4])
		a.app = &routed{hello: hello{index: int32(index), guid: m[2], pid: pid}, containerPort: port, host: m[5]}
	}
	return a, nil
}

// mustApp sends GET / with host and fails unless one of the app's instances answered on
// containerPort and saw the Host unchanged.
func (r *routing) mustApp(t *testing.T, host string, secure bool, containerPort int) routed {
	t.Helper()
	a, err := r.get(host, "/", secure)
	if err != nil {
		t.Fatalf("GET %s (secure %v): %v", host, secure, err)
	}
	if a.app == nil {
		t.Fatalf("GET %s (secure %v): %d %q, want the app's answer", host, secure, a.status, a.body)
	}
	if a.app.containerPort != containerPort || a.app.host != host {
		t.Fatalf("GET %s (secure %v) answered on container port %d for host %q, want port %d for %q",
			host, secure, a.app.containerPort, a.app.host, containerPort, host)
	}
	return *a.app
}

func tcpEcho(addr, msg string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(conn, msg); err != nil {
		return "", err
	}
	// Half-close: the router passes the EOF on and the echo can still answer.
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return "", err
	}
	got, err := io.ReadAll(conn)
	return string(got), err
}

func udpEcho(addr, msg string) (string, error) {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := io.WriteString(conn, msg); err != nil {
		return "", err
	}
	buf := make([]byte, 1024)
	n, err := conn.Read(buf)
	return string(buf[:n]), err
}

const (
	webRoutes = `[{"port":8080,"routes":["foo.example.com","bar.example.com"]},` +
		`{"port":9090,"routes":["admin.foo.example.com"],"route_to_instances":true}]`
	webRoutesUpdated = `[{"port":8080,"routes":["foo.example.com","baz.example.com"]},` +
		`{"port":9090,"routes":["admin.foo.example.com"],"route_to_instances":true}]`
	// skydns is another provider's document: the BBS keeps it byte for byte.
	skydns = "[ {\"port\" :9090 ,\n\t\t\"host\":\"admin-api.service.skydns.local\",\r\n   \"priority\":  20}\t]  \n\n"
)

// TestRoutingThroughRouter runs the cluster with a route-emitter and a router, all built
// binaries, and routes HTTP(S), TCP and UDP traffic to real instances of the sample app.
func TestRoutingThroughRouter(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the process backend needs Linux")
	}
	c := startCluster(t)
	tcpPort, udpPort := testkit.ReservedPort(t), testkit.ReservedPort(t)
	tcpIn, udpIn := fmt.Sprintf("127.0.0.1:%d", tcpPort), fmt.Sprintf("127.0.0.1:%d", udpPort)

	// Three LRPs, desired together so they start together: a web app with two routed ports
	// (and a skydns entry), an ssl-only one, and TCP and UDP echoes.
	const web, secure, echo = "e2e-web", "e2e-secure", "e2e-echo"
	d := helloLRP(web, "preloaded:cflinuxfs4", c.hello, 3, nil)
	d.Ports = []uint32{8080, 9090}
	d.Routes = map[string][]byte{"cf-router": []byte(webRoutes), "skydns": []byte(skydns)}
	c.desire(t, d)
	d = helloLRP(secure, "preloaded:cflinuxfs4", c.hello, 1, nil)
	d.Routes = map[string][]byte{"cf-router": []byte(`[{"port":8080,"routes":["secure.example.com"],"ssl":true}]`)}
	c.desire(t, d)
	d = helloLRP(echo, "preloaded:cflinuxfs4", c.hello, 1, nil)
	d.Ports = []uint32{8080, 7000, 7001}
	d.Env = []*modelsv1.EnvironmentVariable{{Name: "TCP_ECHO_PORTS", Value: "7000"}, {Name: "UDP_ECHO_PORTS", Value: "7001"}}
	d.Routes = map[string][]byte{"cf-router": fmt.Appendf(nil,
		`[{"port":7000,"protocol":"tcp","incoming_port":%d},{"port":7001,"protocol":"udp","incoming_port":%d}]`, tcpPort, udpPort)}
	c.desire(t, d)

	r := startRouting(t, c)
	c.waitRunning(t, web, 3, 20*time.Second)
	c.waitRunning(t, secure, 1, 20*time.Second)
	c.waitRunning(t, echo, 1, 20*time.Second)
	c.waitFor(t, 10*time.Second, "the route-emitter's table", func() (bool, string) {
		tbl, err := r.table(t)
		if err != nil {
			return false, err.Error()
		}
		want := map[string]int{
			"http:foo.example.com": 3, "http:bar.example.com": 3, "http:admin.foo.example.com": 3,
			"http:0.admin.foo.example.com": 1, "http:1.admin.foo.example.com": 1, "http:2.admin.foo.example.com": 1,
			"http:secure.example.com": 1, fmt.Sprintf("tcp:%d", tcpPort): 1, fmt.Sprintf("udp:%d", udpPort): 1,
		}
		var got []string
		ok := len(tbl) == len(want)
		for k, rt := range tbl {
			got = append(got, fmt.Sprintf("%s=%d", k, len(rt.GetEndpoints())))
			ok = ok && want[k] == len(rt.GetEndpoints())
		}
		slices.Sort(got)
		return ok, strings.Join(got, " ")
	})
	if tbl, _ := r.table(t); !tbl["http:secure.example.com"].GetTlsOnly() || tbl["http:foo.example.com"].GetTlsOnly() {
		t.Errorf("tls_only: secure %v, foo %v; want true, false",
			tbl["http:secure.example.com"].GetTlsOnly(), tbl["http:foo.example.com"].GetTlsOnly())
	}
	// The router gets the table over its stream: wait until it serves every web instance.
	c.waitFor(t, 10*time.Second, "the router to reach the three web instances", func() (bool, string) {
		seen := map[int32]bool{}
		for range 3 {
			a, err := r.get("foo.example.com", "/", false)
			if err != nil {
				return false, err.Error()
			}
			if a.app == nil {
				return false, fmt.Sprintf("%d %q", a.status, a.body)
			}
			seen[a.app.index] = true
		}
		return len(seen) == 3, fmt.Sprintf("indexes %v", seen)
	})

	pids := map[int32]int{} // web index → pid, from the answers through the router
	if !t.Run("hostnames reach their ports", func(t *testing.T) {
		for _, host := range []string{"foo.example.com", "bar.example.com"} {
			count := map[int32]int{}
			for range 9 {
				h := r.mustApp(t, host, false, 8080)
				count[h.index]++
				pids[h.index] = h.pid
			}
			// Round-robin over three endpoints: each instance answers every third request.
			if count[0] != 3 || count[1] != 3 || count[2] != 3 {
				t.Errorf("%s: answers per index %v, want 3 each", host, count)
			}
		}
		count := map[int32]int{}
		for range 9 {
			h := r.mustApp(t, "admin.foo.example.com", false, 9090)
			count[h.index]++
			if pids[h.index] != h.pid {
				t.Errorf("admin.foo.example.com: index %d answered from pid %d, port 8080 from %d", h.index, h.pid, pids[h.index])
			}
		}
		if count[0] != 3 || count[1] != 3 || count[2] != 3 {
			t.Errorf("admin.foo.example.com: answers per index %v, want 3 each", count)
		}
		for i := range int32(3) {
			host := fmt.Sprintf("%d.admin.foo.example.com", i)
			for range 5 {
				if h := r.mustApp(t, host, false, 9090); h.index != i {
					t.Fatalf("%s answered from index %d", host, h.index)
				}
			}
		}
		// Only the 9090 entry routes to instances; unknown hosts are 404.
		for _, host := range []string{"0.foo.example.com", "3.admin.foo.example.com", "nope.example.com"} {
			if a, err := r.get(host, "/", false); err != nil || a.status != http.StatusNotFound {
				t.Errorf("GET %s: %d %q %v, want 404", host, a.status, a.body, err)
			}
		}
	}) {
		return
	}

	t.Run("ssl-only route answers over TLS and redirects plain HTTP", func(t *testing.T) {
		h := r.mustApp(t, "secure.example.com", true, 8080)
		if h.index != 0 {
			t.Errorf("secure.example.com answered from index %d", h.index)
		}
		_, httpsPort, _ := net.SplitHostPort(r.httpsAddr)
		a, err := r.get("secure.example.com", "/some/path?q=1", false)
		want := "https://secure.example.com:" + httpsPort + "/some/path?q=1"
		if err != nil || a.status != http.StatusMovedPermanently || a.location != want {
			t.Errorf("plain GET secure.example.com: %d Location %q %v, want 301 to %s", a.status, a.location, err, want)
		}
		// The TLS listener serves the other routes too.
		r.mustApp(t, "foo.example.com", true, 8080)
	})

	t.Run("tcp and udp echo through incoming ports", func(t *testing.T) {
		// The router opens the ports when the routes reach it.
		c.waitFor(t, 10*time.Second, "a TCP echo through "+tcpIn, func() (bool, string) {
			got, err := tcpEcho(tcpIn, "ping over tcp")
			return err == nil && got == "ping over tcp", fmt.Sprintf("%q %v", got, err)
		})
		c.waitFor(t, 10*time.Second, "a UDP echo through "+udpIn, func() (bool, string) {
			got, err := udpEcho(udpIn, "ping over udp")
			return err == nil && got == "ping over udp", fmt.Sprintf("%q %v", got, err)
		})
		for i := range 3 {
			msg := fmt.Sprintf("again %d", i)
			if got, err := tcpEcho(tcpIn, msg); err != nil || got != msg {
				t.Errorf("tcp echo %q: %q %v", msg, got, err)
			}
			if got, err := udpEcho(udpIn, msg); err != nil || got != msg {
				t.Errorf("udp echo %q: %q %v", msg, got, err)
			}
		}
	})

	checkSkydns := func(t *testing.T) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.bbs.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: web})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetDesiredLrp().GetRoutes()["skydns"]; !bytes.Equal(got, []byte(skydns)) {
			t.Errorf("skydns routes: got %q, want %q byte for byte", got, skydns)
		}
	}
	t.Run("skydns entry kept byte for byte", checkSkydns)

	if !t.Run("routes update applies without restarting", func(t *testing.T) {
		before := map[int32]string{}
		for _, a := range c.actualLRPs(t, web) {
			before[a.GetKey().GetIndex()] = a.GetInstanceKey().GetInstanceGuid()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.bbs.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: web, Update: &modelsv1.DesiredLRPUpdate{
			Routes: &modelsv1.RoutesUpdate{Routes: map[string][]byte{"cf-router": []byte(webRoutesUpdated), "skydns": []byte(skydns)}},
		}})
		if err != nil {
			t.Fatalf("UpdateDesiredLRP: %v", err)
		}
		c.waitFor(t, 10*time.Second, "bar.example.com to go and baz.example.com to come", func() (bool, string) {
			bar, err1 := r.get("bar.example.com", "/", false)
			baz, err2 := r.get("baz.example.com", "/", false)
			return err1 == nil && err2 == nil && bar.status == http.StatusNotFound && baz.app != nil,
				fmt.Sprintf("bar %d %v, baz %d %v", bar.status, err1, baz.status, err2)
		})
		for range 6 {
			for _, host := range []string{"foo.example.com", "baz.example.com"} {
				if h := r.mustApp(t, host, false, 8080); pids[h.index] != h.pid {
					t.Errorf("%s: index %d answered from pid %d, before the update %d", host, h.index, h.pid, pids[h.index])
				}
			}
		}
		if a, err := r.get("bar.example.com", "/", false); err != nil || a.status != http.StatusNotFound {
			t.Errorf("GET bar.example.com after the update: %d %q %v, want 404", a.status, a.body, err)
		}
		for _, a := range c.actualLRPs(t, web) {
			i := a.GetKey().GetIndex()
			if a.GetInstanceKey().GetInstanceGuid() != before[i] || a.GetCrashCount() != 0 || a.GetState() != modelsv1.ActualLRP_STATE_RUNNING {
				t.Errorf("instance %d after the update: %s guid %s crash_count %d, before guid %s",
					i, a.GetState(), a.GetInstanceKey().GetInstanceGuid(), a.GetCrashCount(), before[i])
			}
		}
		checkSkydns(t)
	}) {
		return
	}

	t.Run("crashed instance leaves the table and comes back", func(t *testing.T) {
		victim := r.mustApp(t, "1.admin.foo.example.com", false, 9090)
		// Watch every version of the table from now on: the restart is immediate, so the gap
		// may be shorter than a poll of RoutingTable.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stream, err := r.emitter.WatchRoutes(ctx, &routeemitterv1.WatchRoutesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		routes := map[string]*routeemitterv1.Route{}
		var version uint64
		recv := func() {
			t.Helper()
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("WatchRoutes: %v", err)
			}
			version = msg.GetVersion()
			if msg.GetSnapshot() {
				clear(routes)
			}
			for _, rt := range msg.GetRemovals() {
				delete(routes, routeKey(rt))
			}
			for _, rt := range msg.GetUpserts() {
				routes[routeKey(rt)] = rt
			}
		}
		recv() // the snapshot
		if got := indexes(routes["http:foo.example.com"]); !slices.Equal(got, []int32{0, 1, 2}) {
			t.Fatalf("foo.example.com endpoints %v before the kill", got)
		}
		if err := syscall.Kill(victim.pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill instance 1 (pid %d): %v", victim.pid, err)
		}
		for !slices.Equal(indexes(routes["http:foo.example.com"]), []int32{0, 2}) {
			recv()
		}
		// RoutingTable at that version shows the same (the restart may already be published:
		// then the version is later and the comparison is skipped).
		if resp, err := r.emitter.RoutingTable(ctx, &routeemitterv1.RoutingTableRequest{}); err != nil {
			t.Errorf("RoutingTable: %v", err)
		} else if resp.GetVersion() == version {
			for _, rt := range resp.GetRoutes() {
				if rt.GetHostname() == "foo.example.com" && !slices.Equal(indexes(rt), []int32{0, 2}) {
					t.Errorf("RoutingTable version %d: foo.example.com endpoints %v, want [0 2]", version, indexes(rt))
				}
			}
		} else {
			t.Logf("RoutingTable already at version %d (the loss was version %d)", resp.GetVersion(), version)
		}
		if _, ok := routes["http:1.admin.foo.example.com"]; ok {
			t.Errorf("1.admin.foo.example.com still routed without its endpoint: %v", routes["http:1.admin.foo.example.com"])
		}
		if got := indexes(routes["http:admin.foo.example.com"]); !slices.Equal(got, []int32{0, 2}) {
			t.Errorf("admin.foo.example.com endpoints %v while instance 1 is down, want [0 2]", got)
		}
		for !slices.Equal(indexes(routes["http:foo.example.com"]), []int32{0, 1, 2}) ||
			!slices.Equal(indexes(routes["http:1.admin.foo.example.com"]), []int32{1}) {
			recv()
		}
		// RoutingTable agrees once the route-emitter has published the restart, and the router
		// reaches the new process.
		tbl, err := r.table(t)
		if err != nil {
			t.Fatal(err)
		}
		if got := indexes(tbl["http:foo.example.com"]); !slices.Equal(got, []int32{0, 1, 2}) {
			t.Errorf("RoutingTable foo.example.com endpoints %v after the restart", got)
		}
		c.waitFor(t, 5*time.Second, "the router to reach the restarted instance", func() (bool, string) {
			a, err := r.get("1.admin.foo.example.com", "/", false)
			if err != nil || a.app == nil {
				return false, fmt.Sprintf("%d %q %v", a.status, a.body, err)
			}
			return a.app.index == 1 && a.app.pid != victim.pid, fmt.Sprintf("%+v", *a.app)
		})
	})
}
