package router

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
)

// fakeEmitter is a RouteEmitterService serving a table the test controls, over real gRPC on
// loopback. It resumes a watcher whose table_id matches from its delta history, and sends a
// snapshot otherwise.
type fakeEmitter struct {
	routeemitterv1.UnimplementedRouteEmitterServiceServer

	addr string
	srv  *grpc.Server

	mu       sync.Mutex
	id       string
	version  uint64
	routes   map[string]*routeemitterv1.Route
	history  []*routeemitterv1.WatchRoutesResponse
	subs     map[*fakeSub]struct{}
	requests []*routeemitterv1.WatchRoutesRequest
	sent     []bool // per WatchRoutes call: whether it began with a snapshot
}

// fakeSub is one open WatchRoutes stream.
type fakeSub struct {
	ch   chan *routeemitterv1.WatchRoutesResponse
	kill chan struct{}
}

var _ routeemitterv1.RouteEmitterServiceServer = (*fakeEmitter)(nil)

// startFake serves a fake table id on addr ("127.0.0.1:0" for any port) until the test ends.
func startFake(t testing.TB, addr, id string, routes ...*routeemitterv1.Route) *fakeEmitter {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("fake route-emitter listen: %v", err)
	}
	// The route-emitter's keepalive policy (grpcx), so the router's 10 s pings are welcome on
	// long runs (bench-router) as they are in production.
	srv := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcx.KeepaliveMinTime, PermitWithoutStream: true}))
	f := &fakeEmitter{addr: ln.Addr().String(), srv: srv, id: id, version: 1,
		routes: map[string]*routeemitterv1.Route{}, subs: map[*fakeSub]struct{}{}}
	for _, r := range routes {
		f.routes[routeKey(r)] = r
	}
	routeemitterv1.RegisterRouteEmitterServiceServer(f.srv, f)
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(f.stop)
	return f
}

// stop ends the server and every stream (a route-emitter crash).
func (f *fakeEmitter) stop() { f.srv.Stop() }

// routeKey is a route's key: protocol plus hostname or incoming port.
func routeKey(r *routeemitterv1.Route) string {
	if r.GetProtocol() == routeemitterv1.Route_PROTOCOL_HTTP {
		return "http/" + r.GetHostname()
	}
	return fmt.Sprintf("%s/%d", r.GetProtocol(), r.GetIncomingPort())
}

// RoutingTable implements routeemitterv1.RouteEmitterServiceServer.
func (f *fakeEmitter) RoutingTable(context.Context, *routeemitterv1.RoutingTableRequest) (*routeemitterv1.RoutingTableResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &routeemitterv1.RoutingTableResponse{TableId: f.id, Version: f.version, Routes: f.snapshotRoutes()}, nil
}

// snapshotRoutes lists the table in key order; f.mu is held.
func (f *fakeEmitter) snapshotRoutes() []*routeemitterv1.Route {
	keys := make([]string, 0, len(f.routes))
	for k := range f.routes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*routeemitterv1.Route, 0, len(keys))
	for _, k := range keys {
		out = append(out, f.routes[k])
	}
	return out
}

// WatchRoutes implements routeemitterv1.RouteEmitterServiceServer.
func (f *fakeEmitter) WatchRoutes(req *routeemitterv1.WatchRoutesRequest, stream grpc.ServerStreamingServer[routeemitterv1.WatchRoutesResponse]) error {
	f.mu.Lock()
	f.requests = append(f.requests, proto.Clone(req).(*routeemitterv1.WatchRoutesRequest))
	var initial []*routeemitterv1.WatchRoutesResponse
	if req.GetTableId() == f.id && req.GetSinceVersion() <= f.version {
		for _, h := range f.history {
			if h.GetVersion() > req.GetSinceVersion() {
				initial = append(initial, h)
			}
		}
		f.sent = append(f.sent, false)
	} else {
		initial = append(initial, &routeemitterv1.WatchRoutesResponse{TableId: f.id, Version: f.version, Snapshot: true,
			Upserts: f.snapshotRoutes()})
		f.sent = append(f.sent, true)
	}
	sub := &fakeSub{ch: make(chan *routeemitterv1.WatchRoutesResponse, 1024), kill: make(chan struct{})}
	f.subs[sub] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.subs, sub)
		f.mu.Unlock()
	}()
	for _, m := range initial {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	for {
		select {
		case m := <-sub.ch:
			if err := stream.Send(m); err != nil {
				return err
			}
		case <-sub.kill:
			return status.Error(codes.Unavailable, "fake route-emitter: stream broken")
		case <-stream.Context().Done():
			return nil
		}
	}
}

// send records a delta and sends it to every stream; f.mu is held.
func (f *fakeEmitter) send(m *routeemitterv1.WatchRoutesResponse) {
	f.history = append(f.history, m)
	for s := range f.subs {
		select {
		case s.ch <- m:
		default:
			close(s.kill)
			delete(f.subs, s)
		}
	}
}

// upsert adds or replaces routes as one delta and returns its version.
func (f *fakeEmitter) upsert(routes ...*routeemitterv1.Route) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version++
	for _, r := range routes {
		f.routes[routeKey(r)] = r
	}
	f.send(&routeemitterv1.WatchRoutesResponse{TableId: f.id, Version: f.version, Upserts: routes})
	return f.version
}

// remove deletes routes (only key fields are sent) as one delta and returns its version.
func (f *fakeEmitter) remove(routes ...*routeemitterv1.Route) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version++
	keys := make([]*routeemitterv1.Route, 0, len(routes))
	for _, r := range routes {
		delete(f.routes, routeKey(r))
		keys = append(keys, &routeemitterv1.Route{Protocol: r.GetProtocol(), Hostname: r.GetHostname(), IncomingPort: r.GetIncomingPort()})
	}
	f.send(&routeemitterv1.WatchRoutesResponse{TableId: f.id, Version: f.version, Removals: keys})
	return f.version
}

// breakStreams fails every open stream while the server keeps running.
func (f *fakeEmitter) breakStreams() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		close(s.kill)
		delete(f.subs, s)
	}
}

// watchCalls returns the WatchRoutes requests so far and whether each began with a snapshot.
func (f *fakeEmitter) watchCalls() ([]*routeemitterv1.WatchRoutesRequest, []bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*routeemitterv1.WatchRoutesRequest(nil), f.requests...), append([]bool(nil), f.sent...)
}

// httpRoute is an HTTP route to backends ("host:port"), endpoint i having index i.
func httpRoute(host string, tlsOnly bool, backends ...string) *routeemitterv1.Route {
	return &routeemitterv1.Route{Protocol: routeemitterv1.Route_PROTOCOL_HTTP, Hostname: host, TlsOnly: tlsOnly,
		Endpoints: endpoints(backends)}
}

// portRoute is a TCP or UDP route on incoming port to backends.
func portRoute(p routeemitterv1.Route_Protocol, port uint32, backends ...string) *routeemitterv1.Route {
	return &routeemitterv1.Route{Protocol: p, IncomingPort: port, Endpoints: endpoints(backends)}
}

// endpoints turns "host:port" strings into endpoints with index = position.
func endpoints(backends []string) []*routeemitterv1.Endpoint {
	out := make([]*routeemitterv1.Endpoint, 0, len(backends))
	for i, b := range backends {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			panic(err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			panic(err)
		}
		out = append(out, &routeemitterv1.Endpoint{ProcessGuid: "pg", Index: int32(i), InstanceGuid: fmt.Sprintf("ig-%d", i),
			Address: host, Port: uint32(p), ContainerPort: 8080})
	}
	return out
}

// testConfig is a router configuration on loopback ports chosen by the kernel.
func testConfig(emitterAddr string) Config {
	cfg := Default()
	cfg.HTTPAddress = "127.0.0.1:0"
	cfg.AdminAddress = "127.0.0.1:0"
	cfg.TCPBindAddress = "127.0.0.1"
	cfg.RouteEmitterAddress = emitterAddr
	cfg.RouteEmitterTLS.Insecure = true
	cfg.ReconnectMinBackoff = Duration(20 * time.Millisecond)
	cfg.ReconnectMaxBackoff = Duration(200 * time.Millisecond)
	cfg.BackendDialTimeout = Duration(time.Second)
	cfg.BackendResponseTimeout = Duration(5 * time.Second)
	cfg.ShutdownTimeout = Duration(2 * time.Second)
	return cfg
}

// startRouter runs a router until the test ends and returns it once ready.
func startRouter(t testing.TB, cfg Config) *Router {
	t.Helper()
	conn, err := DialRouteEmitter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg, logtest.New(t), routeemitterv1.NewRouteEmitterServiceClient(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() }) // after the router stopped: cleanups run last-in first-out
	testkit.Start(t, "router", r)
	return r
}

// serveEchoUpgrade answers an "Upgrade: echo" request as a backend that switches protocols
// does (101, then it echoes one line as "echo:<line>") and reports whether the request was one;
// any other request is left to the caller.
func serveEchoUpgrade(w http.ResponseWriter, req *http.Request) bool {
	if req.Header.Get("Upgrade") != "echo" {
		return false
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return true
	}
	defer conn.Close()
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	_ = brw.Flush()
	line, _ := brw.ReadString('\n')
	_, _ = brw.WriteString("echo:" + line)
	_ = brw.Flush()
	return true
}

// runRouter starts a router the test stops itself (stop), to watch its shutdown: done gets
// what Run returned. It returns once the router has its first table.
func runRouter(t testing.TB, cfg Config) (r *Router, stop context.CancelFunc, done <-chan error) {
	t.Helper()
	conn, err := DialRouteEmitter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r, err = New(cfg, hclog.NewNullLogger(), routeemitterv1.NewRouteEmitterServiceClient(conn))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	ready, ended := make(chan struct{}), make(chan error, 1)
	go func() { ended <- r.Run(ctx, func() { close(ready) }) }()
	<-ready
	waitSynced(t, r)
	return r, stop, ended
}

// waitSynced waits for the router's first table.
func waitSynced(t testing.TB, r *Router) {
	t.Helper()
	select {
	case <-r.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("router never loaded a table")
	}
}

// waitVersion waits until the router holds table id at version or later.
func waitVersion(t testing.TB, r *Router, id string, version uint64) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool {
		gotID, got := r.TableVersion()
		return gotID == id && got >= version
	}, fmt.Sprintf("table %s@%d", id, version))
}

// backend is an HTTP server on loopback that answers with its name and records the last
// request's Host and headers.
type backend struct {
	name string
	srv  *httptest.Server

	mu      sync.Mutex
	host    string
	headers http.Header
	bodies  []string
	hits    int
}

// newBackend starts a named backend until the test ends.
func newBackend(t testing.TB, name string) *backend {
	t.Helper()
	b := &backend{name: name}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.host, b.headers, b.hits = r.Host, r.Header.Clone(), b.hits+1
		b.bodies = append(b.bodies, string(body))
		b.mu.Unlock()
		fmt.Fprint(w, name)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// addr is the backend's host:port.
func (b *backend) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

// last returns the Host and headers of the last request.
func (b *backend) last() (string, http.Header) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.host, b.headers
}

// count is how many requests the backend served.
func (b *backend) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hits
}

// noRedirects is an HTTP client that returns redirects instead of following them.
var noRedirects = &http.Client{
	Timeout:       10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// do sends method to base+path with the given Host through client and returns the status,
// body and headers.
func do(t testing.TB, client *http.Client, method, base, host, path, body string) (int, string, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s%s (Host %s): %v", method, base, path, host, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// get is do with GET and no body.
func get(t testing.TB, client *http.Client, base, host, path string) (int, string) {
	t.Helper()
	code, body, _ := do(t, client, http.MethodGet, base, host, path, "")
	return code, body
}

// httpBase is the router's plain HTTP base URL.
func httpBase(r *Router) string { return "http://" + r.HTTPAddr().String() }

// deadAddr is a loopback address nothing listens on: a reserved port the test never binds.
func deadAddr(t testing.TB) string { return testkit.ReservedAddr(t) }
