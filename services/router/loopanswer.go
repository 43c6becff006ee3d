package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"os"
	"strconv"
	"strings"
	"time"
)

// The request loop's exchange with the backend and its answer to the client: the direct
// path's behaviour (direct.go) without net/http's server in between.

// clientCheckInterval is how often the loop, waiting for a backend's answer, checks whether
// the client has left (it has no background read to tell it).
const clientCheckInterval = 500 * time.Millisecond

// errClientGone ends an exchange whose client closed its connection.
var errClientGone = errors.New("client closed the connection")

// Requests whose method http.ReadResponse needs to frame the answer.
var (
	getRequest  = &http.Request{Method: http.MethodGet}
	headRequest = &http.Request{Method: http.MethodHead}
)

// answer is what the loop needs to know to answer one request.
type answer struct {
	head      bool // a HEAD request: no body
	http10    bool // an HTTP/1.0 client
	keepAlive bool // the connection stays open after the answer; cleared when it cannot
}

// forward sends the request in c.out to the route's endpoint at position start, and to the
// next endpoint when the first cannot be connected to, and answers the client. It reports
// whether the connection can serve another request.
func (c *clientConn) forward(r *route, start uint64, a *answer) bool {
	defer c.backend.Store(nil)
	n := uint64(len(r.endpoints))
	resp, bc, err := c.exchange(r.endpoints[start%n].addr, a)
	var de *dialError
	if err != nil && n >= 2 && errors.As(err, &de) {
		resp, bc, err = c.exchange(r.endpoints[(start+1)%n].addr, a)
	}
	if err == nil && resp == nil {
		return c.writeParsed(&c.rhead, bc, a)
	}
	if errors.Is(err, errClientGone) {
		c.s.proxy.log.Debug("client canceled request", "host", string(c.host), "error", err)
		return false
	}
	if err != nil {
		c.s.proxy.metrics.backendErrors.Inc()
		c.s.proxy.log.Debug("backend failed", "host", string(c.host), "error", err)
		return c.writeError(http.StatusBadGateway, fmt.Sprintf("backend unavailable for host %q", c.host), a)
	}
	return c.writeAnswer(resp, bc, a)
}

// exchange sends c.out to addr over an idle pooled connection or a new one and reads the
// answer's head (a nil response: parsed into c.rhead), as proxy.exchange does: a pooled connection that the backend had closed is
// replaced by a new one once.
func (c *clientConn) exchange(addr string, a *answer) (*http.Response, *backendConn, error) {
	pool := c.s.proxy.pool
	bc := pool.get(addr)
	reused := bc != nil
	for {
		if bc == nil {
			var err error
			if bc, err = pool.dial(context.Background(), addr); err != nil {
				return nil, nil, err
			}
		}
		c.backend.Store(bc)
		resp, err := c.roundTrip(bc, a)
		if err == nil {
			return resp, bc, nil
		}
		bc.close()
		if !reused || !staleConn(err) {
			return nil, nil, err
		}
		bc, reused = nil, false
	}
}

// roundTrip writes c.out on bc and reads the answer's head, passing 1xx answers on to the
// client. A head parseRespHead takes is parsed into c.rhead, and the response is nil. It checks every clientCheckInterval whether the client left, and gives up once
// BackendResponseTimeout passed.
func (c *clientConn) roundTrip(bc *backendConn, a *answer) (*http.Response, error) {
	if _, err := bc.bw.Write(c.out); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	if err := bc.bw.Flush(); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	now := time.Now()
	var deadline time.Time
	if d := c.s.proxy.responseTimeout; d > 0 {
		deadline = now.Add(d)
	}
	req := getRequest
	if a.head {
		req = headRequest
	}
	for {
		if err := c.waitHead(bc, now, deadline); err != nil {
			return nil, err
		}
		buf, _ := bc.br.Peek(bc.br.Buffered())
		if n := headEnd(buf); n > 0 && parseRespHead(buf[:n], a.head, &c.rhead) {
			return nil, nil
		}
		resp, err := http.ReadResponse(bc.br, req)
		if err != nil {
			return nil, fmt.Errorf("read response: %w", err)
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("read response: 101 Switching Protocols to a request without Upgrade")
		case resp.StatusCode >= 100 && resp.StatusCode < 200:
			if !a.http10 {
				c.writeInformational(resp)
			}
			continue
		}
		if resp.Body != http.NoBody && (resp.ContentLength < 0 || int64(bc.br.Buffered()) < resp.ContentLength) {
			bc.setReadDeadline(time.Time{}) // the body may take its time
		}
		return resp, nil
	}
}

// waitHead waits until the first byte of an answer is buffered on bc, until deadline (none
// when zero), checking whether the client left every clientCheckInterval from now, or sooner:
// a check that an earlier exchange on bc set and that falls in the second half of the interval
// is kept, which saves a runtime timer update per request on a busy connection.
func (c *clientConn) waitHead(bc *backendConn, now, deadline time.Time) error {
	if bc.br.Buffered() > 0 {
		return nil
	}
	for {
		check := now.Add(clientCheckInterval)
		if !deadline.IsZero() && deadline.Before(check) {
			check = deadline
		}
		if kept := bc.readDeadline; kept.After(now.Add(clientCheckInterval/2)) && !kept.After(check) {
			check = kept
		} else {
			bc.setReadDeadline(check)
		}
		// Peek first: ReadResponse turns a connection closed before any byte (io.EOF here,
		// the sign of a stale connection) into io.ErrUnexpectedEOF.
		_, err := bc.br.Peek(1)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || check.Equal(deadline) {
			return fmt.Errorf("read response: %w", err)
		}
		if c.gone() {
			return errClientGone
		}
		now = time.Now()
	}
}

// writeInformational passes a 1xx answer on to the client.
func (c *clientConn) writeInformational(resp *http.Response) {
	b := appendStatusLine(c.scratch[:0], resp.StatusCode)
	b = append(b, "\r\n"...)
	for k, vv := range resp.Header {
		for _, v := range vv {
			b = appendHeaderLine(b, k, v)
		}
	}
	b = append(b, "\r\n"...)
	_, _ = c.bw.Write(b)
	_ = c.bw.Flush()
}

// writeAnswer copies resp to the client as copyResponse does (hop-by-hop headers removed,
// trailers passed on, bodies of unknown length and event streams flushed as they come), and
// returns bc to the pool when the exchange left it reusable. It reports whether the client
// connection can serve another request.
func (c *clientConn) writeAnswer(resp *http.Response, bc *backendConn, a *answer) bool {
	removeHopByHop(resp.Header)
	bodyless := a.head || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	chunked := !bodyless && resp.ContentLength < 0
	if chunked && a.http10 {
		a.keepAlive = false // the body ends with the connection
		chunked = false
	}
	if c.s.closing.Load() {
		a.keepAlive = false
	}
	b := appendStatusLine(c.scratch[:0], resp.StatusCode)
	b = append(b, "\r\n"...)
	for k, vv := range resp.Header {
		for _, v := range vv {
			b = appendHeaderLine(b, k, v)
		}
	}
	if _, ok := resp.Header["Date"]; !ok {
		b = append(b, "Date: "...)
		b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
		b = append(b, "\r\n"...)
	}
	if !bodyless && resp.ContentLength >= 0 {
		if _, ok := resp.Header["Content-Length"]; !ok {
			b = append(b, "Content-Length: "...)
			b = strconv.AppendInt(b, resp.ContentLength, 10)
			b = append(b, "\r\n"...)
		}
	}
	if chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
		if len(resp.Trailer) > 0 {
			keys := make([]string, 0, len(resp.Trailer))
			for k := range resp.Trailer {
				keys = append(keys, k)
			}
			b = appendHeaderLine(b, "Trailer", strings.Join(keys, ", "))
		}
	}
	b = a.endHead(b)
	c.scratch = b
	if _, err := c.bw.Write(b); err != nil {
		bc.close()
		return false
	}
	flush := resp.ContentLength < 0 || eventStream(resp.Header.Get("Content-Type"))
	var err error
	switch {
	case bodyless:
	case chunked:
		cw := httputil.NewChunkedWriter(c.bw)
		if err = copyFlushing(cw, c.bw, resp.Body, true); err == nil {
			err = closeChunked(cw, c.bw, resp)
		}
	default:
		err = copyFlushing(c.bw, c.bw, resp.Body, flush)
	}
	if err != nil {
		bc.close()
		return false
	}
	_ = resp.Body.Close()
	if resp.Close {
		bc.close()
	} else {
		c.s.proxy.pool.put(bc)
	}
	return c.bw.Flush() == nil
}

// closeChunked ends a chunked body with resp's trailers (read at the body's end).
func closeChunked(cw io.WriteCloser, bw *bufio.Writer, resp *http.Response) error {
	if err := cw.Close(); err != nil {
		return err
	}
	var b []byte
	for k, vv := range resp.Trailer {
		for _, v := range vv {
			b = appendHeaderLine(b, k, v)
		}
	}
	b = append(b, "\r\n"...)
	_, err := bw.Write(b)
	return err
}

// copyFlushing copies body to w through a pooled buffer, flushing bw after each write when
// flush is set; it returns the first read or write error (not io.EOF).
func copyFlushing(w io.Writer, bw *bufio.Writer, body io.Reader, flush bool) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			if flush {
				if err := bw.Flush(); err != nil {
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

// writeError answers as http.Error does, and reports whether the connection can serve
// another request.
func (c *clientConn) writeError(code int, msg string, a *answer) bool {
	if c.s.closing.Load() {
		a.keepAlive = false
	}
	body := msg + "\n"
	b := appendStatusLine(c.scratch[:0], code)
	b = append(b, "\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: "...)
	b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n"...)
	b = a.endHead(b)
	if !a.head {
		b = append(b, body...)
	}
	c.scratch = b
	_, _ = c.bw.Write(b)
	return c.bw.Flush() == nil
}

// appendHeaderLine appends one header line.
func appendHeaderLine(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ": "...)
	b = append(b, v...)
	return append(b, "\r\n"...)
}

// statusText is the reason phrase net/http writes for code.
func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return t
	}
	return "status code " + strconv.Itoa(code)
}

// endHead ends an answer head written to b: the Connection header the client needs (close for
// an HTTP/1.1 connection that ends, keep-alive for an HTTP/1.0 one that stays), then the blank
// line.
func (a *answer) endHead(b []byte) []byte {
	switch {
	case !a.keepAlive && !a.http10:
		b = append(b, "Connection: close\r\n"...)
	case a.keepAlive && a.http10:
		b = append(b, "Connection: keep-alive\r\n"...)
	}
	return append(b, "\r\n"...)
}
