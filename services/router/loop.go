package router

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The request loop serves the HTTP and HTTPS listeners' HTTP/1.x connections itself (see
// docs/decisions/0047-router-request-loop.md): one goroutine per client connection reads each
// request head, and for the common request (parseHead) looks the route up, sends the request
// over the direct path's backend pool and writes the answer, all on that goroutine, with no
// background read. Any other request, an HTTP/2 (ALPN h2) connection, or a request for which
// the router answers itself (no table, unknown host, tls_only redirect, no endpoints) hands
// the connection to net/http's server (handoff.go), with the bytes read so far.

// loopServer serves one listener with the request loop and a net/http server for handoffs.
type loopServer struct {
	proxy         *proxy
	tlsCfg        *tls.Config // nil: plain HTTP
	handoff       *http.Server
	handoffLn     *handoffListener
	idleTimeout   time.Duration
	headerTimeout time.Duration
	log           hclog.Logger

	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*clientConn]struct{}
	wg      sync.WaitGroup
}

// newLoopServer serves ln's connections with p, handing connections to srv (whose handler is
// p, and whose TLS config is tlsCfg with h2 offered) when the loop does not serve them.
func newLoopServer(p *proxy, srv *http.Server, addr net.Addr, tlsCfg *tls.Config, log hclog.Logger) *loopServer {
	s := &loopServer{proxy: p, tlsCfg: tlsCfg, handoff: srv, handoffLn: newHandoffListener(addr),
		idleTimeout: srv.IdleTimeout, headerTimeout: srv.ReadHeaderTimeout, log: log,
		conns: map[*clientConn]struct{}{}}
	if tlsCfg != nil {
		srv.ConnContext = handoffConnContext
		srv.Handler = withTLSState(srv.Handler)
	}
	return s
}

// serve accepts ln's connections until ln is closed; it returns the accept error.
func (s *loopServer) serve(ln net.Listener) error {
	go func() { _ = s.handoff.Serve(s.handoffLn) }()
	var delay time.Duration
	for {
		raw, err := ln.Accept()
		if err != nil {
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() { // as net/http: EMFILE and the like
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Debug("accept failed; retrying", "error", err, "delay", delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		c := &clientConn{s: s, raw: raw, conn: raw}
		c.idle.Store(true)
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			_ = raw.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// shutdown stops the loop after ln was closed: idle connections are closed, the others close
// once their request is answered; then the handoff server shuts down. Past ctx's end every
// connection is closed.
func (s *loopServer) shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	for c := range s.conns {
		if c.idle.Load() {
			_ = c.raw.Close()
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		// Closing the backend connection too ends a wait on a backend that does not answer.
		s.mu.Lock()
		for c := range s.conns {
			_ = c.raw.Close()
			if bc := c.backend.Load(); bc != nil {
				bc.close()
			}
		}
		s.mu.Unlock()
		<-done
	}
	err := s.handoff.Shutdown(ctx)
	if err != nil {
		s.handoff.Close()
	}
	return err
}

// forget drops c from the tracked connections.
func (s *loopServer) forget(c *clientConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// clientConn is one client connection served by the loop.
type clientConn struct {
	s       *loopServer
	raw     net.Conn // as accepted; shutdown closes it
	conn    net.Conn // raw, or the *tls.Conn over it
	tls     *tls.ConnectionState
	br      *bufio.Reader
	bw      *bufio.Writer
	idle    atomic.Bool                 // waiting for a request: shutdown closes it
	backend atomic.Pointer[backendConn] // the backend connection of the exchange in progress
	peerIP  string
	head    reqHead
	rhead   respHead
	out     []byte // the request as sent to the backend
	scratch []byte // answer heads
	host    []byte // the route key of the request's Host
	// readDeadline is the client connection's read deadline as last set by the loop (zero:
	// none), so that setReadDeadline can keep one that is close enough.
	readDeadline time.Time
}

// serve runs the connection's loop until it ends or is handed off.
func (c *clientConn) serve() {
	defer c.s.forget(c)
	if c.s.tlsCfg != nil {
		if !c.handshake() {
			return
		}
	}
	if host, _, err := net.SplitHostPort(c.conn.RemoteAddr().String()); err == nil {
		c.peerIP = host
	}
	c.br = bufio.NewReaderSize(c.conn, 4096)
	c.bw = bufio.NewWriterSize(c.conn, 4096)
	for {
		switch c.next() {
		case stepContinue:
		case stepHandoff:
			c.s.handoffLn.push(&prefixConn{Conn: c.conn, br: c.br, tls: c.tls})
			return
		default:
			_ = c.conn.Close()
			return
		}
	}
}

// handshake runs the TLS handshake within the header timeout, as net/http does, and hands
// HTTP/2 connections to net/http; it reports whether the loop serves the connection.
func (c *clientConn) handshake() bool {
	tc := tls.Server(c.conn, c.s.tlsCfg)
	if d := c.s.headerTimeout; d > 0 {
		_ = tc.SetDeadline(time.Now().Add(d))
	}
	if err := tc.Handshake(); err != nil {
		c.s.log.Debug("TLS handshake failed", "remote", c.conn.RemoteAddr(), "error", err)
		_ = tc.Close()
		return false
	}
	_ = tc.SetDeadline(time.Time{})
	st := tc.ConnectionState()
	if st.NegotiatedProtocol == "h2" {
		c.s.handoffLn.push(tc)
		return false
	}
	c.conn, c.tls = tc, &st
	return true
}

// step is what the loop does after a request.
type step int

const (
	stepContinue step = iota // read the next request
	stepHandoff              // hand the connection to net/http
	stepClose                // close the connection
)

// next waits for the next request and serves it.
func (c *clientConn) next() step {
	if c.br.Buffered() == 0 {
		c.idle.Store(true)
		if c.s.closing.Load() {
			return stepClose
		}
		c.setReadDeadline(c.s.idleTimeout)
		if _, err := c.br.Peek(1); err != nil {
			return stepClose
		}
	}
	c.idle.Store(false)
	n, ok := c.readHead()
	if !ok {
		return stepClose
	}
	if n <= 0 {
		return stepHandoff
	}
	buf, _ := c.br.Peek(n)
	if !parseHead(buf, &c.head) {
		return stepHandoff
	}
	t := c.s.proxy.table()
	if t == nil {
		return stepHandoff
	}
	c.host = appendRouteKey(c.host[:0], c.head.host)
	r := t.http.getBytes(c.host)
	if r == nil || r.tlsOnly && c.tls == nil || len(r.endpoints) == 0 {
		return stepHandoff // answered by net/http, as before
	}
	c.out = appendRequest(c.out[:0], &c.head, c.peerIP, c.tls != nil)
	a := answer{head: c.head.method[0] == 'H', http10: c.head.http10, keepAlive: c.head.keepAlive}
	_, _ = c.br.Discard(n)
	c.s.proxy.metrics.proxied.Inc()
	if !c.forward(r, r.pick(), &a) || !a.keepAlive {
		return stepClose
	}
	return stepContinue
}

// readHead waits for a complete request head and returns its length; 0 or less when the loop
// does not parse it (too large for the buffer, or unusual framing), false when the client
// left or the header timeout passed.
func (c *clientConn) readHead() (int, bool) {
	extended := false
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		if n := headEnd(buf); n != 0 {
			return n, true
		}
		if len(buf) == c.br.Size() {
			return 0, true
		}
		if !extended {
			c.setReadDeadline(c.s.headerTimeout)
			extended = true
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			return 0, c.br.Buffered() > len(buf)
		}
	}
}

// setReadDeadline sets the client connection's read deadline d from now (none for 0). A
// deadline already set that falls within the last eighth of d, at most deadlineSlack, before
// the new one is kept: on a busy keep-alive connection the idle deadline is reset about once
// a second instead of once a request, which saves a runtime timer update per request.
func (c *clientConn) setReadDeadline(d time.Duration) {
	if d <= 0 {
		c.readDeadline = time.Time{}
		_ = c.conn.SetReadDeadline(time.Time{})
		return
	}
	want := time.Now().Add(d)
	if kept := c.readDeadline; !kept.After(want) && kept.After(want.Add(-min(deadlineSlack, d/8))) {
		return
	}
	c.readDeadline = want
	_ = c.conn.SetReadDeadline(want)
}

// deadlineSlack is the most a client connection's read deadline may fall short of its
// timeout (setReadDeadline).
const deadlineSlack = time.Second

// gone reports whether the client closed its connection, checked by a read of at most a
// millisecond; bytes read (a pipelined request) stay buffered for the loop.
func (c *clientConn) gone() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	c.readDeadline = time.Now().Add(time.Millisecond)
	_ = c.conn.SetReadDeadline(c.readDeadline)
	_, err := c.br.Peek(1)
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// appendRouteKey appends the route key of a Host value (requestHost) to out.
func appendRouteKey(out, host []byte) []byte {
	if i := bytes.LastIndexByte(host, ':'); i >= 0 && bytes.IndexByte(host[i:], ']') < 0 {
		host = host[:i]
	}
	if len(host) > 0 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	for _, b := range host {
		out = append(out, lower(b))
	}
	return out
}
