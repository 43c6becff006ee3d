package testkit

import (
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
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

// Promtool checks a /metrics page with Prometheus's linter, `promtool check metrics` (names,
// units, help texts, counter suffixes), and fails the test with its complaints. Without
// promtool on PATH (Debian package prometheus; .ci/run installs it) the test is skipped with one
// loud line. Call it in a subtest so a skip does not skip the test that scraped body.
func Promtool(t testing.TB, body string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		SkipWithoutTool(t, "promtool is not on PATH (apt-get install prometheus): /metrics is not linted")
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
