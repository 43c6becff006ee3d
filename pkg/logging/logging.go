// Package logging builds the hclog loggers used by every Gavel component:
// named per component, key/value fields, text for humans and JSON for
// deployments, and a test logger that writes through testing.TB.
package logging

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// Supported values of Config.Level.
var levels = map[string]hclog.Level{
	"trace": hclog.Trace,
	"debug": hclog.Debug,
	"info":  hclog.Info,
	"warn":  hclog.Warn,
	"error": hclog.Error,
}

// Supported values of Config.Format.
const (
	// FormatText writes human-readable single-line entries.
	FormatText = "text"
	// FormatJSON writes one JSON object per entry.
	FormatJSON = "json"
)

// TestLogLevelEnv names the environment variable that sets the level of
// loggers made by NewTest.
const TestLogLevelEnv = "GAVEL_TEST_LOG_LEVEL"

// Config describes how a component logs.
type Config struct {
	// Level is the minimum level written: trace, debug, info, warn or error
	// (case-insensitive). Empty means info.
	Level string `json:"level"`
	// Format is "text" (the default when empty) or "json".
	Format string `json:"format"`
	// Output receives the log entries. Nil means os.Stderr.
	Output io.Writer `json:"-"`
}

// Validate reports whether the level and format are supported.
func (c Config) Validate() error {
	if _, err := parseLevel(c.Level); err != nil {
		return fmt.Errorf("logging config: %w", err)
	}
	switch strings.ToLower(c.Format) {
	case "", FormatText, FormatJSON:
	default:
		return fmt.Errorf("logging config: format %q: want %q or %q", c.Format, FormatText, FormatJSON)
	}
	return nil
}

// New returns a logger named name configured by cfg. It expects a validated
// Config; an unknown level falls back to info and an unknown format to text.
func New(name string, cfg Config) hclog.Logger {
	level, err := parseLevel(cfg.Level)
	if err != nil {
		level = hclog.Info
	}
	out := cfg.Output
	if out == nil {
		out = os.Stderr
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      level,
		Output:     out,
		JSONFormat: strings.EqualFold(cfg.Format, FormatJSON),
	})
}

// NewTest returns a logger that writes through t.Logf, named after the test.
// Its level comes from the GAVEL_TEST_LOG_LEVEL environment variable and
// defaults to warn. Output written after the test's cleanup has started is
// dropped, so goroutines that outlive the test cannot make it panic.
func NewTest(t testing.TB) hclog.Logger {
	t.Helper()
	level := hclog.Warn
	if env := os.Getenv(TestLogLevelEnv); env != "" {
		l, err := parseLevel(env)
		if err != nil {
			t.Logf("logging: ignoring %s: %v", TestLogLevelEnv, err)
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

// parseLevel maps a Config.Level to an hclog level; empty means info.
func parseLevel(s string) (hclog.Level, error) {
	if s == "" {
		return hclog.Info, nil
	}
	l, ok := levels[strings.ToLower(strings.TrimSpace(s))]
	if !ok {
		return hclog.NoLevel, fmt.Errorf("level %q: want one of trace, debug, info, warn, error", s)
	}
	return l, nil
}
