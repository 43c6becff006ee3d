package logging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "zero value", cfg: Config{}},
		{name: "debug json", cfg: Config{Level: "debug", Format: "json"}},
		{name: "upper case", cfg: Config{Level: "WARN", Format: "TEXT"}},
		{name: "every level", cfg: Config{Level: "trace"}},
		{name: "bad level", cfg: Config{Level: "verbose"}, wantErr: `level "verbose"`},
		{name: "bad format", cfg: Config{Format: "yaml"}, wantErr: `format "yaml"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		logDebug  bool
		logInfo   bool
		checkJSON bool
	}{
		{name: "default info text", cfg: Config{}, logInfo: true},
		{name: "debug", cfg: Config{Level: "debug"}, logDebug: true, logInfo: true},
		{name: "error only", cfg: Config{Level: "error"}},
		{name: "json", cfg: Config{Format: "json"}, logInfo: true, checkJSON: true},
		{name: "invalid level falls back to info", cfg: Config{Level: "nope"}, logInfo: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tt.cfg.Output = &buf
			l := New("bbs", tt.cfg)
			l.Debug("debug line", "cell_id", "c1")
			l.Info("info line", "cell_id", "c1")
			out := buf.String()
			if got := strings.Contains(out, "debug line"); got != tt.logDebug {
				t.Errorf("debug written = %v, want %v; output:\n%s", got, tt.logDebug, out)
			}
			if got := strings.Contains(out, "info line"); got != tt.logInfo {
				t.Errorf("info written = %v, want %v; output:\n%s", got, tt.logInfo, out)
			}
			if tt.logInfo && !strings.Contains(out, "bbs") {
				t.Errorf("output lacks logger name: %s", out)
			}
			if tt.checkJSON {
				var entry map[string]any
				if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &entry); err != nil {
					t.Fatalf("output is not one JSON object: %v\n%s", err, out)
				}
				if entry["@message"] != "info line" || entry["cell_id"] != "c1" || entry["@module"] != "bbs" {
					t.Errorf("unexpected JSON entry: %v", entry)
				}
			}
		})
	}
}

// fakeTB records Logf calls; only the methods NewTest uses are overridden.
type fakeTB struct {
	testing.TB
	logs     []string
	cleanups []func()
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Name() string      { return "TestFake" }
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

func TestNewTest(t *testing.T) {
	tests := []struct {
		name      string
		env       string
		wantLines int
	}{
		{name: "default warn", env: "", wantLines: 1},
		{name: "debug from env", env: "debug", wantLines: 3},
		{name: "invalid env falls back to warn", env: "loud", wantLines: 2}, // the notice plus the warning
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(TestLogLevelEnv, tt.env)
			tb := &fakeTB{}
			l := NewTest(tb)
			l.Debug("debug line")
			l.Info("info line")
			l.Warn("warn line")
			if len(tb.logs) != tt.wantLines {
				t.Fatalf("got %d log lines, want %d: %q", len(tb.logs), tt.wantLines, tb.logs)
			}
			for _, fn := range tb.cleanups {
				fn()
			}
			l.Error("after cleanup")
			if len(tb.logs) != tt.wantLines {
				t.Fatalf("logged after cleanup: %q", tb.logs)
			}
		})
	}
}

func TestNewTestRealTB(t *testing.T) {
	l := NewTest(t)
	l.Warn("visible with -v", "key", "value")
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		l.Warn("from a goroutine")
	}()
}
