package router

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// rawClient is one client connection to the router on which a test writes requests by hand.
type rawClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

// dialRaw connects to addr; the connection closes when the test ends.
func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // a hang fails the test instead of blocking it
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

// send writes raw bytes.
func (r *rawClient) send(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatal(err)
	}
}

// read reads one answer to a request with method and its whole body.
func (r *rawClient) read(method string) (*http.Response, string) {
	r.t.Helper()
	resp, err := http.ReadResponse(r.br, &http.Request{Method: method})
	if err != nil {
		r.t.Fatalf("read answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

// closed reports whether the router closed the connection (nothing more to read).
func (r *rawClient) closed() bool {
	_, err := r.br.ReadByte()
	return err == io.EOF
}

// loopRouter starts a router with one route, app.example.com, to backends.
func loopRouter(t *testing.T, backends ...string) *Router {
	t.Helper()
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, backends...))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)
	return r
}

func TestLoopKeepAlivePipeliningAndHead(t *testing.T) {
	b := newBackend(t, "b")
	r := loopRouter(t, b.addr())
	c := dialRaw(t, r.HTTPAddr().String())

	c.send("GET /1 HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
	if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "b" {
		t.Fatalf("first: %d %q", resp.StatusCode, body)
	}
	// Three requests in one write; the HEAD's answer has no body, so the next answer follows.
	c.send("GET /2 HTTP/1.1\r\nHost: App.Example.com.:80\r\nX-Forwarded-For: 10.1.1.1\r\n\r\n" +
		"HEAD /3 HTTP/1.1\r\nHost: app.example.com\r\n\r\n" +
		"GET /4?x=1 HTTP/1.1\r\nhost: app.example.com\r\nx-custom: v\r\n\r\n")
	if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "b" {
		t.Fatalf("pipelined GET: %d %q", resp.StatusCode, body)
	}
	if resp, body := c.read("HEAD"); resp.StatusCode != 200 || body != "" || resp.ContentLength != 1 {
		t.Fatalf("pipelined HEAD: %d %q length %d", resp.StatusCode, body, resp.ContentLength)
	}
	resp, body := c.read("GET")
	if resp.StatusCode != 200 || body != "b" || resp.Close {
		t.Fatalf("pipelined GET after HEAD: %d %q close %v", resp.StatusCode, body, resp.Close)
	}
	host, h := b.last()
	if host != "app.example.com" || h.Get("X-Custom") != "v" || h.Get("X-Forwarded-Proto") != "http" ||
		h.Get("X-Forwarded-Host") != "app.example.com" || h.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Fatalf("backend saw Host %q, headers %v", host, h)
	}
	if b.count() != 4 {
		t.Fatalf("backend served %d requests, want 4", b.count())
	}
}

func TestLoopConnectionCloseAndHTTP10(t *testing.T) {
	b := newBackend(t, "b")
	r := loopRouter(t, b.addr())
	addr := r.HTTPAddr().String()

	c := dialRaw(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n")
	if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "b" || !resp.Close {
		t.Fatalf("Connection: close: %d %q close %v", resp.StatusCode, body, resp.Close)
	}
	if !c.closed() {
		t.Fatal("connection open after Connection: close")
	}

	c = dialRaw(t, addr)
	c.send("GET / HTTP/1.0\r\nHost: app.example.com\r\n\r\n")
	if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "b" {
		t.Fatalf("HTTP/1.0: %d %q", resp.StatusCode, body)
	}
	if !c.closed() {
		t.Fatal("HTTP/1.0 connection without keep-alive left open")
	}

	c = dialRaw(t, addr)
	for i := 0; i < 2; i++ {
		c.send("GET / HTTP/1.0\r\nHost: app.example.com\r\nConnection: keep-alive\r\n\r\n")
		resp, body := c.read("GET")
		if resp.StatusCode != 200 || body != "b" || resp.Header.Get("Connection") != "keep-alive" {
			t.Fatalf("HTTP/1.0 keep-alive %d: %d %q Connection %q", i, resp.StatusCode, body, resp.Header.Get("Connection"))
		}
	}
}

// Requests the loop does not serve go to net/http on the same connection, bytes already read
// included: a large head, a body, an oversized head (431).
func TestLoopHandsOffToNetHTTP(t *testing.T) {
	b := newBackend(t, "b")
	r := loopRouter(t, b.addr())
	addr := r.HTTPAddr().String()

	c := dialRaw(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
	if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "b" {
		t.Fatalf("GET: %d %q", resp.StatusCode, body)
	}
	c.send("POST /p HTTP/1.1\r\nHost: app.example.com\r\nContent-Length: 5\r\n\r\nhello" +
		"GET /big HTTP/1.1\r\nHost: app.example.com\r\nX-Big: " + strings.Repeat("x", 6000) + "\r\n\r\n")
	if resp, body := c.read("POST"); resp.StatusCode != 200 || body != "b" {
		t.Fatalf("POST after GET: %d %q", resp.StatusCode, body)
	}
	if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "b" {
		t.Fatalf("GET with a large head: %d %q", resp.StatusCode, body)
	}
	b.mu.Lock()
	bodies := b.bodies
	b.mu.Unlock()
	if len(bodies) != 3 || bodies[1] != "hello" {
		t.Fatalf("backend bodies %q", bodies)
	}

	c = dialRaw(t, addr)
	go func() { // the router stops reading at its limit; the rest may not be written
		_, _ = io.WriteString(c.c, "GET / HTTP/1.1\r\nHost: app.example.com\r\nX-Huge: "+strings.Repeat("x", 1<<20+8192)+"\r\n\r\n")
	}()
	if resp, _ := c.read("GET"); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized head: %d, want 431", resp.StatusCode)
	}
}

func TestLoopUpgradeAfterGet(t *testing.T) {
	up := newBackend(t, "up")
	handler := up.srv.Config.Handler
	up.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !serveEchoUpgrade(w, req) {
			handler.ServeHTTP(w, req)
		}
	})
	r := loopRouter(t, up.addr())
	c := dialRaw(t, r.HTTPAddr().String())
	c.send("GET / HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
	if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "up" {
		t.Fatalf("GET: %d %q", resp.StatusCode, body)
	}
	c.send("GET /ws HTTP/1.1\r\nHost: app.example.com\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	c.send("hi\n")
	if line, err := c.br.ReadString('\n'); err != nil || line != "echo:hi\n" {
		t.Fatalf("upgraded stream: %q %v", line, err)
	}
}

// Over TLS the loop serves HTTP/1.1 as https, a request handed to net/http stays https, and
// HTTP/2 clients are served by net/http.
func TestLoopTLSAndHTTP2(t *testing.T) {
	b := newBackend(t, "b")
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "router")
	if err != nil {
		t.Fatal(err)
	}
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", true, b.addr()))
	cfg := testConfig(fake.addr)
	cfg.HTTPSAddress = "127.0.0.1:0"
	cfg.HTTPSCertFile, cfg.HTTPSKeyFile = pki["router"].CertFile, pki["router"].KeyFile
	r := startRouter(t, cfg)
	waitSynced(t, r)
	caPEM, err := os.ReadFile(pki["router"].CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	base := "https://" + r.HTTPSAddr().String()

	for _, h2 := range []bool{false, true} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: h2}
		t.Cleanup(tr.CloseIdleConnections)
		client := &http.Client{Timeout: 10 * time.Second, Transport: tr}
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodGet} {
			body := ""
			if method == http.MethodPost {
				body = "x"
			}
			req, _ := http.NewRequest(method, base+"/", strings.NewReader(body))
			req.Host = "app.example.com"
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("h2 %v %s: %v", h2, method, err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(got) != "b" || (resp.ProtoMajor == 2) != h2 {
				t.Fatalf("h2 %v %s: %d %q over %s", h2, method, resp.StatusCode, got, resp.Proto)
			}
			if _, bh := b.last(); bh.Get("X-Forwarded-Proto") != "https" {
				t.Fatalf("h2 %v %s: X-Forwarded-Proto %q", h2, method, bh.Get("X-Forwarded-Proto"))
			}
		}
	}
}

// Backends that restart between requests cost no GET: the stale pooled connection is
// replaced.
func TestLoopBackendRestartLosesNoGet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	serve := func(ln net.Listener) *http.Server {
		s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
		go func() { _ = s.Serve(ln) }()
		return s
	}
	srv := serve(ln)
	t.Cleanup(func() { srv.Close() })
	r := loopRouter(t, addr)
	c := dialRaw(t, r.HTTPAddr().String())
	for i := 0; i < 6; i++ {
		if i%2 == 1 {
			srv.Close() // closes the router's kept connection too
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			srv = serve(ln)
		}
		c.send("GET / HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
		if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
}

// Stopping the router lets the request in flight finish, with Connection: close, and closes
// idle connections.
func TestLoopShutdownDrains(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	b := newBackend(t, "b")
	handler := b.srv.Config.Handler
	b.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/slow" {
			close(started)
			<-release
		}
		handler.ServeHTTP(w, req)
	})
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, b.addr()))
	cfg := testConfig(fake.addr)
	cfg.ShutdownTimeout = Duration(20 * time.Second)
	r, stop, done := runRouter(t, cfg)

	idle := dialRaw(t, r.HTTPAddr().String())
	idle.send("GET / HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
	idle.read("GET")
	busy := dialRaw(t, r.HTTPAddr().String())
	busy.send("GET /slow HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
	<-started
	stop()
	if !idle.closed() {
		t.Fatal("idle connection left open on shutdown")
	}
	close(release)
	if resp, body := busy.read("GET"); resp.StatusCode != 200 || body != "b" || !resp.Close {
		t.Fatalf("request in flight at shutdown: %d %q close %v", resp.StatusCode, body, resp.Close)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A body of unknown length is chunked for HTTP/1.1 clients, and ends with the connection for
// HTTP/1.0 clients.
func TestLoopBodyOfUnknownLength(t *testing.T) {
	b := newBackend(t, "b")
	b.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "one,")
		w.(http.Flusher).Flush() // no Content-Length: chunked from the backend
		_, _ = io.WriteString(w, "two")
	})
	r := loopRouter(t, b.addr())
	addr := r.HTTPAddr().String()

	c := dialRaw(t, addr)
	for i := 0; i < 2; i++ {
		c.send("GET / HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
		resp, body := c.read("GET")
		if resp.StatusCode != 200 || body != "one,two" || len(resp.TransferEncoding) != 1 || resp.Close {
			t.Fatalf("HTTP/1.1 %d: %d %q transfer encoding %v close %v", i, resp.StatusCode, body, resp.TransferEncoding, resp.Close)
		}
	}

	c = dialRaw(t, addr)
	c.send("GET / HTTP/1.0\r\nHost: app.example.com\r\nConnection: keep-alive\r\n\r\n")
	resp, body := c.read("GET")
	if resp.StatusCode != 200 || body != "one,two" || resp.TransferEncoding != nil || resp.ContentLength != -1 {
		t.Fatalf("HTTP/1.0: %d %q transfer encoding %v length %d", resp.StatusCode, body, resp.TransferEncoding, resp.ContentLength)
	}
	if !c.closed() {
		t.Fatal("HTTP/1.0 connection open after a body of unknown length")
	}
}

// Past shutdown_timeout the router stops even while a backend holds an answer half sent.
func TestLoopShutdownTimeoutEndsStuckExchanges(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	b := newBackend(t, "b")
	b.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "10")
		_, _ = io.WriteString(w, "abc")
		w.(http.Flusher).Flush()
		close(started)
		<-release
	})
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, b.addr()))
	cfg := testConfig(fake.addr)
	cfg.ShutdownTimeout = Duration(100 * time.Millisecond)
	r, stop, done := runRouter(t, cfg)

	c := dialRaw(t, r.HTTPAddr().String())
	c.send("GET / HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
	<-started
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
	}
	if err == nil {
		t.Fatal("a complete answer from a backend that never finished")
	}
}

// TestLoopWaitsAfterAFastAnswer: the read deadlines the loop keeps between requests of a busy
// connection (setReadDeadline, waitHead) still end a wait. On one client connection, and so on
// one backend connection, a fast answer is followed by a slow request: the client leaving is
// noticed and the backend's request cancelled within the check interval, and, with a response
// timeout shorter than the interval, the slow request is answered 502 once it passes.
func TestLoopWaitsAfterAFastAnswer(t *testing.T) {
	canceled := make(chan struct{}, 4)
	b := newBackend(t, "b")
	b.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fast" {
			_, _ = io.WriteString(w, "fast")
			return
		}
		select {
		case <-time.After(10 * time.Second):
		case <-r.Context().Done():
			canceled <- struct{}{}
		}
	})
	fast := func(c *rawClient) {
		t.Helper()
		c.send("GET /fast HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
		if resp, body := c.read("GET"); resp.StatusCode != 200 || body != "fast" {
			t.Fatalf("fast: %d %q", resp.StatusCode, body)
		}
	}

	t.Run("client leaves", func(t *testing.T) {
		r := loopRouter(t, b.addr())
		c := dialRaw(t, r.HTTPAddr().String())
		fast(c)
		fast(c)
		c.send("GET /slow HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
		time.Sleep(50 * time.Millisecond)
		left := time.Now()
		c.c.Close()
		select {
		case <-canceled:
			t.Logf("backend request cancelled %v after the client left", time.Since(left).Round(time.Millisecond))
		case <-time.After(5 * time.Second):
			t.Fatal("the backend request was not cancelled after the client left")
		}
	})

	t.Run("response timeout", func(t *testing.T) {
		fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, b.addr()))
		cfg := testConfig(fake.addr)
		cfg.BackendResponseTimeout = Duration(200 * time.Millisecond)
		r := startRouter(t, cfg)
		waitSynced(t, r)
		c := dialRaw(t, r.HTTPAddr().String())
		fast(c)
		fast(c)
		sent := time.Now()
		c.send("GET /slow HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
		resp, _ := c.read("GET")
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("slow request answered %d, want 502 after the response timeout", resp.StatusCode)
		}
		if waited := time.Since(sent); waited < 200*time.Millisecond {
			t.Fatalf("answered 502 after %v, before the 200ms response timeout", waited)
		}
	})
}
