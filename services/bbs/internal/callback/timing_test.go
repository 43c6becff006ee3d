package callback_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/bbs/internal/callback"
)

// The tests of this file run in a synctest bubble: the worker's backoff timers run on the
// bubble's fake clock, so exact waits are checked without sleeping, and requests go to an
// in-memory transport instead of a socket (which a bubble cannot wait on).

// answers is an in-memory HTTP transport that answers each request with the next status of a
// list (repeating the last) and records when each request came.
type answers struct {
	mu       sync.Mutex
	statuses []int
	at       []time.Time
}

func (a *answers) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	code := a.statuses[min(len(a.at), len(a.statuses)-1)]
	a.at = append(a.at, time.Now())
	return &http.Response{StatusCode: code, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

func (a *answers) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at...)
}

// inBubble runs a worker over an answers transport with cfg inside a synctest bubble, calls
// f with the worker's queue, then stops the worker and checks it returned nil at once (no fake time passing: a
// delivery sleeping out its backoff would hold Run until the clock moved).
func inBubble(t *testing.T, statuses []int, cfg callback.Config, f func(q *callback.Queue, a *answers, res *fakeResolver)) {
	synctest.Test(t, func(t *testing.T) {
		a := &answers{statuses: statuses}
		cfg.Client = &http.Client{Transport: a}
		cfg.Logger = logtest.New(t)
		res := newFakeResolver()
		q := callback.NewQueue(0, cfg.Logger)
		w := callback.New(cfg, q, res)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx, func() {}) }()
		f(q, a, res)
		stop := time.Now()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if d := time.Since(stop); d != 0 {
			t.Fatalf("Run took %v to stop", d)
		}
	})
}

func TestRetriesServerErrors(t *testing.T) {
	for _, tt := range []struct {
		name    string
		answers []int
	}{
		{"503 twice", []int{503, 503, 200}},
		{"500 then 429 then 408", []int{500, 429, 408, 204}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inBubble(t, tt.answers, callback.Config{Backoff: 30 * time.Millisecond}, func(q *callback.Queue, a *answers, res *fakeResolver) {
				start := time.Now()
				q.Enqueue(completed("t1", "http://callback.example/done"))
				time.Sleep(time.Hour) // every backoff passes
				synctest.Wait()
				if calls := res.got(); !equal(calls, []string{"resolving t1", "delete t1"}) {
					t.Fatalf("resolver calls %v", calls)
				}
				at := a.times()
				if len(at) != len(tt.answers) {
					t.Fatalf("%d attempts, want %d", len(at), len(tt.answers))
				}
				// The backoff doubles: the attempts come at 0, 30ms, 90ms, 210ms.
				want := time.Duration(0)
				for i, got := range at {
					if got.Sub(start) != want {
						t.Fatalf("attempt %d came at %v, want %v", i+1, got.Sub(start), want)
					}
					want += 30 * time.Millisecond << i
				}
			})
		})
	}
}

func TestGivesUp(t *testing.T) {
	for _, tt := range []struct {
		name     string
		answers  []int
		attempts int
		want     int
	}{
		{"client error is not retried", []int{http.StatusBadRequest, http.StatusOK}, 5, 1},
		{"attempts exhausted", []int{http.StatusBadGateway}, 3, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inBubble(t, tt.answers, callback.Config{Attempts: tt.attempts, Backoff: 5 * time.Millisecond}, func(q *callback.Queue, a *answers, res *fakeResolver) {
				q.Enqueue(completed("t1", "http://callback.example/done"))
				time.Sleep(time.Hour) // many backoffs
				synctest.Wait()
				if n := len(a.times()); n != tt.want {
					t.Fatalf("%d attempts, want %d", n, tt.want)
				}
				if calls := res.got(); len(calls) != 0 {
					t.Fatalf("undelivered task was resolved: %v", calls)
				}
			})
		})
	}
}

func TestStopsDuringBackoff(t *testing.T) {
	inBubble(t, []int{http.StatusServiceUnavailable}, callback.Config{Backoff: time.Hour}, func(q *callback.Queue, a *answers, res *fakeResolver) {
		q.Enqueue(completed("t1", "http://callback.example/done"))
		synctest.Wait() // the first attempt failed; the delivery is backing off for an hour
		if n := len(a.times()); n != 1 {
			t.Fatalf("%d attempts before the backoff, want 1", n)
		}
		if calls := res.got(); len(calls) != 0 {
			t.Fatalf("resolver calls %v", calls)
		}
		// inBubble then cancels Run and checks it returns without the clock moving.
	})
}
