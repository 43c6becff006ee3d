package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// runParallel runs members as a Parallel group with the given start limit, cancelling ctx once
// an event beginning with cancelWhen is recorded (if set). The group's ready is recorded as "group ready".
func runParallel(t *testing.T, rec *recorder, limit int, cancelWhen string, members ...Member) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if cancelWhen != "" {
		go func() {
			for ctx.Err() == nil && count(rec.get(), cancelWhen) == 0 {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
	}
	return returns(t, "Parallel", func() error {
		return Parallel(limit, members...).Run(ctx, func() { rec.add("group ready") })
	})
}

// members makes fakes named a, b, c, … with the behaviours given by name.
func members(rec *recorder, n int, bs map[string]behaviour) []Member {
	var ms []Member
	for i := range n {
		name := string(rune('a' + i))
		ms = append(ms, fake(rec, name, bs[name]))
	}
	return ms
}

// count is how many events begin with prefix.
func count(events []string, prefix string) int {
	n := 0
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

func TestParallelStartsAndStopsTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		if err := runParallel(t, rec, 0, "group ready", members(rec, 3, nil)...); err != nil {
			t.Fatalf("Run() = %v, want nil", err)
		}
		got := rec.get()
		ready := slices.Index(got, "group ready")
		if ready < 0 || count(got[:ready], "ready ") != 3 || count(got, "group ready") != 1 {
			t.Fatalf("the group was not ready once, after its three members: %v", got)
		}
		// Every member sees the stop before any of them returns: they stop at once, not in turn.
		firstExit := slices.IndexFunc(got, func(e string) bool { return strings.HasPrefix(e, "exit ") })
		if count(got[:firstExit], "stop ") != 3 || count(got, "exit ") != 3 {
			t.Errorf("members did not stop together: %v", got)
		}
	})
}

func TestParallelBoundsTheStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		bs := map[string]behaviour{}
		for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
			bs[name] = behaviour{readyAfter: 10 * time.Millisecond}
		}
		start := time.Now()
		if err := runParallel(t, rec, 2, "group ready", members(rec, 6, bs)...); err != nil {
			t.Fatalf("Run() = %v, want nil", err)
		}
		// Two at a time: three rounds of 10 ms (the fake clock is exact), the canceller's look
		// (up to 1 ms), then the stop's 10 ms. One at a time would take 70–71 ms, all at once
		// 20–21 ms.
		if took := time.Since(start); took < 40*time.Millisecond || took > 41*time.Millisecond {
			t.Errorf("six members that each take 10 ms to start, two at a time, took %v to start and stop, want 40–41ms", took)
		}
		starting, most := 0, 0
		for _, e := range rec.get() {
			switch {
			case strings.HasPrefix(e, "start "):
				starting++
				most = max(most, starting)
			case strings.HasPrefix(e, "ready "):
				starting--
			}
		}
		if most != 2 {
			t.Errorf("at most %d members were starting at once, want 2: %v", most, rec.get())
		}
	})
}

func TestParallelStopsAtTheFirstFailure(t *testing.T) {
	tests := []struct {
		name      string
		b         behaviour
		wantErr   error
		wantMsg   string
		wantReady bool // the group was ready before the failure
	}{
		{name: "error during start", b: behaviour{startErr: errBoom}, wantErr: errBoom, wantMsg: "b: boom"},
		{name: "nil before ready", b: behaviour{exitBefore: true}, wantMsg: "b: exited before becoming ready"},
		{name: "error after ready", b: behaviour{failAfter: 20 * time.Millisecond, failErr: errBoom}, wantErr: errBoom, wantMsg: "b: boom", wantReady: true},
		{name: "nil after ready", b: behaviour{failAfter: 20 * time.Millisecond}, wantMsg: "b: stopped", wantReady: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &recorder{}
				err := runParallel(t, rec, 0, "", members(rec, 3, map[string]behaviour{"b": tt.b})...)
				if err == nil || err.Error() != tt.wantMsg || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
					t.Fatalf("Run() = %v, want %q", err, tt.wantMsg)
				}
				got := rec.get()
				if slices.Contains(got, "group ready") != tt.wantReady {
					t.Errorf("group ready: %v, want %v: %v", !tt.wantReady, tt.wantReady, got)
				}
				for _, name := range []string{"a", "c"} {
					if slices.Contains(got, "start "+name) && (!slices.Contains(got, "stop "+name) || !slices.Contains(got, "exit "+name)) {
						t.Errorf("%s was not stopped: %v", name, got)
					}
				}
			})
		})
	}
}

func TestParallelStopErrors(t *testing.T) {
	for _, tt := range []struct {
		stopErr error
		wantMsg string
	}{{errStop, "b: stop failed"}, {context.Canceled, ""}} {
		t.Run(fmt.Sprint(tt.stopErr), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &recorder{}
				err := runParallel(t, rec, 0, "group ready", members(rec, 3, map[string]behaviour{"b": {stopErr: tt.stopErr}})...)
				if got := fmt.Sprint(err); (tt.wantMsg == "" && err != nil) || (tt.wantMsg != "" && got != tt.wantMsg) {
					t.Errorf("Run() = %v, want %q", err, tt.wantMsg)
				}
			})
		})
	}
}

func TestParallelCancelledDuringStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		bs := map[string]behaviour{"a": {neverReady: true}, "b": {neverReady: true}, "c": {neverReady: true}}
		// One start at a time, and none ever ready: one member starts, the others never do.
		if err := runParallel(t, rec, 1, "start ", members(rec, 3, bs)...); err != nil {
			t.Fatalf("Run() = %v, want nil", err)
		}
		got := rec.get()
		if count(got, "start ") != 1 || count(got, "exit ") != 1 || slices.Contains(got, "group ready") {
			t.Errorf("want one member started and stopped, and the group never ready: %v", got)
		}
	})
}

func TestParallelNoRunnerOrNoMembers(t *testing.T) {
	if err := Parallel(0, Member{Name: "x"}).Run(context.Background(), func() {}); err == nil || !strings.Contains(err.Error(), "no runner") {
		t.Errorf("Run() = %v, want a no-runner error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	readied := false
	if err := Parallel(0).Run(ctx, func() { readied = true }); err != nil || !readied {
		t.Errorf("Run() of no members = %v, ready %v; want nil, ready", err, readied)
	}
}
