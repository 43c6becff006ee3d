package router

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

func TestHTTPRoundRobinByHost(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, a.addr(), b.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)

	var seq []string
	for i := 0; i < 10; i++ {
		// Case and port of the Host do not matter.
		code, body := get(t, http.DefaultClient, httpBase(r), "App.Example.COM:8080", "/x")
		if code != http.StatusOK {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
		seq = append(seq, body)
	}
	if a.count() != 5 || b.count() != 5 {
		t.Fatalf("a got %d, b got %d requests; want 5 each (%v)", a.count(), b.count(), seq)
	}
	for i := 1; i < len(seq); i++ {
		if seq[i] == seq[i-1] {
			t.Fatalf("not round-robin: %v", seq)
		}
	}
	host, h := a.last()
	if host != "App.Example.COM:8080" {
		t.Errorf("backend saw Host %q, want the client's", host)
	}
	if got := h.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q", got)
	}
	if got := h.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto = %q", got)
	}
	if got := h.Get("X-Forwarded-Host"); got != "App.Example.COM:8080" {
		t.Errorf("X-Forwarded-Host = %q", got)
	}

	// A client's X-Forwarded-For is kept and extended.
	v := fake.upsert(httpRoute("xff.example.com", false, a.addr()))
	waitVersion(t, r, "t1", v)
	req, _ := http.NewRequest(http.MethodGet, httpBase(r)+"/", nil)
	req.Host = "xff.example.com"
	req.Header.Set("X-Forwarded-For", "10.0.0.1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, h := a.last(); h.Get("X-Forwarded-For") != "10.0.0.1, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want the client's with ours appended", h.Get("X-Forwarded-For"))
	}
}

func TestHTTPIndexHost(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	fake := startFake(t, "127.0.0.1:0", "t1",
		httpRoute("admin.example.com", false, a.addr(), b.addr()),
		httpRoute("0.admin.example.com", false, a.addr()),
		httpRoute("1.admin.example.com", false, b.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)
	for i := 0; i < 4; i++ {
		if code, body := get(t, http.DefaultClient, httpBase(r), "1.admin.example.com", "/"); code != 200 || body != "b" {
			t.Fatalf("1.admin: %d %q, want b", code, body)
		}
		if code, body := get(t, http.DefaultClient, httpBase(r), "0.ADMIN.example.com.", "/"); code != 200 || body != "a" {
			t.Fatalf("0.admin: %d %q, want a", code, body)
		}
	}
}

func TestHTTPAnswers(t *testing.T) {
	slow := newBackend(t, "slow")
	slow.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
	})
	fake := startFake(t, "127.0.0.1:0", "t1",
		httpRoute("empty.example.com", false),
		httpRoute("dead.example.com", false, deadAddr(t)),
		httpRoute("dead2.example.com", false, deadAddr(t), deadAddr(t)),
		httpRoute("slow.example.com", false, slow.addr()))
	cfg := testConfig(fake.addr)
	cfg.BackendResponseTimeout = Duration(200 * time.Millisecond)
	r := startRouter(t, cfg)
	waitSynced(t, r)

	tests := []struct {
		host     string
		wantCode int
		wantBody string
	}{
		{"nowhere.example.com", http.StatusNotFound, `unknown host "nowhere.example.com"`},
		{"empty.example.com", http.StatusServiceUnavailable, `no endpoints for host "empty.example.com"`},
		{"dead.example.com", http.StatusBadGateway, `backend unavailable for host "dead.example.com"`},
		{"dead2.example.com", http.StatusBadGateway, `backend unavailable`},
		{"slow.example.com", http.StatusBadGateway, `backend unavailable for host "slow.example.com"`},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			code, body := get(t, http.DefaultClient, httpBase(r), tt.host, "/")
			if code != tt.wantCode || !strings.Contains(body, tt.wantBody) {
				t.Fatalf("got %d %q, want %d with %q", code, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}

func TestHTTPRetriesNextEndpointOnConnectionError(t *testing.T) {
	live := newBackend(t, "live")
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, deadAddr(t), live.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)
	for i := 0; i < 6; i++ {
		// POSTs too: the body was not sent to the dead endpoint, so it can go to the next.
		code, body, _ := do(t, http.DefaultClient, http.MethodPost, httpBase(r), "app.example.com", "/", "payload-"+strconv.Itoa(i))
		if code != http.StatusOK || body != "live" {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	live.mu.Lock()
	defer live.mu.Unlock()
	for i, got := range live.bodies {
		if got != "payload-"+strconv.Itoa(i) {
			t.Fatalf("backend body %d = %q", i, got)
		}
	}
}

func TestHTTPTLSOnly(t *testing.T) {
	a := newBackend(t, "secure")
	p := newBackend(t, "plain")
	dir := t.TempDir()
	pki, err := tlsx.GenerateDevPKI(dir, "router")
	if err != nil {
		t.Fatal(err)
	}
	fake := startFake(t, "127.0.0.1:0", "t1",
		httpRoute("secure.example.com", true, a.addr()),
		httpRoute("plain.example.com", false, p.addr()))
	cfg := testConfig(fake.addr)
	cfg.HTTPSAddress = "127.0.0.1:0"
	cfg.HTTPSCertFile, cfg.HTTPSKeyFile = pki["router"].CertFile, pki["router"].KeyFile
	r := startRouter(t, cfg)
	waitSynced(t, r)

	caPEM, err := os.ReadFile(pki["router"].CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	httpsClient := &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	httpsBase := "https://" + r.HTTPSAddr().String()

	code, body, h := do(t, httpsClient, http.MethodGet, httpsBase, "secure.example.com", "/", "")
	if code != http.StatusOK || body != "secure" {
		t.Fatalf("https secure route: %d %q", code, body)
	}
	if _, bh := a.last(); bh.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("X-Forwarded-Proto over TLS = %q", bh.Get("X-Forwarded-Proto"))
	}
	if code, body := get(t, httpsClient, httpsBase, "plain.example.com", "/"); code != http.StatusOK || body != "plain" {
		t.Fatalf("https plain route: %d %q", code, body)
	}
	if code, body := get(t, http.DefaultClient, httpBase(r), "plain.example.com", "/"); code != http.StatusOK || body != "plain" {
		t.Fatalf("http plain route: %d %q", code, body)
	}

	httpsPort := r.HTTPSAddr().(*net.TCPAddr).Port
	code, _, h = do(t, noRedirects, http.MethodGet, httpBase(r), "Secure.example.com:80", "/a/b?c=d", "")
	want := "https://secure.example.com:" + strconv.Itoa(httpsPort) + "/a/b?c=d"
	if code != http.StatusMovedPermanently || h.Get("Location") != want {
		t.Fatalf("plain request to tls_only route: %d Location %q, want 301 %q", code, h.Get("Location"), want)
	}
	if a.count() != 1 {
		t.Fatalf("secure backend got %d requests, want only the https one", a.count())
	}

	// Without a TLS listener the redirect still goes to https (port 443, left out).
	r2 := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r2)
	code, _, h = do(t, noRedirects, http.MethodGet, httpBase(r2), "secure.example.com", "/x", "")
	if code != http.StatusMovedPermanently || h.Get("Location") != "https://secure.example.com/x" {
		t.Fatalf("redirect without TLS listener: %d %q", code, h.Get("Location"))
	}
}

func TestHTTPRouteChangeAppliesWithoutRestart(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("app.example.com", false, a.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)
	if _, body := get(t, http.DefaultClient, httpBase(r), "app.example.com", "/"); body != "a" {
		t.Fatalf("before change: %q", body)
	}
	v := fake.upsert(httpRoute("app.example.com", false, b.addr()), httpRoute("new.example.com", false, a.addr()))
	waitVersion(t, r, "t1", v)
	for i := 0; i < 3; i++ {
		if _, body := get(t, http.DefaultClient, httpBase(r), "app.example.com", "/"); body != "b" {
			t.Fatalf("after change: %q, want b", body)
		}
	}
	if _, body := get(t, http.DefaultClient, httpBase(r), "new.example.com", "/"); body != "a" {
		t.Fatalf("added route: %q", body)
	}
	v = fake.remove(httpRoute("app.example.com", false))
	waitVersion(t, r, "t1", v)
	if code, _ := get(t, http.DefaultClient, httpBase(r), "app.example.com", "/"); code != http.StatusNotFound {
		t.Fatalf("removed route: %d, want 404", code)
	}
}

func TestHTTPUpgradePassesThrough(t *testing.T) {
	up := newBackend(t, "up")
	up.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !serveEchoUpgrade(w, r) {
			http.Error(w, "want upgrade", http.StatusBadRequest)
		}
	})
	fake := startFake(t, "127.0.0.1:0", "t1", httpRoute("ws.example.com", false, up.addr()))
	r := startRouter(t, testConfig(fake.addr))
	waitSynced(t, r)

	c, err := net.DialTimeout("tcp", r.HTTPAddr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: ws.example.com\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answer: %v %v", resp, err)
	}
	if _, err := c.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "echo:hi\n" {
		t.Fatalf("upgraded stream: %q %v", line, err)
	}
}
