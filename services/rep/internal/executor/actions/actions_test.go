package actions

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// fakeSteps runs "sleep", "fail" and "after-sleep" run actions and records what ran.
// "after-sleep" ends once a "sleep" has started (at most a second later), so a codependent
// sibling is sure to have run before it is stopped.
type fakeSteps struct {
	mu       sync.Mutex
	ran      []string
	sleeping chan struct{} // closed by the first "sleep"
	once     sync.Once
}

func (f *fakeSteps) Run(ctx context.Context, ra *modelsv1.RunAction) error {
	f.mu.Lock()
	f.ran = append(f.ran, ra.GetPath())
	f.mu.Unlock()
	switch ra.GetPath() {
	case "fail":
		return errors.New("exit status 1")
	case "after-sleep":
		select {
		case <-f.sleeping:
		case <-time.After(time.Second):
		}
	case "sleep":
		f.once.Do(func() { close(f.sleeping) })
		select {
		case <-time.After(time.Second):
			return nil
		case <-ctx.Done():
			return errors.New("signal: terminated")
		}
	}
	return nil
}

func (f *fakeSteps) Download(_ context.Context, d *modelsv1.DownloadAction) error {
	f.mu.Lock()
	f.ran = append(f.ran, "download "+d.GetFrom())
	f.mu.Unlock()
	return nil
}

func run(p string) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: p}}}
}

func TestTreeSemantics(t *testing.T) {
	serial := func(as ...*modelsv1.Action) *modelsv1.Action {
		return &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: as}}}
	}
	codep := func(as ...*modelsv1.Action) *modelsv1.Action {
		return &modelsv1.Action{Kind: &modelsv1.Action_Codependent{Codependent: &modelsv1.CodependentAction{Actions: as}}}
	}
	try := func(a *modelsv1.Action) *modelsv1.Action {
		return &modelsv1.Action{Kind: &modelsv1.Action_Try{Try: &modelsv1.TryAction{Action: a}}}
	}
	timeout := func(ms int64, a *modelsv1.Action) *modelsv1.Action {
		return &modelsv1.Action{Kind: &modelsv1.Action_Timeout{Timeout: &modelsv1.TimeoutAction{TimeoutMs: ms, Action: a}}}
	}
	dl := &modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{From: "u"}}}
	for _, tc := range []struct {
		name   string
		a      *modelsv1.Action
		reason string
		ran    string
	}{
		{"serial stops at the first failure", serial(dl, run("fail"), run("ok")), "exit status 1", "download u,fail"},
		{"try ignores a failure", serial(try(run("fail")), run("ok")), "", "fail,ok"},
		{"timeout fails a long child", timeout(50, run("sleep")), "timed out after 50ms", "sleep"},
		{"codependent ends with its first", codep(run("after-sleep"), run("sleep")), "", "after-sleep,sleep"},
		{"empty", &modelsv1.Action{}, "empty action", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeSteps{sleeping: make(chan struct{})}
			err := Interpreter{Steps: f}.Run(context.Background(), tc.a)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.reason {
				t.Fatalf("reason %q, want %q", got, tc.reason)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			ran := strings.Join(f.ran, ",")
			if tc.name == "codependent ends with its first" {
				if len(f.ran) != 2 {
					t.Fatalf("ran %q", ran)
				}
				return
			}
			if ran != tc.ran {
				t.Fatalf("ran %q, want %q", ran, tc.ran)
			}
		})
	}
}
