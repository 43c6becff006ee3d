package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// proxyTarget is the route chosen for one request, carried in its context from the handler to
// the rewrite and the transport.
type proxyTarget struct {
	host      string
	endpoints []endpoint
	start     uint64 // round-robin position of the first attempt
}

// targetKey is the context key of a *proxyTarget.
type targetKey struct{}

// proxy serves HTTP requests by Host from the router's table.
type proxy struct {
	table           func() *table
	redirectPort    func() int
	rp              *httputil.ReverseProxy
	transport       *http.Transport // ReverseProxy's
	pool            *backendPool    // the direct path's
	responseTimeout time.Duration   // BackendResponseTimeout
	log             hclog.Logger
	metrics         *metrics
}

// newProxy builds the handler shared by the HTTP and HTTPS listeners.
func newProxy(cfg Config, tbl func() *table, redirectPort func() int, log hclog.Logger, m *metrics) *proxy {
	dialer := &net.Dialer{Timeout: time.Duration(cfg.BackendDialTimeout), KeepAlive: 30 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, &dialError{err: err}
		}
		return c, nil
	}
	transport := &http.Transport{
		DialContext:           dial,
		MaxIdleConns:          0, // no global limit; bounded per backend
		MaxIdleConnsPerHost:   cfg.BackendMaxIdleConnsPerHost,
		IdleConnTimeout:       time.Duration(cfg.BackendIdleConnTimeout),
		ResponseHeaderTimeout: time.Duration(cfg.BackendResponseTimeout),
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass Accept-Encoding and bodies through untouched
	}
	p := &proxy{table: tbl, redirectPort: redirectPort, transport: transport, log: log, metrics: m,
		pool:            newBackendPool(dial, cfg.BackendMaxIdleConnsPerHost, time.Duration(cfg.BackendIdleConnTimeout)),
		responseTimeout: time.Duration(cfg.BackendResponseTimeout)}
	p.rp = &httputil.ReverseProxy{
		Rewrite:      rewrite,
		Transport:    &retryTransport{base: transport},
		BufferPool:   bufferPool{},
		ErrorHandler: p.backendError,
		ErrorLog:     log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
	}
	return p
}

// ServeHTTP answers one request: 503 before the first table, 404 for an unknown host, a 301 to
// https for a tls_only route over plain HTTP, 503 for a route without endpoints, else the
// response of one of the route's endpoints (round-robin), or 502 when none can be reached.
func (p *proxy) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	t := p.table()
	if t == nil {
		p.metrics.notLoaded.Inc()
		http.Error(w, "routing table not loaded yet", http.StatusServiceUnavailable)
		return
	}
	host := requestHost(req.Host)
	r := t.http.get(host)
	switch {
	case r == nil:
		p.metrics.unknownHost.Inc()
		http.Error(w, fmt.Sprintf("unknown host %q", host), http.StatusNotFound)
		return
	case r.tlsOnly && req.TLS == nil:
		p.metrics.redirects.Inc()
		p.redirect(w, req, host)
		return
	case len(r.endpoints) == 0:
		p.metrics.noEndpoints.Inc()
		http.Error(w, fmt.Sprintf("no endpoints for host %q", host), http.StatusServiceUnavailable)
		return
	}
	p.metrics.proxied.Inc()
	tgt := &proxyTarget{host: host, endpoints: r.endpoints, start: r.pick()}
	if directEligible(req) {
		p.serveDirect(w, req, tgt)
		return
	}
	p.rp.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), targetKey{}, tgt)))
}

// redirect sends a tls_only route's plain request to the same URL over https.
func (p *proxy) redirect(w http.ResponseWriter, req *http.Request, host string) {
	if port := p.redirectPort(); port != 443 {
		host = net.JoinHostPort(trimBrackets(host), strconv.Itoa(port))
	}
	http.Redirect(w, req, "https://"+host+req.URL.RequestURI(), http.StatusMovedPermanently)
}

// trimBrackets removes the brackets of an IPv6 literal host.
func trimBrackets(h string) string {
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}

// rewrite points the outgoing request at the chosen endpoint, keeps the client's Host, and
// sets X-Forwarded-For (appending to the client's), X-Forwarded-Host and X-Forwarded-Proto.
func rewrite(pr *httputil.ProxyRequest) {
	tgt := pr.In.Context().Value(targetKey{}).(*proxyTarget)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = tgt.endpoints[tgt.start%uint64(len(tgt.endpoints))].addr
	if prior, ok := pr.In.Header["X-Forwarded-For"]; ok {
		pr.Out.Header["X-Forwarded-For"] = prior
	}
	pr.SetXForwarded()
}

// backendError answers 502 when no endpoint produced a response.
func (p *proxy) backendError(w http.ResponseWriter, req *http.Request, err error) {
	host := requestHost(req.Host)
	if req.Context().Err() != nil {
		// The client went away; nobody reads this answer.
		p.log.Debug("client canceled request", "host", host, "error", err)
	} else {
		p.metrics.backendErrors.Inc()
		p.log.Debug("backend failed", "host", host, "error", err)
	}
	http.Error(w, fmt.Sprintf("backend unavailable for host %q", host), http.StatusBadGateway)
}

// dialError marks an error from connecting to a backend: nothing was sent, so the request may
// go to another endpoint.
type dialError struct{ err error }

// Error implements error.
func (e *dialError) Error() string { return "dial backend: " + e.err.Error() }

// Unwrap returns the dial error.
func (e *dialError) Unwrap() error { return e.err }

// retryTransport sends a request to its target endpoint and, when the connection cannot be
// made, once more to the route's next endpoint.
type retryTransport struct {
	base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tgt, _ := req.Context().Value(targetKey{}).(*proxyTarget)
	if tgt == nil || len(tgt.endpoints) < 2 {
		return t.base.RoundTrip(req)
	}
	var body *retryBody
	if req.Body != nil && req.Body != http.NoBody {
		// The transport closes the body when it fails; keep it open for the retry (the server
		// closes the client's body when the handler returns).
		body = &retryBody{ReadCloser: req.Body}
		req = req.WithContext(req.Context())
		req.Body = body
	}
	resp, err := t.base.RoundTrip(req)
	var de *dialError
	if err == nil || !errors.As(err, &de) || (body != nil && body.read.Load()) || req.Context().Err() != nil {
		return resp, err
	}
	retry := req.WithContext(req.Context())
	u := *req.URL
	u.Host = tgt.endpoints[(tgt.start+1)%uint64(len(tgt.endpoints))].addr
	retry.URL = &u
	return t.base.RoundTrip(retry)
}

// retryBody is a request body whose Close is left to the server, recording whether any of it
// was read.
type retryBody struct {
	io.ReadCloser
	read atomic.Bool
}

// Read implements io.Reader.
func (b *retryBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.ReadCloser.Read(p)
}

// Close implements io.Closer; the server closes the underlying body.
func (b *retryBody) Close() error { return nil }

// bufPool holds the copy buffers of proxied bodies.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32*1024); return &b }}

// bufferPool adapts bufPool to httputil.BufferPool.
type bufferPool struct{}

// Get implements httputil.BufferPool.
func (bufferPool) Get() []byte { return *bufPool.Get().(*[]byte) }

// Put implements httputil.BufferPool.
func (bufferPool) Put(b []byte) { bufPool.Put(&b) }
