package logtest

import (
	"fmt"
	"testing"
)

// fakeTB records Logf calls; only the methods New uses are overridden.
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

func TestNew(t *testing.T) {
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
			t.Setenv(LevelEnv, tt.env)
			tb := &fakeTB{}
			l := New(tb)
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

func TestNewRealTB(t *testing.T) {
	l := New(t)
	l.Warn("visible with -v", "key", "value")
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		l.Warn("from a goroutine")
	}()
}
