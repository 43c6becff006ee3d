package testkit

import (
	"io"
	"net"
	"net/http"
	"testing"
)

// Scrape fetches http://addr/metrics (a Prometheus text page) and returns its body; it fails
// the test when the page cannot be read or the status is not 200.
func Scrape(t testing.TB, addr net.Addr) string {
	t.Helper()
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}
