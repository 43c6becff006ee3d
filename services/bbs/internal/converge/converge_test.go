package converge

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// slowCache is a synced, empty cache whose full listing of actual LRPs (a full pass's
// snapshot) blocks until release is closed, as a full pass over 250,000 instances on a busy
// machine takes seconds; it counts the cell-loss passes' reads.
type slowCache struct {
	release   chan struct{}
	fullReads atomic.Int32 // full passes that reached their snapshot
	cellReads atomic.Int32 // cell-loss passes that read the lost cells' instances
}

func (c *slowCache) Synced() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

func (c *slowCache) SchedulingInfos(store.ListFilter) ([]*modelsv1.DesiredLRPSchedulingInfo, int64) {
	return nil, 1
}

func (c *slowCache) ActualLRPs(store.ListFilter) ([]*modelsv1.ActualLRP, int64) {
	c.fullReads.Add(1)
	<-c.release
	return nil, 1
}

func (c *slowCache) OnLostCells(func(string) bool) (store.LostCells, int64) {
	c.cellReads.Add(1)
	return store.LostCells{}, 1
}

func (c *slowCache) Tasks(store.ListFilter) ([]*modelsv1.Task, int64) { return nil, 1 }
func (c *slowCache) Cells() ([]*modelsv1.CellPresence, int64)         { return nil, 1 }
func (c *slowCache) Domains() ([]*modelsv1.Domain, int64)             { return nil, 1 }

// TestCellLossPassDoesNotWaitForAFullPass: a cell that disappears while a full pass is under
// way has its instances judged at once, by a cell-loss pass beside it (decision 0060).
func TestCellLossPassDoesNotWaitForAFullPass(t *testing.T) {
	cache := &slowCache{release: make(chan struct{})}
	c := New(core.New(nil, core.Config{}), cache, Config{Interval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	trigger := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, trigger) }()
	defer func() {
		cancel()
		close(cache.release) // the full pass under way ends, and any later one does not wait
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()

	testkit.Eventually(t, 10*time.Second, func() bool { return cache.fullReads.Load() == 1 }, "a full pass under way")
	trigger <- struct{}{}
	testkit.Eventually(t, 10*time.Second, func() bool { return cache.cellReads.Load() == 1 }, "the cell-loss pass beside the full pass")
	if n := cache.fullReads.Load(); n != 1 {
		t.Errorf("%d full passes reached their snapshot, want the one still under way", n)
	}

	// Called directly too: ConvergeCells does not wait for the full pass's lock.
	passed := make(chan error, 1)
	go func() {
		_, err := c.ConvergeCells(ctx)
		passed <- err
	}()
	select {
	case err := <-passed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ConvergeCells waited for the full pass under way")
	}
}

// lostCellsCache is a synced cache in which the cells in lost have no presence: OnLostCells
// gives those skip does not report (with nothing on them), and logs what each call gave. A
// cell-loss pass's read of the desired LRPs blocks until release is closed.
type lostCellsCache struct {
	slowCache
	mu    sync.Mutex
	lost  []string
	given [][]string
}

func (c *lostCellsCache) OnLostCells(skip func(string) bool) (store.LostCells, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out store.LostCells
	for _, id := range c.lost {
		if !skip(id) {
			out.Cells = append(out.Cells, id)
		}
	}
	c.given = append(c.given, out.Cells)
	return out, 1
}

func (c *lostCellsCache) SchedulingInfos(f store.ListFilter) ([]*modelsv1.DesiredLRPSchedulingInfo, int64) {
	if f.Guids != nil { // a cell-loss pass's
		<-c.release
	}
	return nil, 1
}

func (c *lostCellsCache) lose(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lost = append(c.lost, id)
}

func (c *lostCellsCache) log() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.given)
}

// TestCellLossPassesRunSideBySide: a cell lost while the pass for an earlier one is under way
// gets a pass of its own at once, which leaves the earlier cell to its pass; once both end, a
// pass judges both cells again (nothing stays marked as judged).
func TestCellLossPassesRunSideBySide(t *testing.T) {
	cache := &lostCellsCache{slowCache: slowCache{release: make(chan struct{})}}
	c := New(core.New(nil, core.Config{}), cache, Config{Interval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	trigger := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, trigger) }()
	released := false
	defer func() {
		cancel()
		if !released {
			close(cache.release)
		}
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()

	cache.lose("cell-1")
	trigger <- struct{}{}
	testkit.Eventually(t, 10*time.Second, func() bool { return len(cache.log()) == 1 }, "the pass for cell-1 under way")
	cache.lose("cell-2")
	trigger <- struct{}{}
	testkit.Eventually(t, 10*time.Second, func() bool { return len(cache.log()) == 2 }, "a pass for cell-2 beside the one for cell-1")
	if got, want := cache.log(), [][]string{{"cell-1"}, {"cell-2"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("passes took %v, want %v", got, want)
	}

	close(cache.release)
	released = true
	testkit.Eventually(t, 10*time.Second, func() bool {
		_, err := c.ConvergeCells(ctx)
		log := cache.log()
		return err == nil && slices.Equal(log[len(log)-1], []string{"cell-1", "cell-2"})
	}, "a pass after both ended judges both cells")
}

// TestFailedCellLossPassIsRetried: a cell-loss pass with failed changes is followed by another,
// after a backoff, until one has none; the cells are not left to the next full pass (an
// hour away here). A pass ended by the converger's shutdown is not retried.
func TestFailedCellLossPassIsRetried(t *testing.T) {
	c := New(core.New(nil, core.Config{}), &slowCache{release: make(chan struct{})}, Config{Interval: time.Hour})
	var passes atomic.Int32
	failTwice := func(context.Context) (Report, error) {
		if passes.Add(1) <= 2 {
			return Report{Applied: Applied{Errors: 1}}, errors.New("converge suspects of cell cell-1: context deadline exceeded")
		}
		return Report{}, nil
	}
	done := make(chan struct{})
	go func() {
		c.convergeCells(t.Context(), failTwice)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the passes did not end after one without failures")
	}
	if n := passes.Load(); n != 3 {
		t.Fatalf("%d passes, want 3: two that failed and the one after", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	passes.Store(0)
	c.convergeCells(ctx, func(context.Context) (Report, error) {
		passes.Add(1)
		cancel()
		return Report{}, context.Canceled
	})
	if n := passes.Load(); n != 1 {
		t.Fatalf("%d passes after the converger stopped, want 1", n)
	}
}
