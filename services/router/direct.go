package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The direct path proxies the common request, a GET or HEAD without a body and without an
// upgrade, over the router's own pool of HTTP/1.1 backend connections: the handler's goroutine
// writes the request and reads the answer itself. httputil.ReverseProxy over http.Transport
// does the same work with a copy of the request, a context per request, and two goroutines
// per backend connection that every request hands off to and back from; in the bench-router
// profile that machinery cost more CPU than the router's own code. Every other request goes
// through ReverseProxy (see docs/decisions/0034-router-direct-path.md). Both paths send the
// same request and the same answers.

// directEligible reports whether req may take the direct path: a GET or HEAD without a body,
// without an upgrade, whose query ReverseProxy would pass on unchanged.
func directEligible(req *http.Request) bool {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return false
	}
	if req.Body != http.NoBody && req.Body != nil {
		return false
	}
	if _, ok := req.Header["Upgrade"]; ok {
		return false
	}
	return plainQuery(req.URL.RawQuery)
}

// plainQuery reports whether ReverseProxy forwards the query q as it is: it re-encodes queries
// with a ';', a malformed escape, or very many parameters.
func plainQuery(q string) bool {
	if strings.Count(q, "&") >= 100 {
		return false
	}
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case ';':
			return false
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return false
			}
		}
	}
	return true
}

// isHex reports whether c is a hexadecimal digit.
func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// serveDirect proxies req (directEligible) to the route's chosen endpoint, and once more to
// the next endpoint when the first cannot be connected to.
func (p *proxy) serveDirect(w http.ResponseWriter, req *http.Request, tgt *proxyTarget) {
	n := uint64(len(tgt.endpoints))
	resp, bc, err := p.exchange(w, req, tgt.endpoints[tgt.start%n].addr)
	var de *dialError
	if err != nil && n >= 2 && errors.As(err, &de) && req.Context().Err() == nil {
		resp, bc, err = p.exchange(w, req, tgt.endpoints[(tgt.start+1)%n].addr)
	}
	if err != nil {
		p.backendError(w, req, err)
		return
	}
	p.copyResponse(w, req, resp, bc)
}

// exchange sends req to addr over an idle pooled connection or a new one, and reads the
// response's head. A pooled connection that turns out closed by the backend (it timed out
// idling, or the instance stopped) is replaced by a new connection once: the request is a
// GET or HEAD, safe to send again. Errors connecting are *dialError.
func (p *proxy) exchange(w http.ResponseWriter, req *http.Request, addr string) (*http.Response, *backendConn, error) {
	bc := p.pool.get(addr)
	reused := bc != nil
	for {
		if bc == nil {
			var err error
			if bc, err = p.pool.dial(req.Context(), addr); err != nil {
				return nil, nil, err
			}
		}
		resp, err := p.roundTrip(w, req, bc)
		if err == nil {
			return resp, bc, nil
		}
		bc.stop()
		bc.close()
		if !reused || !staleConn(err) || req.Context().Err() != nil {
			return nil, nil, err
		}
		bc, reused = nil, false
	}
}

// staleConn reports whether err, from a request on a reused connection, means that the
// backend had closed the connection before it saw the request.
func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// roundTrip writes req on bc and reads the response's head, passing 1xx answers on to the
// client (w) as ReverseProxy does. The client's going away, or BackendResponseTimeout passing
// before the head arrives, ends the wait.
func (p *proxy) roundTrip(w http.ResponseWriter, req *http.Request, bc *backendConn) (*http.Response, error) {
	bc.stop = context.AfterFunc(req.Context(), bc.abort)
	writeRequest(bc.bw, req)
	if err := bc.bw.Flush(); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	if p.responseTimeout > 0 {
		bc.setReadDeadline(time.Now().Add(p.responseTimeout))
	}
	for {
		// Peek first: ReadResponse turns a connection closed before any byte (io.EOF here,
		// the sign of a stale connection) into io.ErrUnexpectedEOF.
		_, err := bc.br.Peek(1)
		var resp *http.Response
		if err == nil {
			resp, err = http.ReadResponse(bc.br, req)
		}
		if err != nil {
			if cerr := req.Context().Err(); cerr != nil {
				return nil, fmt.Errorf("read response: %w", cerr)
			}
			return nil, fmt.Errorf("read response: %w", err)
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("read response: 101 Switching Protocols to a request without Upgrade")
		case resp.StatusCode >= 100 && resp.StatusCode < 200:
			// Passed on; the final answer follows. WriteHeader does not clear the header
			// after a 1xx, so clear it here.
			h := w.Header()
			for k, vv := range resp.Header {
				h[k] = append(h[k], vv...)
			}
			w.WriteHeader(resp.StatusCode)
			clear(h)
			continue
		}
		if p.responseTimeout > 0 {
			bc.setReadDeadline(time.Time{})
		}
		return resp, nil
	}
}

// copyResponse answers the client with resp as ReverseProxy does (hop-by-hop headers
// removed, trailers passed on, streamed bodies flushed as they come) and returns bc to the
// pool when the exchange left it reusable.
func (p *proxy) copyResponse(w http.ResponseWriter, req *http.Request, resp *http.Response, bc *backendConn) {
	removeHopByHop(resp.Header)
	h := w.Header()
	for k, vv := range resp.Header {
		h[k] = vv
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		h.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)
	flush := resp.ContentLength == -1 || eventStream(resp.Header.Get("Content-Type"))
	err := copyBody(w, resp.Body, flush)
	if err != nil {
		bc.stop()
		bc.close()
		// As ReverseProxy: the answer cannot be completed, so the server aborts it.
		panic(http.ErrAbortHandler)
	}
	resp.Body.Close() // at EOF already; fills resp.Trailer
	if !bc.stop() || resp.Close {
		bc.close() // the client went away (the connection's deadline is spoiled) or the backend closes
	} else {
		p.pool.put(bc)
	}
	if len(resp.Trailer) > 0 {
		// Force chunking: no Content-Length computed for a short body with trailers.
		_ = http.NewResponseController(w).Flush()
	}
	if len(resp.Trailer) == announced {
		for k, vv := range resp.Trailer {
			h[k] = append(h[k], vv...)
		}
		return
	}
	for k, vv := range resp.Trailer {
		h[http.TrailerPrefix+k] = append(h[http.TrailerPrefix+k], vv...)
	}
}

// eventStream reports whether the content type ct is Server-Sent Events.
func eventStream(ct string) bool {
	if ct == "" {
		return false
	}
	base, _, _ := mime.ParseMediaType(ct)
	return base == "text/event-stream"
}

// copyBody copies body to w through a pooled buffer, flushing after each write when flush is
// set; it returns the first read or write error (not io.EOF).
func copyBody(w http.ResponseWriter, body io.Reader, flush bool) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var rc *http.ResponseController
	if flush {
		rc = http.NewResponseController(w)
	}
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			if rc != nil {
				if err := rc.Flush(); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// hopHeaders are the hop-by-hop headers ReverseProxy removes (RFC 9110 §7.6.1), besides those
// the Connection header names.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopByHop deletes the hop-by-hop headers from h.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, f := range hopHeaders {
		delete(h, f)
	}
}

// skipRequestHeader reports whether the request header k is not forwarded as it is: a
// hop-by-hop header, a header the client's Connection names, or one the router sets itself.
func skipRequestHeader(k string, connection []string) bool {
	switch k {
	case "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	if slices.Contains(hopHeaders, k) {
		return true
	}
	for _, f := range connection {
		for sf := range strings.SplitSeq(f, ",") {
			if strings.EqualFold(textproto.TrimString(sf), k) {
				return true
			}
		}
	}
	return false
}

// writeRequest writes req in HTTP/1.1 to bw as ReverseProxy with the router's rewrite sends
// it: the client's Host, method and request URI; its headers without hop-by-hop ones;
// X-Forwarded-For (the client's value, then the peer IP), X-Forwarded-Host and
// X-Forwarded-Proto; and Te: trailers when the client accepts trailers.
func writeRequest(bw *bufio.Writer, req *http.Request) {
	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(req.URL.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(req.Host)
	bw.WriteString("\r\n")
	connection := req.Header["Connection"]
	for k, vv := range req.Header {
		if skipRequestHeader(k, connection) {
			continue
		}
		for _, v := range vv {
			writeHeader(bw, k, v)
		}
	}
	if te := req.Header["Te"]; len(te) > 0 && headerHasToken(te, "trailers") {
		writeHeader(bw, "Te", "trailers")
	}
	if clientIP, _, err := net.SplitHostPort(req.RemoteAddr); err == nil {
		bw.WriteString("X-Forwarded-For: ")
		for _, v := range req.Header["X-Forwarded-For"] {
			bw.WriteString(v)
			bw.WriteString(", ")
		}
		bw.WriteString(clientIP)
		bw.WriteString("\r\n")
	}
	writeHeader(bw, "X-Forwarded-Host", req.Host)
	if req.TLS != nil {
		bw.WriteString("X-Forwarded-Proto: https\r\n\r\n")
	} else {
		bw.WriteString("X-Forwarded-Proto: http\r\n\r\n")
	}
}

// writeHeader writes one header line; values were checked by the server that read them.
func writeHeader(bw *bufio.Writer, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(textproto.TrimString(v))
	bw.WriteString("\r\n")
}

// headerHasToken reports whether a comma-separated header value holds token
// (case-insensitively).
func headerHasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}

// backendConn is one HTTP/1.1 connection to a backend of the direct path.
type backendConn struct {
	conn      net.Conn
	addr      string
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
	stop      func() bool // unregisters the current request's abort; false once it ran
	// readDeadline is the read deadline as last set through setReadDeadline (zero: none).
	readDeadline time.Time
}

// setReadDeadline sets the connection's read deadline to t (none when zero).
func (c *backendConn) setReadDeadline(t time.Time) {
	c.readDeadline = t
	_ = c.conn.SetReadDeadline(t)
}

// abort interrupts the connection's reads and writes (the client went away).
func (c *backendConn) abort() { _ = c.conn.SetDeadline(time.Unix(1, 0)) }

// close closes the connection.
func (c *backendConn) close() { _ = c.conn.Close() }

// backendPool keeps the idle connections of the direct path, per backend address: at most
// maxIdle each, closed once idle for idleTimeout (by reap).
type backendPool struct {
	dialer      func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle     int
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   map[string][]*backendConn // oldest first
	closed bool
}

// newBackendPool is an empty pool that dials with dialer.
func newBackendPool(dialer func(ctx context.Context, network, addr string) (net.Conn, error), maxIdle int, idleTimeout time.Duration) *backendPool {
	return &backendPool{dialer: dialer, maxIdle: maxIdle, idleTimeout: idleTimeout, idle: map[string][]*backendConn{}}
}

// dial connects to addr; its errors are *dialError.
func (p *backendPool) dial(ctx context.Context, addr string) (*backendConn, error) {
	c, err := p.dialer(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &backendConn{conn: c, addr: addr, br: bufio.NewReader(c), bw: bufio.NewWriter(c)}, nil
}

// get takes addr's most recently used idle connection, or returns nil.
func (p *backendPool) get(addr string) *backendConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[addr]
	if len(l) == 0 {
		return nil
	}
	c := l[len(l)-1]
	l[len(l)-1] = nil
	p.idle[addr] = l[:len(l)-1]
	return c
}

// put returns a connection whose exchange completed; it is closed when addr has maxIdle idle
// connections already, or the pool is closed.
func (p *backendPool) put(c *backendConn) {
	c.idleSince = time.Now()
	p.mu.Lock()
	if p.closed || len(p.idle[c.addr]) >= p.maxIdle {
		p.mu.Unlock()
		c.close()
		return
	}
	p.idle[c.addr] = append(p.idle[c.addr], c)
	p.mu.Unlock()
}

// reap closes connections idle for idleTimeout, checking every idleTimeout/2, until ctx ends;
// then it closes every idle connection and the pool.
func (p *backendPool) reap(ctx context.Context) error {
	tick := time.NewTicker(max(p.idleTimeout/2, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			p.close()
			return nil
		case now := <-tick.C:
			p.closeIdleSince(now.Add(-p.idleTimeout))
		}
	}
}

// closeIdleSince closes the idle connections unused since before t.
func (p *backendPool) closeIdleSince(t time.Time) {
	var old []*backendConn
	p.mu.Lock()
	for addr, l := range p.idle {
		i := 0
		for i < len(l) && l[i].idleSince.Before(t) {
			i++
		}
		if i == 0 {
			continue
		}
		old = append(old, l[:i]...)
		if i == len(l) {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = append([]*backendConn(nil), l[i:]...)
		}
	}
	p.mu.Unlock()
	for _, c := range old {
		c.close()
	}
}

// close closes every idle connection; connections put back later are closed.
func (p *backendPool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = map[string][]*backendConn{}
	p.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			c.close()
		}
	}
}
