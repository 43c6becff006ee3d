package metrics

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// TestServerOverMutualTLS serves /metrics with WithTLS: a scraper presenting a certificate of
// the cluster's CA reads it, one without a certificate is refused in the handshake, and plain
// HTTP gets no metrics.
func TestServerOverMutualTLS(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "bbs", "prometheus")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer("127.0.0.1:0", NewRegistry(), WithTLS(pki["bbs"].ServerTLS))
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- s.Run(ctx, func() { close(ready) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("metrics server: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	get := func(scheme string, tc *tls.Config) (string, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		resp, err := c.Get(scheme + "://" + s.Addr().String() + "/metrics")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.Status + "\n" + string(b), err
	}

	scraper, err := pki["prometheus"].ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	scraper.ServerName = "localhost"
	if body, err := get("https", scraper); err != nil || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("scrape with the CA's certificate: %v\n%.300s", err, body)
	}
	anonymous := scraper.Clone()
	anonymous.Certificates = nil
	if body, err := get("https", anonymous); err == nil {
		t.Fatalf("scrape without a client certificate answered:\n%.300s", body)
	}
	if body, err := get("http", nil); err == nil && strings.Contains(body, "go_goroutines") {
		t.Fatalf("plain HTTP read the metrics:\n%.300s", body)
	}
}
