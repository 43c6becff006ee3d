package store

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
)

// TestSubscribeBookmarksWhenIdle checks, on synctest's fake clock, that a subscriber served from
// the event ring gets a bookmark carrying the current revision after every bookmark interval
// without a message, and none while events keep it busy. The store is synced by hand and fed
// through its ring: no etcd is involved.
func TestSubscribeBookmarksWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(nil, Options{Logger: logtest.New(t)})
		s.hub.reset(10)
		close(s.synced)

		type msg struct {
			at       time.Duration
			rev      int64
			bookmark bool
		}
		var mu sync.Mutex
		var got []msg
		start := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- s.Subscribe(ctx, 0, EventFilter{}, time.Second, func(r *bbsv1.SubscribeToEventsResponse) error {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, msg{at: time.Since(start), rev: r.GetRevision(), bookmark: r.GetBookmark()})
				return nil
			})
		}()

		event := []*bbsv1.Event{{Kind: &bbsv1.Event_DesiredLrpCreated{DesiredLrpCreated: &bbsv1.DesiredLRPCreated{
			DesiredLrp: &modelsv1.DesiredLRP{ProcessGuid: "web"}}}}}
		time.Sleep(1500 * time.Millisecond)
		s.hub.publish(11, event, nil) // at 1.5s: an event; the tick at 2s is too soon after it
		time.Sleep(2 * time.Second)
		s.hub.publish(12, nil, nil) // at 3.5s: a revision with nothing to send moves the bookmarks' revision
		time.Sleep(1 * time.Second)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Subscribe: %v", err)
		}

		want := []msg{
			{at: time.Second, rev: 10, bookmark: true},
			{at: 1500 * time.Millisecond, rev: 11},
			{at: 3 * time.Second, rev: 11, bookmark: true},
			{at: 4 * time.Second, rev: 12, bookmark: true},
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != len(want) {
			t.Fatalf("messages %+v, want %+v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("messages %+v, want %+v", got, want)
			}
		}
	})
}
