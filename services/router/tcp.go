package router

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/pkg/retry"
)

// relistenInterval is how often ports that could not be opened are tried again.
const relistenInterval = 5 * time.Second

// acceptPolicy is the pause after failed Accepts or ReadFroms in a row: 5ms doubling up to 1s.
var acceptPolicy = retry.Policy{Initial: 5 * time.Millisecond, Max: time.Second}

// portSet opens one listener per TCP or UDP route of the table and closes it when the route
// goes. reconcile runs on every table change and, while some port could not be opened, every
// relistenInterval.
type portSet[L interface{ close() }] struct {
	name    string // "tcp" or "udp", for logs
	bind    string
	routes  func(*table) map[uint32]*route
	open    func(addr string, port uint32) (L, error)
	log     hclog.Logger
	changed chan struct{}

	// min and max bound the ports opened; a route outside is refused (logged once).
	min, max uint32

	mu        sync.Mutex
	listeners map[uint32]L
	failed    map[uint32]bool
	refused   map[uint32]bool
}

// newPortSet makes an empty set opening ports in [min, max]; open binds addr and starts
// serving it.
func newPortSet[L interface{ close() }](name, bind string, min, max uint32, routes func(*table) map[uint32]*route,
	open func(addr string, port uint32) (L, error), log hclog.Logger) *portSet[L] {
	return &portSet[L]{name: name, bind: bind, min: min, max: max, routes: routes, open: open, log: log,
		changed: make(chan struct{}, 1), listeners: map[uint32]L{}, failed: map[uint32]bool{}, refused: map[uint32]bool{}}
}

// notify asks run to reconcile with the current table.
func (s *portSet[L]) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// run reconciles until ctx ends, then closes every listener.
func (s *portSet[L]) run(ctx context.Context, current func() *table) error {
	ticker := time.NewTicker(relistenInterval)
	defer ticker.Stop()
	defer s.closeAll()
	s.reconcile(current())
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
			s.reconcile(current())
		case <-ticker.C:
			s.mu.Lock()
			retry := len(s.failed) > 0
			s.mu.Unlock()
			if retry {
				s.reconcile(current())
			}
		}
	}
}

// reconcile closes listeners whose route is gone and opens one for each new route.
func (s *portSet[L]) reconcile(t *table) {
	var want map[uint32]*route
	if t != nil {
		want = s.routes(t)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for port, l := range s.listeners {
		if _, ok := want[port]; !ok {
			l.close()
			delete(s.listeners, port)
			s.log.Info("closed incoming port", "protocol", s.name, "port", port)
		}
	}
	for port := range s.failed {
		if _, ok := want[port]; !ok {
			delete(s.failed, port)
		}
	}
	for port := range s.refused {
		if _, ok := want[port]; !ok {
			delete(s.refused, port)
		}
	}
	for port := range want {
		if _, ok := s.listeners[port]; ok {
			continue
		}
		if port < s.min || port > s.max {
			if !s.refused[port] {
				s.log.Warn("refusing a route on an incoming port outside incoming_port_range", "protocol", s.name, "port", port, "range_start", s.min, "range_end", s.max)
			}
			s.refused[port] = true
			continue
		}
		addr := net.JoinHostPort(s.bind, strconv.FormatUint(uint64(port), 10))
		l, err := s.open(addr, port)
		if err != nil {
			if !s.failed[port] {
				s.log.Error("cannot open incoming port; retrying", "protocol", s.name, "address", addr, "error", err)
			}
			s.failed[port] = true
			continue
		}
		delete(s.failed, port)
		s.listeners[port] = l
		s.log.Info("opened incoming port", "protocol", s.name, "address", addr)
	}
}

// get returns the listener of port, if open.
func (s *portSet[L]) get(port uint32) (L, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.listeners[port]
	return l, ok
}

// closeAll closes every listener.
func (s *portSet[L]) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for port, l := range s.listeners {
		l.close()
		delete(s.listeners, port)
	}
}

// tcpListener relays the connections of one TCP incoming port to the route's endpoints.
type tcpListener struct {
	port    uint32
	ln      net.Listener
	table   func() *table
	dialer  *net.Dialer
	log     hclog.Logger
	metrics *metrics
	ctx     context.Context // cancelled by close; bounds backend dials
	cancel  context.CancelFunc
	wg      *sync.WaitGroup // the router's, so Run waits for relays to end

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// openTCP listens on addr and serves it until close.
func openTCP(addr string, port uint32, table func() *table, dialTimeout time.Duration, log hclog.Logger,
	m *metrics, wg *sync.WaitGroup) (*tcpListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &tcpListener{port: port, ln: ln, table: table, dialer: &net.Dialer{Timeout: dialTimeout},
		log: log, metrics: m, ctx: ctx, cancel: cancel, wg: wg, conns: map[net.Conn]struct{}{}}
	wg.Add(1)
	go l.serve()
	return l, nil
}

// addr is the bound address.
func (l *tcpListener) addr() net.Addr { return l.ln.Addr() }

// serve accepts until the listener is closed.
func (l *tcpListener) serve() {
	defer l.wg.Done()
	wait := acceptPolicy.BackOff()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay := wait.NextBackOff()
			l.log.Warn("accept failed", "port", l.port, "error", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		wait.Reset()
		if !l.track(c) {
			c.Close()
			return
		}
		l.wg.Add(1)
		go l.handle(c)
	}
}

// handle relays one client connection to an endpoint of the port's current route, trying the
// next endpoint once when the first cannot be reached.
func (l *tcpListener) handle(client net.Conn) {
	defer l.wg.Done()
	defer l.untrack(client)
	defer client.Close()
	var r *route
	if t := l.table(); t != nil {
		r = t.tcp[l.port]
	}
	if r == nil || len(r.endpoints) == 0 {
		l.metrics.tcpRejected.Inc()
		return
	}
	n := uint64(len(r.endpoints))
	start := r.pick()
	backend, err := l.dialer.DialContext(l.ctx, "tcp", r.endpoints[start%n].addr)
	if err != nil && n > 1 && l.ctx.Err() == nil {
		backend, err = l.dialer.DialContext(l.ctx, "tcp", r.endpoints[(start+1)%n].addr)
	}
	if err != nil {
		l.metrics.tcpRejected.Inc()
		l.log.Debug("cannot reach backend", "port", l.port, "error", err)
		return
	}
	if !l.track(backend) {
		backend.Close()
		return
	}
	defer l.untrack(backend)
	defer backend.Close()
	l.metrics.tcpActive.Inc()
	defer l.metrics.tcpActive.Dec()
	relay(client, backend)
}

// relay copies both ways until both directions end. A direction that ends cleanly (EOF)
// half-closes its destination so the other side sees EOF and may still answer; a failed
// direction closes both connections.
func relay(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		copyHalf(b, a)
		close(done)
	}()
	copyHalf(a, b)
	<-done
}

// copyHalf copies src to dst, then half-closes dst (or closes both on error).
func copyHalf(dst, src net.Conn) {
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err == nil {
			return
		}
	}
	dst.Close()
}

// track records c so close can end it; it reports false once the listener is closed.
func (l *tcpListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

// untrack forgets c.
func (l *tcpListener) untrack(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, c)
}

// close stops accepting and closes every relayed connection (both sides).
func (l *tcpListener) close() {
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = map[net.Conn]struct{}{}
	l.mu.Unlock()
	l.cancel()
	l.ln.Close()
	for c := range conns {
		c.Close()
	}
}
