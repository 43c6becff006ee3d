// Package router is Gavel's data plane. It follows the route-emitter's WatchRoutes stream into
// an in-memory routing table and serves it: HTTP(S) reverse proxying by Host (index-specific
// hosts are ordinary table entries), TLS-only routes on the TLS listener only, and TCP/UDP
// relaying on each route's incoming port.
package router

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/gavel-sched/gavel/pkg/config"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
)

// Router is a router; build it with New and start it with Run (once).
type Router struct {
	cfg      Config
	log      hclog.Logger
	tlsCfg   *tls.Config // nil without a TLS listener
	adminTLS *tls.Config // nil: the admin address serves plain HTTP
	metrics  *metrics
	watcher  *watcher
	proxy    *proxy
	tcp      *portSet[*tcpListener]
	udp      *portSet[*udpListener]
	relays   sync.WaitGroup // TCP relays and UDP sessions

	tbl      atomic.Pointer[table]
	changed  atomic.Pointer[chan struct{}] // closed and replaced whenever a table is installed
	synced   chan struct{}                 // closed when the first table is installed
	syncOnce sync.Once
	draining atomic.Bool

	mu        sync.Mutex
	httpAddr  net.Addr
	httpsAddr net.Addr
	adminAddr net.Addr
}

// New builds a router that reads its table from client. It validates cfg and loads the TLS
// listener's certificate, so configuration problems show before anything starts.
func New(cfg Config, logger hclog.Logger, client routeemitterv1.RouteEmitterServiceClient) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("router config: %w", err)
	}
	if client == nil {
		return nil, errors.New("router: a route-emitter client is required")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	r := &Router{cfg: cfg, log: logger, metrics: newMetrics(), synced: make(chan struct{})}
	if cfg.HTTPSAddress != "" {
		cert, err := tls.LoadX509KeyPair(cfg.HTTPSCertFile, cfg.HTTPSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("router: load https certificate %s, %s: %w", cfg.HTTPSCertFile, cfg.HTTPSKeyFile, err)
		}
		r.tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}
	if cfg.AdminTLS {
		tc, err := cfg.RouteEmitterTLS.ServerTLS()
		if err != nil {
			return nil, fmt.Errorf("router: admin tls: %w", err)
		}
		r.adminTLS = tc
	}
	r.watcher = &watcher{
		client:      client,
		log:         logger.Named("watch"),
		minBackoff:  time.Duration(cfg.ReconnectMinBackoff),
		maxBackoff:  time.Duration(cfg.ReconnectMaxBackoff),
		publish:     r.publish,
		current:     r.tbl.Load,
		onReconnect: r.metrics.reconnects.Inc,
	}
	r.proxy = newProxy(cfg, r.tbl.Load, r.redirectPort, logger.Named("http"), r.metrics)
	dialTimeout := time.Duration(cfg.BackendDialTimeout)
	tcpLog, udpLog := logger.Named("tcp"), logger.Named("udp")
	portMin, portMax, err := config.ParsePortRange(cfg.IncomingPortRange)
	if err != nil {
		return nil, fmt.Errorf("router: incoming_port_range: %w", err)
	}
	r.tcp = newPortSet("tcp", cfg.TCPBindAddress, uint32(portMin), uint32(portMax), func(t *table) map[uint32]*route { return t.tcp },
		func(addr string, port uint32) (*tcpListener, error) {
			return openTCP(addr, port, r.tbl.Load, dialTimeout, tcpLog, r.metrics, &r.relays)
		}, tcpLog)
	r.udp = newPortSet("udp", cfg.TCPBindAddress, uint32(portMin), uint32(portMax), func(t *table) map[uint32]*route { return t.udp },
		func(addr string, port uint32) (*udpListener, error) {
			return openUDP(addr, port, r.tbl.Load, dialTimeout, time.Duration(cfg.UDPSessionIdleTimeout),
				cfg.UDPMaxSessions, udpLog, r.metrics, &r.relays)
		}, udpLog)
	return r, nil
}

// DialRouteEmitter connects to cfg's route-emitter with its client TLS, keepalives, and a
// connection backoff capped at ReconnectMaxBackoff. The caller closes the connection.
func DialRouteEmitter(cfg Config) (*grpc.ClientConn, error) {
	bc := backoff.DefaultConfig
	bc.BaseDelay = time.Duration(cfg.ReconnectMinBackoff)
	bc.MaxDelay = time.Duration(cfg.ReconnectMaxBackoff)
	conn, err := grpcx.Dial(cfg.RouteEmitterAddress,
		grpcx.ClientConfig{TLS: cfg.RouteEmitterTLS, KeepaliveTime: 10 * time.Second},
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: 5 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("route-emitter client: %w", err)
	}
	return conn, nil
}

// Run binds the HTTP, HTTPS and admin listeners, calls ready, and then serves until ctx ends:
// it follows the route-emitter, opens and closes TCP/UDP incoming ports as routes come and go,
// and proxies. On stop /healthz turns 503, in-flight HTTP requests get ShutdownTimeout to
// finish, and every TCP connection and UDP session is closed. A listener that fails stops the
// router with its error.
func (r *Router) Run(ctx context.Context, ready func()) error {
	type listener struct {
		name string
		ln   net.Listener
		srv  *http.Server
		tls  bool
		loop *loopServer // the request loop, on the HTTP and HTTPS listeners
	}
	var lns []listener
	closeAll := func() {
		for _, l := range lns {
			l.ln.Close()
		}
	}
	bind := func(name, addr string, h http.Handler, tc *tls.Config) (net.Addr, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("router: listen %s %s: %w", name, addr, err)
		}
		srv := &http.Server{
			Handler:           h,
			ReadHeaderTimeout: time.Duration(r.cfg.ClientReadHeaderTimeout),
			IdleTimeout:       time.Duration(r.cfg.ClientIdleTimeout),
			ErrorLog:          r.log.Named(name).StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
		}
		if tc != nil {
			srv.TLSConfig = tc.Clone()
		}
		l := listener{name: name, ln: ln, srv: srv, tls: tc != nil}
		if h == http.Handler(r.proxy) {
			var loopTLS *tls.Config
			if tc != nil {
				// The loop serves HTTP/1.1; h2 connections go to srv, which serves h2 because
				// its config offers it.
				srv.TLSConfig.NextProtos = []string{"h2", "http/1.1"}
				loopTLS = srv.TLSConfig
			}
			l.loop = newLoopServer(r.proxy, srv, ln.Addr(), loopTLS, r.log.Named(name))
		}
		lns = append(lns, l)
		return ln.Addr(), nil
	}
	httpAddr, err := bind("http", r.cfg.HTTPAddress, r.proxy, nil)
	if err != nil {
		return err
	}
	var httpsAddr, adminAddr net.Addr
	if r.tlsCfg != nil {
		if httpsAddr, err = bind("https", r.cfg.HTTPSAddress, r.proxy, r.tlsCfg); err != nil {
			return err
		}
	}
	if r.cfg.AdminAddress != "" {
		if adminAddr, err = bind("admin", r.cfg.AdminAddress, r.adminHandler(), r.adminTLS); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.httpAddr, r.httpsAddr, r.adminAddr = httpAddr, httpsAddr, adminAddr
	r.mu.Unlock()

	// The first part to fail stops the others; Run returns its error.
	g, ctx := errgroup.WithContext(ctx)
	start := func(name string, f func(context.Context) error) {
		g.Go(func() error {
			if err := f(ctx); err != nil {
				return fmt.Errorf("router %s: %w", name, err)
			}
			return nil
		})
	}
	for _, l := range lns {
		if l.loop != nil {
			start(l.name, r.serveLoop(l.loop, l.ln))
		} else {
			start(l.name, r.serveHTTP(l.srv, l.ln, l.tls))
		}
	}
	start("watch", r.watcher.run)
	start("backend pool", r.proxy.pool.reap)
	start("tcp", func(ctx context.Context) error { return r.tcp.run(ctx, r.tbl.Load) })
	start("udp", func(ctx context.Context) error { return r.udp.run(ctx, r.tbl.Load) })
	r.log.Info("router serving", "http", addrString(httpAddr), "https", addrString(httpsAddr), "admin", addrString(adminAddr))
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	r.draining.Store(true)
	err = g.Wait()
	r.relays.Wait()
	r.proxy.transport.CloseIdleConnections()
	return err
}

// serveHTTP serves srv on ln until ctx ends, then shuts it down gracefully.
func (r *Router) serveHTTP(srv *http.Server, ln net.Listener, useTLS bool) func(context.Context) error {
	return func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() {
			if useTLS {
				errc <- srv.ServeTLS(ln, "", "")
			} else {
				errc <- srv.Serve(ln)
			}
		}()
		select {
		case err := <-errc:
			return fmt.Errorf("serve %s: %w", ln.Addr(), err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.cfg.ShutdownTimeout))
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			r.log.Warn("graceful shutdown incomplete; closing", "address", ln.Addr(), "error", err)
			srv.Close()
		}
		<-errc
		return nil
	}
}

// serveLoop serves ln with the request loop s until ctx ends, then shuts it down gracefully.
func (r *Router) serveLoop(s *loopServer, ln net.Listener) func(context.Context) error {
	return func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- s.serve(ln) }()
		select {
		case err := <-errc:
			return fmt.Errorf("serve %s: %w", ln.Addr(), err)
		case <-ctx.Done():
		}
		ln.Close()
		<-errc
		sctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.cfg.ShutdownTimeout))
		defer cancel()
		if err := s.shutdown(sctx); err != nil {
			r.log.Warn("graceful shutdown incomplete; closed", "address", ln.Addr(), "error", err)
		}
		return nil
	}
}

// adminHandler serves /healthz and /metrics.
func (r *Router) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case r.draining.Load():
			http.Error(w, "draining", http.StatusServiceUnavailable)
		case r.tbl.Load() == nil:
			http.Error(w, "routing table not loaded", http.StatusServiceUnavailable)
		default:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintln(w, "ok")
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.metrics.registry, promhttp.HandlerOpts{}))
	return mux
}

// publish installs t (called by the watcher only) and tells the port sets.
func (r *Router) publish(t *table) {
	prev := r.tbl.Swap(t)
	next := make(chan struct{})
	if old := r.changed.Swap(&next); old != nil {
		close(*old)
	}
	r.metrics.observeTable(t)
	r.syncOnce.Do(func() { close(r.synced) })
	r.tcp.notify()
	r.udp.notify()
	if prev == nil || prev.id != t.id {
		r.log.Info("loaded routing table", "table_id", t.id, "version", t.version,
			"http_routes", t.http.len(), "tcp_routes", len(t.tcp), "udp_routes", len(t.udp))
	} else {
		r.log.Debug("updated routing table", "table_id", t.id, "version", t.version)
	}
}

// redirectPort is the https port written into redirects of tls_only routes.
func (r *Router) redirectPort() int {
	if r.cfg.HTTPSRedirectPort > 0 {
		return r.cfg.HTTPSRedirectPort
	}
	if a, ok := r.HTTPSAddr().(*net.TCPAddr); ok && a != nil {
		return a.Port
	}
	return 443
}

// addrString is a's text, or "none" for nil.
func addrString(a net.Addr) string {
	if a == nil {
		return "none"
	}
	return a.String()
}

// HTTPAddr is the plain HTTP listener's bound address once Run has called ready, else nil.
func (r *Router) HTTPAddr() net.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.httpAddr
}

// HTTPSAddr is the TLS listener's bound address once Run has called ready; nil without one.
func (r *Router) HTTPSAddr() net.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.httpsAddr
}

// AdminAddr is the admin (/healthz, /metrics) listener's bound address once Run has called
// ready; nil without one.
func (r *Router) AdminAddr() net.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.adminAddr
}

// TCPAddr is the bound address of the TCP incoming port, or nil while it is not open.
func (r *Router) TCPAddr(incomingPort uint32) net.Addr {
	if l, ok := r.tcp.get(incomingPort); ok {
		return l.addr()
	}
	return nil
}

// UDPAddr is the bound address of the UDP incoming port, or nil while it is not open.
func (r *Router) UDPAddr(incomingPort uint32) net.Addr {
	if l, ok := r.udp.get(incomingPort); ok {
		return l.addr()
	}
	return nil
}

// Synced is closed once the first routing table is loaded.
func (r *Router) Synced() <-chan struct{} { return r.synced }

// TableVersion is the table_id and version of the routing table held; empty and zero before
// the first snapshot.
func (r *Router) TableVersion() (tableID string, version uint64) {
	if t := r.tbl.Load(); t != nil {
		return t.id, t.version
	}
	return "", 0
}

// TableChanged is closed when the router next installs a routing table (a snapshot or a
// delta). Take it before reading the table (Endpoints) so no change is missed in between.
func (r *Router) TableChanged() <-chan struct{} {
	for {
		if ch := r.changed.Load(); ch != nil {
			return *ch
		}
		ch := make(chan struct{})
		if r.changed.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// Endpoints lists the host:port addresses the router currently sends requests for host to
// (nil when it has no route for host).
func (r *Router) Endpoints(host string) []string {
	t := r.tbl.Load()
	if t == nil {
		return nil
	}
	rt := t.http.get(normalizeHostname(host))
	if rt == nil {
		return nil
	}
	out := make([]string, len(rt.endpoints))
	for i, e := range rt.endpoints {
		out[i] = e.addr
	}
	return out
}
