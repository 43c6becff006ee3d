package lifecycle

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gavel-sched/gavel/pkg/logging/logtest"
)

// recorder collects events from several members in order.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// behaviour says what a fake member does.
type behaviour struct {
	startErr   error         // returned before ready, if set
	exitBefore bool          // return nil before ready
	neverReady bool          // block until cancelled without calling ready
	readyAfter time.Duration // wait this long before calling ready, if set
	failAfter  time.Duration // after ready, return failErr (or nil) after this delay, if set
	failErr    error
	stopErr    error // returned when cancelled
}

// fake returns a member that records "start X", "ready X", "stop X" (when it
// observes cancellation) and "exit X" (just before returning). It lingers
// briefly between stop and exit so that overlapping stops would show.
func fake(rec *recorder, name string, b behaviour) Member {
	return Member{Name: name, Runner: RunFunc(func(ctx context.Context, ready func()) error {
		rec.add("start " + name)
		defer rec.add("exit " + name)
		switch {
		case b.startErr != nil:
			return b.startErr
		case b.exitBefore:
			return nil
		}
		if !b.neverReady {
			time.Sleep(b.readyAfter)
			// Recorded before ready is called: once it is, Run may start
			// the next member, whose "start" must come after this line.
			rec.add("ready " + name)
			ready()
			ready() // a second call is harmless
		}
		var fail <-chan time.Time
		if b.failAfter > 0 {
			fail = time.After(b.failAfter)
		}
		select {
		case <-fail:
			return b.failErr
		case <-ctx.Done():
			rec.add("stop " + name)
			time.Sleep(10 * time.Millisecond)
			return b.stopErr
		}
	})}
}

var (
	errBoom = errors.New("boom")
	errStop = errors.New("stop failed")
)

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		members    map[string]behaviour // members are a, b, c in that order
		cancelWhen string               // cancel the group's context once this event is seen
		wantErr    error
		wantErrMsg string
		wantEvents []string
	}{
		{
			name:       "context cancel stops in reverse",
			cancelWhen: "ready c",
			wantEvents: []string{
				"start a", "ready a", "start b", "ready b", "start c", "ready c",
				"stop c", "exit c", "stop b", "exit b", "stop a", "exit a",
			},
		},
		{
			name:       "failure during start",
			members:    map[string]behaviour{"b": {startErr: errBoom}},
			wantErr:    errBoom,
			wantErrMsg: "b: boom",
			wantEvents: []string{"start a", "ready a", "start b", "exit b", "stop a", "exit a"},
		},
		{
			name:       "nil exit before ready is an error",
			members:    map[string]behaviour{"b": {exitBefore: true}},
			wantErrMsg: "b: exited before becoming ready",
			wantEvents: []string{"start a", "ready a", "start b", "exit b", "stop a", "exit a"},
		},
		{
			name:       "failure after start",
			members:    map[string]behaviour{"b": {failAfter: 20 * time.Millisecond, failErr: errBoom}},
			wantErr:    errBoom,
			wantErrMsg: "b: boom",
			wantEvents: []string{
				"start a", "ready a", "start b", "ready b", "start c", "ready c",
				"exit b", "stop c", "exit c", "stop a", "exit a",
			},
		},
		{
			name:    "nil exit after start is a clean stop",
			members: map[string]behaviour{"a": {failAfter: 20 * time.Millisecond}},
			wantEvents: []string{
				"start a", "ready a", "start b", "ready b", "start c", "ready c",
				"exit a", "stop c", "exit c", "stop b", "exit b",
			},
		},
		{
			name:       "context cancel during start",
			members:    map[string]behaviour{"b": {neverReady: true}},
			cancelWhen: "start b",
			wantEvents: []string{"start a", "ready a", "start b", "stop b", "exit b", "stop a", "exit a"},
		},
		{
			name:       "error while stopping is reported",
			members:    map[string]behaviour{"b": {stopErr: errStop}},
			cancelWhen: "ready c",
			wantErr:    errStop,
			wantErrMsg: "b: stop failed",
			wantEvents: []string{
				"start a", "ready a", "start b", "ready b", "start c", "ready c",
				"stop c", "exit c", "stop b", "exit b", "stop a", "exit a",
			},
		},
		{
			name:       "context.Canceled while stopping is clean",
			members:    map[string]behaviour{"a": {stopErr: context.Canceled}},
			cancelWhen: "ready c",
			wantEvents: []string{
				"start a", "ready a", "start b", "ready b", "start c", "ready c",
				"stop c", "exit c", "stop b", "exit b", "stop a", "exit a",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// On synctest's fake clock: the members' delays are exact and cost no time.
			synctest.Test(t, func(t *testing.T) {
				rec := &recorder{}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var members []Member
				for _, name := range []string{"a", "b", "c"} {
					members = append(members, fake(rec, name, tt.members[name]))
				}
				if tt.cancelWhen != "" {
					go func() {
						for ctx.Err() == nil && !slices.Contains(rec.get(), tt.cancelWhen) {
							time.Sleep(time.Millisecond)
						}
						cancel()
					}()
				}

				err := runWithTimeout(t, ctx, members...)

				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("Run() = %v, want errors.Is %v", err, tt.wantErr)
				}
				if tt.wantErrMsg == "" && err != nil {
					t.Errorf("Run() = %v, want nil", err)
				}
				if tt.wantErrMsg != "" && (err == nil || err.Error() != tt.wantErrMsg) {
					t.Errorf("Run() = %v, want %q", err, tt.wantErrMsg)
				}
				if got := rec.get(); !reflect.DeepEqual(got, tt.wantEvents) {
					t.Errorf("events:\n got  %v\n want %v", got, tt.wantEvents)
				}
			})
		})
	}
}

func TestRunEarlierMemberFailsDuringStart(t *testing.T) {
	synctest.Test(t, testRunEarlierMemberFailsDuringStart)
}

func testRunEarlierMemberFailsDuringStart(t *testing.T) {
	rec := &recorder{}
	members := []Member{
		fake(rec, "a", behaviour{failAfter: 20 * time.Millisecond, failErr: errBoom}),
		fake(rec, "b", behaviour{neverReady: true}),
	}
	err := runWithTimeout(t, context.Background(), members...)
	if !errors.Is(err, errBoom) || !strings.HasPrefix(err.Error(), "a: ") {
		t.Fatalf("Run() = %v, want a: boom", err)
	}
	want := []string{"start a", "ready a", "start b", "exit a", "stop b", "exit b"}
	if got := rec.get(); !reflect.DeepEqual(got, want) {
		t.Errorf("events:\n got  %v\n want %v", got, want)
	}
}

func TestRunCancelledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := &recorder{}
	if err := runWithTimeout(t, ctx, fake(rec, "a", behaviour{})); err != nil {
		t.Fatalf("Run() = %v, want nil", err)
	}
	if got := rec.get(); len(got) != 0 {
		t.Errorf("members ran: %v", got)
	}
}

func TestRunMemberContext(t *testing.T) {
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "v")
	ctx, cancel := context.WithCancel(ctx)
	var sawValue bool
	m := Member{Name: "a", Runner: RunFunc(func(mctx context.Context, ready func()) error {
		sawValue = mctx.Value(key{}) == "v"
		ready()
		cancel()
		<-mctx.Done()
		return nil
	})}
	if err := runWithTimeout(t, ctx, m); err != nil {
		t.Fatal(err)
	}
	if !sawValue {
		t.Error("member context lacks the parent's values")
	}
}

func TestRunNilRunner(t *testing.T) {
	err := Run(context.Background(), nil, Member{Name: "x"})
	if err == nil || !strings.Contains(err.Error(), "no runner") {
		t.Fatalf("Run() = %v, want a no-runner error", err)
	}
}

func TestRunNoMembers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, nil); err != nil {
		t.Fatalf("Run() = %v", err)
	}
}

func TestSignalContext(t *testing.T) {
	ctx, cancel := SignalContext(context.Background())
	defer cancel()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context not cancelled by SIGTERM")
	}
}

// runWithTimeout runs the group and fails the test if it does not return.
func runWithTimeout(t *testing.T, ctx context.Context, members ...Member) error {
	t.Helper()
	return returns(t, "Run", func() error { return Run(ctx, logtest.New(t), members...) })
}

// returns runs f and fails the test if it does not return within 10 s; what names it.
func returns(t *testing.T, what string, f func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- f() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", what)
		return nil
	}
}
