package store

import (
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
