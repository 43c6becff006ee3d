package router

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
)

// A client connection that the request loop (loop.go) does not serve is handed to net/http's
// server for the rest of its life: handoffListener feeds http.Server.Serve, and prefixConn
// replays the bytes the loop had read already.

// handoffListener is a net.Listener whose connections are pushed to it.
type handoffListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// newHandoffListener is a listener that reports addr as its address.
func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *handoffListener) Addr() net.Addr { return l.addr }

// push hands c to the server, or closes it once the listener is closed.
func (l *handoffListener) push(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		_ = c.Close()
	}
}

// prefixConn is a connection whose first bytes come from a reader that had buffered them. It
// carries the TLS state of a TLS connection, which net/http cannot see through the wrapper.
type prefixConn struct {
	net.Conn
	br  *bufio.Reader // nil once drained
	tls *tls.ConnectionState
}

// Read implements net.Conn.
func (c *prefixConn) Read(p []byte) (int, error) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			return c.br.Read(p)
		}
		c.br = nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes a TCP connection, as net/http does before closing after an error.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// tlsStateKey is the context key of a handed-off TLS connection's *tls.ConnectionState.
type tlsStateKey struct{}

// handoffConnContext records a handed-off TLS connection's state in its context.
func handoffConnContext(ctx context.Context, c net.Conn) context.Context {
	if pc, ok := c.(*prefixConn); ok && pc.tls != nil {
		return context.WithValue(ctx, tlsStateKey{}, pc.tls)
	}
	return ctx
}

// withTLSState gives requests of handed-off TLS connections their TLS state (req.TLS), so
// they are served as HTTPS.
func withTLSState(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.TLS == nil {
			if st, ok := req.Context().Value(tlsStateKey{}).(*tls.ConnectionState); ok {
				req.TLS = st
			}
		}
		h.ServeHTTP(w, req)
	})
}
