// Package logtest is the logger of Gavel's tests: it writes through testing.TB. It lives apart
// from package logging so that only tests link package testing, never a service binary.
package logtest

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/pkg/logging"
)

// LevelEnv names the environment variable that sets the level of loggers made by New.
const LevelEnv = "GAVEL_TEST_LOG_LEVEL"

// New returns a logger that writes through t.Logf, named after the test.
// Its level comes from the GAVEL_TEST_LOG_LEVEL environment variable and
// defaults to warn. Output written after the test's cleanup has started is
// dropped, so goroutines that outlive the test cannot make it panic.
func New(t testing.TB) hclog.Logger {
	t.Helper()
	level := hclog.Warn
	if env := os.Getenv(LevelEnv); env != "" {
		l, err := logging.ParseLevel(env)
		if err != nil {
			t.Logf("logging: ignoring %s: %v", LevelEnv, err)
		} else {
			level = l
		}
	}
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return hclog.New(&hclog.LoggerOptions{
		Name:       t.Name(),
		Level:      level,
		Output:     w,
		TimeFormat: "15:04:05.000",
	})
}

// testWriter forwards each write to t.Logf until closed.
type testWriter struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

// Write logs p, without its trailing newline, unless the writer is closed.
func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// close makes later writes no-ops.
func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}
