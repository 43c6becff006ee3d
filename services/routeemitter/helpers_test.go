package routeemitter_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/routeemitter"
)

// waitTimeout bounds every wait for the table to reach a state.
const waitTimeout = 15 * time.Second

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// emitter is a running route-emitter with a client of its API.
type emitter struct {
	svc    *routeemitter.Service
	client routeemitterv1.RouteEmitterServiceClient
	stop   func()
}

// startEmitter runs a route-emitter following the BBS at bbsAddr until the test ends (or stop).
func startEmitter(t testing.TB, bbsAddr string, configure ...func(*routeemitter.Config)) *emitter {
	t.Helper()
	cfg := routeemitter.Default()
	cfg.ListenAddress = "127.0.0.1:0"
	cfg.TLS = tlsx.Config{Insecure: true}
	cfg.BBSAddress = bbsAddr
	cfg.BBSTLS = tlsx.Config{Insecure: true}
	for _, f := range configure {
		f(&cfg)
	}
	bbsConn, err := bbsclient.Dial(cfg.Config)
	if err != nil {
		t.Fatal(err)
	}
	logger := logtest.New(t).Named("routeemitter")
	svc, err := routeemitter.New(cfg, logger, bbsv1.NewBBSServiceClient(bbsConn))
	if err != nil {
		t.Fatal(err)
	}
	run := testkit.Start(t, "route-emitter", svc)
	conn := testkit.Dial(t, svc.Addr().String())
	var once sync.Once
	stop := func() {
		once.Do(func() {
			conn.Close()
			if err := run.Stop(); err != nil {
				t.Errorf("route-emitter stopped with error: %v", err)
			}
			bbsConn.Close()
		})
	}
	t.Cleanup(stop)
	return &emitter{svc: svc, client: routeemitterv1.NewRouteEmitterServiceClient(conn), stop: stop}
}

// bbsProc is a BBS whose life the test controls.
type bbsProc struct {
	addr   string
	client bbsv1.BBSServiceClient
	stop   func()
}

// startBBS runs a BBS over cli on addr ("127.0.0.1:0" for any port).
func startBBS(t testing.TB, cli *clientv3.Client, addr string, configure ...func(*bbs.Config)) *bbsProc {
	t.Helper()
	cfg := bbs.Default()
	cfg.ListenAddress = addr
	cfg.TLS = tlsx.Config{Insecure: true}
	cfg.EtcdTLS = tlsx.Config{Insecure: true}
	cfg.BookmarkInterval = bbs.Duration(200 * time.Millisecond)
	for _, f := range configure {
		f(&cfg)
	}
	svc, err := bbs.New(cfg, logtest.New(t).Named("bbs"), cli)
	if err != nil {
		t.Fatal(err)
	}
	run := testkit.Start(t, "bbs", svc)
	conn := testkit.Dial(t, svc.Addr().String())
	var once sync.Once
	stop := func() {
		once.Do(func() {
			conn.Close()
			if err := run.Stop(); err != nil {
				t.Errorf("bbs stopped with error: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &bbsProc{addr: svc.Addr().String(), client: bbsv1.NewBBSServiceClient(conn), stop: stop}
}

// lrp is a valid desired LRP with the given ports and routes.
func lrp(guid string, instances int32, ports []uint32, routes map[string][]byte) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid,
		Domain:      "apps",
		Rootfs:      "preloaded:cflinuxfs4",
		Instances:   instances,
		MemoryMb:    128,
		DiskMb:      256,
		Ports:       ports,
		Routes:      routes,
		Action:      &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
	}
}

// cfRouter is a routes map with a cf-router document (and a skydns one, which must be ignored).
func cfRouter(doc string) map[string][]byte {
	return map[string][]byte{
		"cf-router": []byte(doc),
		"skydns":    []byte(`[{"port":5000,"host":"admin-api.service.skydns.local","priority":20}]`),
	}
}

func desire(t testing.TB, c bbsv1.BBSServiceClient, d *modelsv1.DesiredLRP) {
	t.Helper()
	if _, err := c.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatalf("desire %s: %v", d.GetProcessGuid(), err)
	}
}

func instanceKey(instance string) *modelsv1.ActualLRPInstanceKey {
	return &modelsv1.ActualLRPInstanceKey{InstanceGuid: instance, CellId: "cell-1"}
}

// netInfo maps container ports to host ports on 127.0.0.1; pairs is container, host, ….
func netInfo(pairs ...uint32) *modelsv1.ActualLRPNetInfo {
	n := &modelsv1.ActualLRPNetInfo{Address: "127.0.0.1", InstanceAddress: "127.0.0.1"}
	for i := 0; i+1 < len(pairs); i += 2 {
		n.Ports = append(n.Ports, &modelsv1.PortMapping{ContainerPort: pairs[i], HostPort: pairs[i+1]})
	}
	return n
}

// run claims and starts an instance as a rep would.
func run(t testing.TB, c bbsv1.BBSServiceClient, guid string, index int32, instance string, routable bool, net *modelsv1.ActualLRPNetInfo) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := c.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: instanceKey(instance)}); err != nil {
		t.Fatalf("claim %s/%d: %v", guid, index, err)
	}
	start(t, c, guid, index, instance, routable, net)
}

// start (re)starts a claimed or running instance with new network info or routability.
func start(t testing.TB, c bbsv1.BBSServiceClient, guid string, index int32, instance string, routable bool, net *modelsv1.ActualLRPNetInfo) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := c.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: guid, Index: index, InstanceKey: instanceKey(instance), NetInfo: net, Routable: routable}); err != nil {
		t.Fatalf("start %s/%d: %v", guid, index, err)
	}
}

// render maps each route's key ("http:foo.com", "tcp:62312") to "[tls] guid/index/instance@addr:port …".
func render(routes []*routeemitterv1.Route) map[string]string {
	out := make(map[string]string, len(routes))
	for _, r := range routes {
		var key string
		switch r.GetProtocol() {
		case routeemitterv1.Route_PROTOCOL_HTTP:
			key = "http:" + r.GetHostname()
		case routeemitterv1.Route_PROTOCOL_TCP:
			key = fmt.Sprintf("tcp:%d", r.GetIncomingPort())
		default:
			key = fmt.Sprintf("udp:%d", r.GetIncomingPort())
		}
		var eps []string
		if r.GetTlsOnly() {
			eps = append(eps, "[tls]")
		}
		for _, e := range r.GetEndpoints() {
			eps = append(eps, fmt.Sprintf("%s/%d/%s@%s:%d", e.GetProcessGuid(), e.GetIndex(), e.GetInstanceGuid(), e.GetAddress(), e.GetPort()))
		}
		out[key] = strings.Join(eps, " ")
	}
	return out
}

// table reads the routing table, retrying while the emitter has not synced.
func table(t testing.TB, e *emitter) *routeemitterv1.RoutingTableResponse {
	t.Helper()
	select {
	case <-e.svc.Synced():
	case <-time.After(waitTimeout):
		t.Fatal("route-emitter did not sync")
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		resp, err := e.client.RoutingTable(ctxT(t), &routeemitterv1.RoutingTableRequest{})
		if err == nil {
			return resp
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("RoutingTable: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitRoutes waits until every route named in want renders as given ("" = absent).
func waitRoutes(t testing.TB, e *emitter, want map[string]string) map[string]string {
	t.Helper()
	return waitTable(t, e, want, false)
}

// wantExactly waits until the table is exactly want.
func wantExactly(t testing.TB, e *emitter, want map[string]string) {
	t.Helper()
	waitTable(t, e, want, true)
}

func waitTable(t testing.TB, e *emitter, want map[string]string, exact bool) map[string]string {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		got := render(table(t, e).GetRoutes())
		var diff []string
		for k, w := range want {
			if got[k] != w {
				diff = append(diff, fmt.Sprintf("%s: got %q, want %q", k, got[k], w))
			}
		}
		if exact {
			for k := range got {
				if _, ok := want[k]; !ok {
					diff = append(diff, fmt.Sprintf("%s: unexpected %q", k, got[k]))
				}
			}
		}
		if len(diff) == 0 {
			return got
		}
		if time.Now().After(deadline) {
			slices.Sort(diff)
			t.Fatalf("routing table did not converge:\n  %s", strings.Join(diff, "\n  "))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// watcher is a WatchRoutes stream read in the background, with the table it implies.
type watcher struct {
	msgs   chan *routeemitterv1.WatchRoutesResponse
	errc   chan error
	cancel context.CancelFunc
}

func watch(t testing.TB, e *emitter, tableID string, since uint64) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.client.WatchRoutes(ctx, &routeemitterv1.WatchRoutesRequest{TableId: tableID, SinceVersion: since})
	if err != nil {
		cancel()
		t.Fatalf("WatchRoutes: %v", err)
	}
	w := &watcher{msgs: make(chan *routeemitterv1.WatchRoutesResponse, 100_000), errc: make(chan error, 1), cancel: cancel}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
					err = nil
				}
				w.errc <- err
				return
			}
			w.msgs <- m
		}
	}()
	t.Cleanup(cancel)
	return w
}

// next returns the next message, failing after waitTimeout.
func (w *watcher) next(t testing.TB) *routeemitterv1.WatchRoutesResponse {
	t.Helper()
	select {
	case m := <-w.msgs:
		return m
	case err := <-w.errc:
		t.Fatalf("watch ended: %v", err)
	case <-time.After(waitTimeout):
		t.Fatal("no watch message")
	}
	return nil
}

// mirror is a router's copy of the table, kept from a watch stream.
type mirror struct {
	tableID string
	version uint64
	routes  map[string]*routeemitterv1.Route
	deltas  int
	snaps   int
}

func newMirror() *mirror { return &mirror{routes: map[string]*routeemitterv1.Route{}} }

func routeKey(r *routeemitterv1.Route) string {
	return fmt.Sprintf("%d/%s/%d", r.GetProtocol(), r.GetHostname(), r.GetIncomingPort())
}

// apply applies m, failing on a delta that does not follow the mirror's version.
func (m *mirror) apply(t testing.TB, msg *routeemitterv1.WatchRoutesResponse) {
	t.Helper()
	if msg.GetSnapshot() {
		m.snaps++
		m.tableID, m.version = msg.GetTableId(), msg.GetVersion()
		m.routes = map[string]*routeemitterv1.Route{}
		for _, r := range msg.GetUpserts() {
			m.routes[routeKey(r)] = r
		}
		return
	}
	if msg.GetTableId() != m.tableID || msg.GetVersion() != m.version+1 {
		t.Fatalf("delta %s/v%d does not follow %s/v%d", msg.GetTableId(), msg.GetVersion(), m.tableID, m.version)
	}
	m.deltas++
	m.version = msg.GetVersion()
	for _, r := range msg.GetRemovals() {
		if len(r.GetEndpoints()) > 0 {
			t.Fatalf("removal carries endpoints: %v", r)
		}
		delete(m.routes, routeKey(r))
	}
	for _, r := range msg.GetUpserts() {
		m.routes[routeKey(r)] = r
	}
}

// list is the mirror's routes in table order.
func (m *mirror) list() []*routeemitterv1.Route {
	out := make([]*routeemitterv1.Route, 0, len(m.routes))
	for _, r := range m.routes {
		out = append(out, r)
	}
	return out
}

// follow applies w's messages to m until m reaches version.
func (m *mirror) follow(t testing.TB, w *watcher, version uint64) {
	t.Helper()
	for m.version < version {
		m.apply(t, w.next(t))
	}
}

// proxy forwards TCP connections to a target and can be taken down and brought back on the
// same address, to cut a client off from a BBS.
type proxy struct {
	addr string

	mu     sync.Mutex
	target string
	ln     net.Listener
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	// A reserved port, outside the ephemeral range: up listens on it again after down, and an
	// ephemeral port could meanwhile be handed to another listener (it was, once, in CI).
	ln, err := net.Listen("tcp", testkit.ReservedAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln, target)
	t.Cleanup(func() {
		p.down()
		p.wg.Wait()
	})
	return p
}

// serve accepts on ln and forwards to target.
func (p *proxy) serve(ln net.Listener, target string) {
	p.mu.Lock()
	p.ln, p.target = ln, target
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[u] = struct{}{}, struct{}{}
			p.mu.Unlock()
			p.wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer p.wg.Done()
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(u, c)
			go pipe(c, u)
		}
	}()
}

// down closes the listener and every forwarded connection.
func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// up listens on the proxy's address again, forwarding to target.
func (p *proxy) up(t testing.TB, target string) {
	t.Helper()
	var ln net.Listener
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("proxy listen again on %s: %v", p.addr, err)
	}
	p.serve(ln, target)
}

// waitStats waits until cond holds for the emitter's syncer counters.
func waitStats(t testing.TB, e *emitter, what string, cond func(routeemitter.Stats) bool) {
	t.Helper()
	testkit.EventuallyState(t, waitTimeout, func() (bool, string) {
		st := e.svc.Stats()
		return cond(st), fmt.Sprintf("stats %+v", st)
	}, what)
}
