// Package converge is the BBS's convergence loop: run by the leader on a timer and at once when
// a cell's presence disappears, each pass takes a snapshot of desired and actual state from the
// store's cache, lets the pure planner (package plan, where the rules are) decide the changes,
// and applies them (apply.go) through the core, one compare-and-swap transaction per change,
// each re-checking its rule on the data it reads.
package converge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/semaphore"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/services/bbs/internal/converge/plan"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// Defaults of Config.
const (
	DefaultInterval             = 30 * time.Second
	DefaultUnclaimedTimeout     = 30 * time.Second
	DefaultPendingTaskTimeout   = 30 * time.Minute
	DefaultCompletedTaskTimeout = 2 * time.Minute
	DefaultClaimedTimeout       = 5 * time.Minute
)

// workers bounds the records a pass changes at once (the store group-commits them): enough to
// fill the store's group committer (store.MaxOpsInFlight), at two operations per instance of a
// lost cell. With 256, a pass kept five cells' groups in flight, one transaction's worth: at
// full size the 10% cell loss unclaimed about 350 instances a second while etcd took a
// transaction in about 300 ms (docs/performance.md).
const workers = store.MaxOpsInFlight / 2

// Config tunes a Converger; zero values take the defaults.
type Config struct {
	// Interval is the time between timer-driven passes (default 30 s).
	Interval time.Duration
	// UnclaimedTimeout is how long an instance stays UNCLAIMED before it is auctioned again
	// (default 30 s); it is also how long a PENDING task or a completed task's callback waits
	// before it is retried.
	UnclaimedTimeout time.Duration
	// PendingTaskTimeout fails a task not started this long after it was created (default 30 min).
	PendingTaskTimeout time.Duration
	// CompletedTaskTimeout deletes a completed (or resolving) task this long after it first
	// completed (default 2 min).
	CompletedTaskTimeout time.Duration
	// ClaimedTimeout unclaims and auctions again an instance CLAIMED this long on a cell that is
	// present, whose rep never reported it running (default 5 min).
	ClaimedTimeout time.Duration
	// DrainTimeout is the drain timeout after which a draining instance is stopped by
	// convergence (default core.DefaultDrainTimeout); keep it equal to the core's.
	DrainTimeout time.Duration
	// Now is the clock (default: the core's).
	Now func() time.Time
	// Logger receives convergence logs.
	Logger hclog.Logger
	// Metrics records each pass; nil records nothing.
	Metrics *Metrics
	// SuspectsPerTxn is the most instances of one lost cell that one transaction replaces
	// (default 64, DefaultSuspectsPerTxn; 1 replaces each in its own, as before decision 0050).
	SuspectsPerTxn int
}

// Report is what one pass found (plan.Found) and did (Applied).
type Report struct {
	plan.Found
	Applied
	// Duration is how long the pass took.
	Duration time.Duration
}

// Cache is the store's cache as convergence reads it: the snapshot a pass plans from, and when
// it is first filled.
type Cache interface {
	Synced() <-chan struct{}
	SchedulingInfos(f store.ListFilter) ([]*modelsv1.DesiredLRPSchedulingInfo, int64)
	ActualLRPs(f store.ListFilter) ([]*modelsv1.ActualLRP, int64)
	OnLostCells(skip func(cellID string) bool) (store.LostCells, int64)
	Tasks(f store.ListFilter) ([]*modelsv1.Task, int64)
	Cells() ([]*modelsv1.CellPresence, int64)
	Domains() ([]*modelsv1.Domain, int64)
}

var _ Cache = (*store.Store)(nil)

// Converger runs convergence passes over a core.
type Converger struct {
	core *core.Core
	st   Cache
	cfg  Config
	log  hclog.Logger
	full sync.Mutex // one full pass at a time
	// judging holds the cells whose records a cell-loss pass under way judges: a pass for
	// cells lost later takes the others, beside it (guarded by judgingMu).
	judgingMu sync.Mutex
	judging   map[string]bool
	// cellSlots bounds the records all cell-loss passes change at once.
	cellSlots *semaphore.Weighted
}

// New returns a converger that plans from cache and applies through c.
func New(c *core.Core, cache Cache, cfg Config) *Converger {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.UnclaimedTimeout <= 0 {
		cfg.UnclaimedTimeout = DefaultUnclaimedTimeout
	}
	if cfg.PendingTaskTimeout <= 0 {
		cfg.PendingTaskTimeout = DefaultPendingTaskTimeout
	}
	if cfg.CompletedTaskTimeout <= 0 {
		cfg.CompletedTaskTimeout = DefaultCompletedTaskTimeout
	}
	if cfg.ClaimedTimeout <= 0 {
		cfg.ClaimedTimeout = DefaultClaimedTimeout
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = core.DefaultDrainTimeout
	}
	if cfg.Now == nil {
		cfg.Now = c.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.SuspectsPerTxn <= 0 {
		cfg.SuspectsPerTxn = DefaultSuspectsPerTxn
	}
	return &Converger{core: c, st: cache, cfg: cfg, log: cfg.Logger, judging: map[string]bool{},
		cellSlots: semaphore.NewWeighted(workers)}
}

// Run converges every Interval and, with the cell-loss rules only (ConvergeCells), whenever
// trigger fires (a cell disappeared), until ctx ends. As in Diego, the first timed pass comes
// one Interval after Run starts, so a new leader (or a whole cluster restarting) gives reps time
// to register their presence before their instances are judged. Failed passes are logged; the
// next one retries.
//
// The cell-loss passes run beside the timed ones, not after them: at 250,000 instances a full
// pass took 4–16 s on a busy machine, and a lost cell's instances waited for it (decision
// 0060). Two passes that judge the same instance cannot both change it: every change is a
// compare-and-swap that checks the record it read, as against any other writer. A full pass
// also leaves the cells a cell-loss pass is judging to that pass: its snapshot, taken before,
// would lose those compares, each a transaction spent for nothing and a change retried.
func (c *Converger) Run(ctx context.Context, trigger <-chan struct{}) error {
	select {
	case <-c.st.Synced():
	case <-ctx.Done():
		return nil
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-trigger:
				c.log.Info("a cell disappeared; converging its instances")
				wg.Go(func() { c.convergeCells(ctx, c.ConvergeCells) })
			}
		}
	})
	ticker := time.NewTicker(c.cfg.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			r, err := c.Converge(ctx)
			c.logPass(ctx, "full", r, err)
		}
	}
}

// cellRetryFirst is how long after a cell-loss pass with failed changes the pass that tries
// them again starts; each further one waits twice as long, up to the Interval.
const cellRetryFirst = 250 * time.Millisecond

// convergeCells runs a cell-loss pass (pass: ConvergeCells), and again, after a backoff, for as
// long as the last one had failed changes. The cells they were on are still lost, and the pass
// after takes them again, where they were left to the next full pass: an Interval away, and
// slow on a busy store. In a full-size run, a cell's group of changes timed out in the busy
// store (its write not made), and its instances became UNCLAIMED 95 s after the cell's expiry,
// where the rest of the 10% loss's were by 36 s at the median.
func (c *Converger) convergeCells(ctx context.Context, pass func(context.Context) (Report, error)) {
	wait := retry.Policy{Initial: cellRetryFirst, Max: c.cfg.Interval}.BackOff()
	for {
		r, err := pass(ctx)
		c.logPass(ctx, "cell loss", r, err)
		if err == nil || ctx.Err() != nil || !retry.Sleep(ctx, wait.NextBackOff()) {
			return
		}
	}
}

// logPass logs a finished pass of the given kind ("full" or "cell loss"), unless ctx ended
// it: at info, as Diego logs its convergence, with what it found and changed and how long it
// took.
func (c *Converger) logPass(ctx context.Context, kind string, r Report, err error) {
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		c.log.Warn("convergence pass had failures; a later pass retries them", "pass", kind, "errors", r.Errors, "error", err)
	}
	c.log.Info("convergence pass", "pass", kind, "duration", r.Duration, "missing", r.LRPsMissing, "extra", r.LRPsExtra,
		"crashed", r.CrashedLRPs, "suspect", r.SuspectLRPs, "stale_claimed", r.StaleClaimedLRPs, "tasks_failed", r.TasksFailed,
		"suspected", r.Suspected, "reauctioned", r.Reauctioned, "created", r.Created, "errors", r.Errors)
}

// Converge runs one pass: it reads the cache, plans the changes and applies them. It returns
// what it found and did, and the errors of failed changes (each retried by the next pass).
func (c *Converger) Converge(ctx context.Context) (Report, error) {
	c.full.Lock()
	defer c.full.Unlock()
	started := time.Now()
	p := plan.Make(c.snapshot(), plan.Timeouts{
		Unclaimed:     c.cfg.UnclaimedTimeout,
		PendingTask:   c.cfg.PendingTaskTimeout,
		CompletedTask: c.cfg.CompletedTaskTimeout,
		Claimed:       c.cfg.ClaimedTimeout,
		Drain:         c.cfg.DrainTimeout,
	})
	applied, errs := applyPlan(ctx, c.core, p.Changes, semaphore.NewWeighted(workers), c.cfg.SuspectsPerTxn, c.judgedByCellPass)
	r := Report{Found: p.Found, Applied: applied, Duration: time.Since(started)}
	c.cfg.Metrics.observe(r)
	if len(errs) > 0 {
		return r, fmt.Errorf("convergence: %d changes failed: %w", r.Errors, errors.Join(errs...))
	}
	return r, nil
}

// ConvergeCells runs a cell-loss pass: the records and tasks of cells without presence are
// read from the cache's index by cell, planned with the cell-loss rules only (plan.CellLoss)
// and applied as Converge applies them. A pass takes the lost cells no other cell-loss pass
// is judging, so passes for cells lost one after another run side by side instead of each
// waiting for the one before; all of them together change at most workers records at once.
func (c *Converger) ConvergeCells(ctx context.Context) (Report, error) {
	started := time.Now()
	c.judgingMu.Lock()
	lost, _ := c.st.OnLostCells(func(id string) bool { return c.judging[id] })
	for _, id := range lost.Cells {
		c.judging[id] = true
	}
	c.judgingMu.Unlock()
	defer func() {
		c.judgingMu.Lock()
		for _, id := range lost.Cells {
			delete(c.judging, id)
		}
		c.judgingMu.Unlock()
	}()
	guids := make(map[string]struct{}, len(lost.Actual))
	for _, a := range lost.Actual {
		guids[a.GetKey().GetProcessGuid()] = struct{}{}
	}
	scheds, _ := c.st.SchedulingInfos(store.ListFilter{Guids: guids})
	// Every record given is on a lost cell: the snapshot names no cell present.
	p := plan.CellLoss(plan.Snapshot{Desired: scheds, Actual: lost.Actual, Tasks: lost.Tasks, Now: c.cfg.Now()})
	applied, errs := applyPlan(ctx, c.core, p.Changes, c.cellSlots, c.cfg.SuspectsPerTxn, nil)
	r := Report{Found: p.Found, Applied: applied, Duration: time.Since(started)}
	c.cfg.Metrics.observeRun(r)
	if len(errs) > 0 {
		return r, fmt.Errorf("cell-loss convergence: %d changes failed: %w", r.Errors, errors.Join(errs...))
	}
	return r, nil
}

// judgedByCellPass reports whether a cell-loss pass under way judges cellID's records.
func (c *Converger) judgedByCellPass(cellID string) bool {
	c.judgingMu.Lock()
	defer c.judgingMu.Unlock()
	return c.judging[cellID]
}

// snapshot reads what the planner judges from the cache.
func (c *Converger) snapshot() plan.Snapshot {
	scheds, _ := c.st.SchedulingInfos(store.ListFilter{})
	actuals, _ := c.st.ActualLRPs(store.ListFilter{})
	tasks, _ := c.st.Tasks(store.ListFilter{})
	cells, _ := c.st.Cells()
	domains, _ := c.st.Domains()
	return plan.Snapshot{Desired: scheds, Actual: actuals, Tasks: tasks, Cells: cells, Domains: domains, Now: c.cfg.Now()}
}
