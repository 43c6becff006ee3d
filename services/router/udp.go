package router

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// maxDatagram is the largest UDP payload relayed.
const maxDatagram = 64 * 1024

// udpListener relays the datagrams of one UDP incoming port. Each client address gets a
// session: a connected socket to one endpoint (chosen round-robin when the session starts)
// that relays answers back to the client, ended after idle without traffic either way.
type udpListener struct {
	port        uint32
	conn        *net.UDPConn
	table       func() *table
	dialTimeout time.Duration
	idle        time.Duration
	maxSessions int
	log         hclog.Logger
	metrics     *metrics
	wg          *sync.WaitGroup // the router's, so Run waits for sessions to end

	mu       sync.Mutex
	sessions map[netip.AddrPort]*udpSession
	closed   bool
}

// udpSession is one client's association with one endpoint.
type udpSession struct {
	client  netip.AddrPort
	backend *net.UDPConn
	last    atomic.Int64 // unix nanoseconds of the last datagram either way
}

// touch records traffic now.
func (s *udpSession) touch() { s.last.Store(time.Now().UnixNano()) }

// openUDP binds addr and serves it until close.
func openUDP(addr string, port uint32, table func() *table, dialTimeout, idle time.Duration, maxSessions int,
	log hclog.Logger, m *metrics, wg *sync.WaitGroup) (*udpListener, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, err
	}
	l := &udpListener{port: port, conn: conn, table: table, dialTimeout: dialTimeout, idle: idle,
		maxSessions: maxSessions, log: log, metrics: m, wg: wg, sessions: map[netip.AddrPort]*udpSession{}}
	wg.Add(1)
	go l.serve()
	return l, nil
}

// addr is the bound address.
func (l *udpListener) addr() net.Addr { return l.conn.LocalAddr() }

// serve reads client datagrams until the socket is closed and forwards each on its client's
// session.
func (l *udpListener) serve() {
	defer l.wg.Done()
	buf := make([]byte, maxDatagram)
	wait := acceptPolicy.BackOff()
	for {
		n, from, err := l.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay := wait.NextBackOff()
			l.log.Debug("udp read failed", "port", l.port, "error", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		wait.Reset()
		s := l.session(from)
		if s == nil {
			l.metrics.udpDropped.Inc()
			continue
		}
		if _, err := s.backend.Write(buf[:n]); err != nil {
			l.log.Debug("udp send to backend failed", "port", l.port, "error", err)
		}
	}
}

// session returns from's session (marking it used), starting one on the port's current route
// if needed; nil
// when there is no endpoint, the session limit is reached or the listener is closed.
// Sessions are only created by serve's goroutine.
func (l *udpListener) session(from netip.AddrPort) *udpSession {
	l.mu.Lock()
	s, ok := l.sessions[from]
	if ok {
		s.touch() // under the lock, so expire cannot end a session that is being used
	}
	full := len(l.sessions) >= l.maxSessions
	l.mu.Unlock()
	if ok {
		return s
	}
	if full {
		return nil
	}
	var r *route
	if t := l.table(); t != nil {
		r = t.udp[l.port]
	}
	if r == nil || len(r.endpoints) == 0 {
		return nil
	}
	ep := r.endpoints[r.pick()%uint64(len(r.endpoints))]
	d := net.Dialer{Timeout: l.dialTimeout}
	c, err := d.Dial("udp", ep.addr)
	if err != nil {
		l.log.Debug("udp dial failed", "port", l.port, "endpoint", ep.addr, "error", err)
		return nil
	}
	s = &udpSession{client: from, backend: c.(*net.UDPConn)}
	s.touch()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		c.Close()
		return nil
	}
	l.sessions[from] = s
	l.mu.Unlock()
	l.metrics.udpSessions.Inc()
	l.wg.Add(1)
	go l.pump(s)
	return s
}

// pump relays the endpoint's answers to the client until the session is idle for l.idle, the
// endpoint refuses, or the listener closes.
func (l *udpListener) pump(s *udpSession) {
	defer l.wg.Done()
	defer l.metrics.udpSessions.Dec()
	defer l.end(s)
	buf := make([]byte, maxDatagram)
	for {
		deadline := time.Unix(0, s.last.Load()).Add(l.idle)
		if !time.Now().Before(deadline) {
			if l.expire(s) {
				return
			}
			continue
		}
		if err := s.backend.SetReadDeadline(deadline); err != nil {
			return
		}
		n, err := s.backend.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue // the loop re-checks idleness against the latest traffic
			}
			l.log.Debug("udp session ended", "port", l.port, "client", s.client, "error", err)
			return
		}
		s.touch()
		if _, err := l.conn.WriteToUDPAddrPort(buf[:n], s.client); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.log.Debug("udp send to client failed", "port", l.port, "client", s.client, "error", err)
		}
	}
}

// expire forgets s unless a datagram arrived meanwhile; it reports whether s is gone. serve
// touches a session under the same lock when it picks it, so a session in use never expires.
func (l *udpListener) expire(s *udpSession) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Since(time.Unix(0, s.last.Load())) < l.idle {
		return false
	}
	if l.sessions[s.client] == s {
		delete(l.sessions, s.client)
	}
	return true
}

// end closes s and forgets it.
func (l *udpListener) end(s *udpSession) {
	s.backend.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sessions[s.client] == s {
		delete(l.sessions, s.client)
	}
}

// close stops reading and ends every session.
func (l *udpListener) close() {
	l.mu.Lock()
	l.closed = true
	sessions := l.sessions
	l.sessions = map[netip.AddrPort]*udpSession{}
	l.mu.Unlock()
	l.conn.Close()
	for _, s := range sessions {
		s.backend.Close()
	}
}
