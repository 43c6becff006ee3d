package router

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The direct path (GET and HEAD without a body) and ReverseProxy (everything else) send the
// backend the same headers.
func TestHTTPDirectSendsWhatReverseProxySends(t *testing.T) {
	a := newBackend(t, "a")
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, a.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)

	send := func(method string) (string, http.Header) {
		t.Helper()
		req, err := http.NewRequest(method, httpBase(r)+"/p/a%20th?q=1&r=%41", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "App.example.com:81"
		req.Header.Set("X-Forwarded-For", "10.0.0.1")
		req.Header.Add("X-Forwarded-For", "10.0.0.2")
		req.Header.Set("X-Forwarded-Host", "spoofed")
		req.Header.Set("Forwarded", "for=1.2.3.4")
		req.Header.Set("Connection", "X-Hop, keep-alive")
		req.Header.Set("X-Hop", "dropped")
		req.Header.Set("Keep-Alive", "timeout=5")
		req.Header.Set("Te", "trailers, deflate")
		req.Header.Set("X-App", "kept")
		req.Header.Add("X-Multi", "1")
		req.Header.Add("X-Multi", "2")
		req.Header.Set("User-Agent", "")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", method, resp.Status)
		}
		host, h := a.last()
		return host, h
	}
	directHost, direct := send(http.MethodGet)
	rpHost, rp := send(http.MethodOptions)
	if directHost != rpHost || directHost != "App.example.com:81" {
		t.Errorf("Host: direct %q, ReverseProxy %q", directHost, rpHost)
	}
	if !reflect.DeepEqual(direct, rp) {
		t.Errorf("headers differ:\ndirect:       %v\nReverseProxy: %v", direct, rp)
	}
	if got := direct.Get("X-Forwarded-For"); got != "10.0.0.1, 10.0.0.2, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q", got)
	}
}

// The direct path keeps backend connections alive, and a kept connection that the backend
// closed (idle timeout, instance restarted on the same address) costs no failed request, even
// with a single endpoint.
func TestHTTPDirectReusesConnectionsAndSurvivesTheirClosing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	var conns atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	serve := func(ln net.Listener) *httptest.Server {
		s := httptest.NewUnstartedServer(handler)
		s.Listener.Close()
		s.Listener = ln
		s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		}
		s.Start()
		return s
	}
	srv := serve(ln)
	t.Cleanup(func() { srv.Close() })
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, addr))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)

	for i := 0; i < 5; i++ {
		if code, body := get(t, http.DefaultClient, httpBase(r), "app.example.com", "/"); code != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("5 sequential requests used %d backend connections, want 1", n)
	}

	srv.CloseClientConnections() // the backend closes the idle connection
	if code, body := get(t, http.DefaultClient, httpBase(r), "app.example.com", "/"); code != 200 || body != "ok" {
		t.Fatalf("after the backend closed the connection: %d %q", code, body)
	}

	// The instance restarts on the same address.
	srv.Close()
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv = serve(ln2)
	if code, body := get(t, http.DefaultClient, httpBase(r), "app.example.com", "/"); code != 200 || body != "ok" {
		t.Fatalf("after the backend restarted: %d %q", code, body)
	}
}

// GETs too go to the next endpoint when the first cannot be connected to.
func TestHTTPDirectRetriesNextEndpoint(t *testing.T) {
	live := newBackend(t, "live")
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, deadAddr(t), live.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)
	for i := 0; i < 6; i++ {
		if code, body := get(t, http.DefaultClient, httpBase(r), "app.example.com", "/"); code != 200 || body != "live" {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
}

// Streamed bodies are flushed as they come, trailers and 1xx answers are passed on, and HEAD
// keeps the backend's Content-Length.
func TestHTTPDirectStreamsTrailers1xxAndHead(t *testing.T) {
	next := make(chan struct{})
	b := newBackend(t, "b")
	b.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Trailer", "X-Sum")
			_, _ = io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, "second\n")
			w.Header().Set("X-Sum", "42")
		case "/hints":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			_, _ = io.WriteString(w, "final")
		case "/head":
			w.Header().Set("Content-Length", "1234")
		}
	})
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, b.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)

	req, _ := http.NewRequest(http.MethodGet, httpBase(r)+"/stream", nil)
	req.Host = "app.example.com"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	// The first line arrives while the backend waits: the router flushed it.
	if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("first line: %q %v", line, err)
	}
	close(next)
	rest, err := io.ReadAll(br)
	resp.Body.Close()
	if err != nil || string(rest) != "second\n" {
		t.Fatalf("rest: %q %v", rest, err)
	}
	if got := resp.Trailer.Get("X-Sum"); got != "42" {
		t.Fatalf("trailer X-Sum = %q (trailers %v)", got, resp.Trailer)
	}

	var hints []textproto.MIMEHeader
	var mu sync.Mutex
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		mu.Lock()
		defer mu.Unlock()
		if code == http.StatusEarlyHints {
			hints = append(hints, h)
		}
		return nil
	}}
	req, _ = http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, httpBase(r)+"/hints", nil)
	req.Host = "app.example.com"
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	mu.Lock()
	if string(body) != "final" || len(hints) != 1 || hints[0].Get("Link") != "</style.css>; rel=preload" || resp.Header.Get("Link") != "" {
		t.Fatalf("103 then 200: body %q, hints %v, final Link %q", body, hints, resp.Header.Get("Link"))
	}
	mu.Unlock()

	code, _, h := do(t, http.DefaultClient, http.MethodHead, httpBase(r), "app.example.com", "/head", "")
	if code != http.StatusOK || h.Get("Content-Length") != "1234" {
		t.Fatalf("HEAD: %d Content-Length %q", code, h.Get("Content-Length"))
	}
}

// A client that goes away ends the backend request, and the router does not reuse that
// backend connection.
func TestHTTPDirectClientGoneCancelsBackend(t *testing.T) {
	started, canceled := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	b := newBackend(t, "b")
	b.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) > 1 {
			_, _ = io.WriteString(w, "ok")
			return
		}
		close(started)
		<-r.Context().Done() // the router closed the connection
		close(canceled)
	})
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, b.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, httpBase(r)+"/", nil)
	req.Host = "app.example.com"
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the backend")
	}
	cancel()
	<-done
	select {
	case <-canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend request was not canceled")
	}
	if code, body := get(t, http.DefaultClient, httpBase(r), "app.example.com", "/"); code != 200 || body != "ok" {
		t.Fatalf("next request: %d %q", code, body)
	}
}
