package converge

import (
	"context"
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

func (c *slowCache) ActualLRPsOffCells(func(string) bool) ([]*modelsv1.ActualLRP, int64) {
	c.cellReads.Add(1)
	return nil, 1
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
