package retry

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestBackOffDoublesUpToMax(t *testing.T) {
	b := Policy{Initial: 100 * time.Millisecond, Max: time.Second}.BackOff()
	var got []time.Duration
	for range 6 {
		got = append(got, b.NextBackOff())
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}
	b.Reset()
	if d := b.NextBackOff(); d != 100*time.Millisecond {
		t.Fatalf("after Reset: %v, want the initial wait", d)
	}
}

func TestBackOffJitterStaysInBounds(t *testing.T) {
	b := Policy{Initial: time.Second, Max: time.Second, Jitter: 0.2}.BackOff()
	for range 1000 {
		if d := b.NextBackOff(); d < 800*time.Millisecond || d > 1200*time.Millisecond+1 {
			t.Fatalf("wait %v outside 1s ±20%%", d)
		}
	}
}

func TestDo(t *testing.T) {
	errFlaky, errBad := errors.New("flaky"), errors.New("bad")
	cases := []struct {
		name      string
		tries     uint
		fails     int   // calls that fail before one succeeds
		permanent bool  // failures are permanent
		wantCalls int   // calls made
		wantErr   error // nil, errFlaky or errBad
		wantWait  time.Duration
	}{
		{name: "succeeds at once", fails: 0, wantCalls: 1},
		{name: "succeeds after failures", fails: 3, wantCalls: 4, wantWait: 700 * time.Millisecond},
		{name: "gives up after tries", tries: 3, fails: 10, wantCalls: 3, wantErr: errFlaky, wantWait: 300 * time.Millisecond},
		{name: "permanent stops at once", fails: 10, permanent: true, wantCalls: 1, wantErr: errBad},
		{name: "permanent on the last try", tries: 1, fails: 10, permanent: true, wantCalls: 1, wantErr: errBad},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				calls, notified := 0, 0
				start := time.Now()
				err := Do(t.Context(), Policy{Initial: 100 * time.Millisecond, Max: time.Second}, tc.tries, func() error {
					calls++
					if calls > tc.fails {
						return nil
					}
					if tc.permanent {
						return Permanent(errBad)
					}
					return errFlaky
				}, func(error, time.Duration) { notified++ })
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
					t.Fatalf("Do = %v, want %v", err, tc.wantErr)
				}
				if tc.wantErr != nil && err != tc.wantErr {
					t.Fatalf("Do = %#v, want the operation's own error", err)
				}
				wantNotified := tc.wantCalls - 1 // every failure but a final one
				if tc.permanent {
					wantNotified = 0
				}
				if calls != tc.wantCalls || notified != wantNotified {
					t.Fatalf("calls %d, notified %d; want %d, %d", calls, notified, tc.wantCalls, wantNotified)
				}
				if waited := time.Since(start); waited != tc.wantWait {
					t.Fatalf("waited %v, want %v", waited, tc.wantWait)
				}
			})
		})
	}
}

func TestDoStopsWhenContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
		defer cancel()
		calls := 0
		start := time.Now()
		err := Do(ctx, Policy{Initial: 100 * time.Millisecond}, 0, func() error { calls++; return errors.New("down") }, nil)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do = %v, want the context's cause", err)
		}
		// Calls at 0, 100ms and 300ms would be three; the context ends the wait at 250ms.
		if calls != 2 || time.Since(start) != 250*time.Millisecond {
			t.Fatalf("calls %d after %v", calls, time.Since(start))
		}
	})
}

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if !Sleep(t.Context(), time.Minute) || time.Since(start) != time.Minute {
			t.Fatalf("Sleep did not wait a minute")
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if Sleep(ctx, time.Minute) {
			t.Fatal("Sleep completed on an ended context")
		}
	})
}
