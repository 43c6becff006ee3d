package store

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
)

// TestCellsLeftFollowsDepartures checks that the store tells Options.CellsLeft the cells still
// registered after its first listing and whenever a cell's presence disappears (the BBS closes
// the rep connections of the cells missing from that list).
func TestCellsLeftFollowsDepartures(t *testing.T) {
	_, cli := etcdtest.Start(t)
	put := func(id string) {
		b, err := proto.Marshal(&modelsv1.CellPresence{CellId: id, RepAddress: id + ":1"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(t.Context(), CellKey(id), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	put("cell-a")
	put("cell-b")

	var mu sync.Mutex
	var calls [][]string
	last := func() (int, []string) {
		mu.Lock()
		defer mu.Unlock()
		if len(calls) == 0 {
			return 0, nil
		}
		return len(calls), calls[len(calls)-1]
	}
	st := New(cli, Options{Logger: logtest.New(t), CellsLeft: func(present []*modelsv1.CellPresence) {
		var ids []string
		for _, c := range present {
			ids = append(ids, c.GetCellId())
		}
		mu.Lock()
		calls = append(calls, ids)
		mu.Unlock()
	}})
	testkit.Start(t, "store", st)
	if n, ids := last(); n != 1 || !slices.Equal(ids, []string{"cell-a", "cell-b"}) {
		t.Fatalf("after the first listing: %d calls, last %v; want one with both cells", n, ids)
	}

	// A new cell is no departure.
	put("cell-c")
	testkit.Eventually(t, 10*time.Second, func() bool { return st.Cell("cell-c") != nil }, "cell-c in the cache")
	if n, _ := last(); n != 1 {
		t.Fatalf("%d calls after a cell registered, want still 1", n)
	}

	if _, err := cli.Delete(t.Context(), CellKey("cell-a")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		n, ids := last()
		return n == 2 && slices.Equal(ids, []string{"cell-b", "cell-c"})
	}, "CellsLeft told the cells left after cell-a departed")
}

// TestCellsLeftDoesNotHoldTheWatch holds Options.CellsLeft after a cell departs: the cache
// still follows the store meanwhile (a write after the departure is reflected), and the call
// that was held is followed by one with the cells left after everything that departed
// meanwhile. (CellsLeft ran on the watch's goroutine, once per departure: while it ran, no
// write was reflected, and at 5,000 cells each call took milliseconds.)
func TestCellsLeftDoesNotHoldTheWatch(t *testing.T) {
	_, cli := etcdtest.Start(t)
	for _, id := range []string{"cell-a", "cell-b", "cell-c"} {
		b, err := proto.Marshal(&modelsv1.CellPresence{CellId: id, RepAddress: id + ":1"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(t.Context(), CellKey(id), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	held := make(chan struct{}, 8)
	var mu sync.Mutex
	var lastCall []string
	first := true
	st := New(cli, Options{Logger: logtest.New(t), CellsLeft: func(present []*modelsv1.CellPresence) {
		var ids []string
		for _, c := range present {
			ids = append(ids, c.GetCellId())
		}
		mu.Lock()
		lastCall = ids
		wasFirst := first
		first = false
		mu.Unlock()
		if !wasFirst {
			held <- struct{}{}
			<-release
		}
	}})
	testkit.Start(t, "store", st)
	defer close(release)

	if _, err := cli.Delete(t.Context(), CellKey("cell-a")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("CellsLeft was not called after cell-a departed")
	}
	// CellsLeft is held: another departure and a write are still reflected by the cache.
	if _, err := cli.Delete(t.Context(), CellKey("cell-b")); err != nil {
		t.Fatal(err)
	}
	rev, err := st.Update(t.Context(), func(tx *Txn) error { return tx.PutPortOwner("tcp", 64000, "web") })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if err := st.Cache().WaitFor(ctx, rev, 0); err != nil {
		t.Fatalf("the cache did not reflect a write while CellsLeft was held: %v", err)
	}
	if st.Cell("cell-b") != nil {
		t.Fatal("cell-b still in the cache while CellsLeft was held")
	}
	release <- struct{}{}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("no CellsLeft call after cell-b departed")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(lastCall, []string{"cell-c"}) {
		t.Fatalf("cells left after both departures: %v, want [cell-c]", lastCall)
	}
}
