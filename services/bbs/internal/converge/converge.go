// Package converge is the BBS's convergence: run by the leader on a timer and at once when a
// cell's presence disappears, it compares desired and actual state in the store's cache and
// repairs the difference through core, one compare-and-swap transaction per change, each
// re-checking its condition on the data it reads.
//
// LRPs: missing instances are created and auctioned; instances no longer desired are retired
// while their domain is fresh; UNCLAIMED instances older than the unclaimed timeout (or with a
// placement error) are auctioned again; CRASHED instances are restarted when their backoff has
// passed (pkg/models restart policy); instances on a vanished cell become SUSPECT and are
// replaced, the suspect being removed once its replacement runs or promoted back if its cell
// returns first.
//
// Tasks: PENDING tasks are auctioned again, and failed when not started within the pending
// timeout; RUNNING tasks on a vanished cell are failed; completed tasks' callbacks are retried,
// and completed or resolving tasks are deleted after the completed timeout.
package converge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// Defaults of Config.
const (
	DefaultInterval             = 30 * time.Second
	DefaultUnclaimedTimeout     = 30 * time.Second
	DefaultPendingTaskTimeout   = 30 * time.Minute
	DefaultCompletedTaskTimeout = 2 * time.Minute
)

// workers bounds the changes applied at once (the store group-commits them).
const workers = 16

// maxErrors bounds the errors one pass returns (the rest are only counted).
const maxErrors = 10

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
	// Now is the clock (default: the core's).
	Now func() time.Time
	// Logger receives convergence logs.
	Logger hclog.Logger
	// Metrics records each pass; nil records nothing.
	Metrics *Metrics
}

// Report is what one pass found and did.
type Report struct {
	// LRPsMissing counts desired instances that had no ordinary record.
	LRPsMissing int
	// LRPsExtra counts ordinary records that are no longer desired.
	LRPsExtra int
	// CrashedLRPs counts CRASHED instances.
	CrashedLRPs int
	// SuspectLRPs counts SUSPECT records found.
	SuspectLRPs int

	// Created counts instances created for missing slots.
	Created int
	// Retired counts extra instances retired (deleted, or their stop requested).
	Retired int
	// Reauctioned counts stale UNCLAIMED instances sent to the auctioneer again.
	Reauctioned int
	// Restarted counts CRASHED instances restarted after their backoff.
	Restarted int
	// Suspected counts instances of vanished cells unclaimed for replacement.
	Suspected int
	// Promoted counts suspects promoted back to ordinary after their cell returned.
	Promoted int
	// SuspectsRemoved counts suspects removed because their replacement runs.
	SuspectsRemoved int
	// EvacuatingRemoved counts EVACUATING copies removed because their cell vanished or their
	// slot is no longer desired.
	EvacuatingRemoved int

	// TasksReauctioned counts PENDING tasks sent to the auctioneer again.
	TasksReauctioned int
	// TasksFailed counts tasks failed (not started in time, or cell vanished).
	TasksFailed int
	// TaskCallbacksRetried counts completion callbacks queued again.
	TaskCallbacksRetried int
	// TasksDeleted counts expired completed or resolving tasks deleted.
	TasksDeleted int

	// Errors counts changes that failed; they are retried by the next pass.
	Errors int
	// Duration is how long the pass took.
	Duration time.Duration
}

// Converger runs convergence passes over a core.
type Converger struct {
	core *core.Core
	st   *store.Store
	cfg  Config
	log  hclog.Logger
	mu   sync.Mutex // one pass at a time
}

// New returns a converger over c.
func New(c *core.Core, cfg Config) *Converger {
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
	if cfg.Now == nil {
		cfg.Now = c.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Converger{core: c, st: c.Store(), cfg: cfg, log: cfg.Logger}
}

// Run converges every Interval and whenever trigger fires (a cell disappeared), until ctx
// ends. As in Diego, the first timed pass comes one Interval after Run starts, so a new leader
// (or a whole cluster restarting) gives reps time to register their presence before their
// instances are judged. Failed passes are logged; the next one retries.
func (c *Converger) Run(ctx context.Context, trigger <-chan struct{}) error {
	select {
	case <-c.st.Synced():
	case <-ctx.Done():
		return nil
	}
	ticker := time.NewTicker(c.cfg.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-trigger:
			c.log.Info("a cell disappeared; converging")
		}
		r, err := c.Converge(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			c.log.Warn("convergence pass had failures; the next pass retries them", "errors", r.Errors, "error", err)
		}
		c.log.Debug("convergence pass", "duration", r.Duration, "missing", r.LRPsMissing, "extra", r.LRPsExtra,
			"crashed", r.CrashedLRPs, "suspect", r.SuspectLRPs, "tasks_failed", r.TasksFailed)
	}
}

// slot is the records of one instance index.
type slot struct {
	ord, sus, evac *modelsv1.ActualLRP
}

// job is one change: fn reports whether it changed something, counted in *n.
type job struct {
	n  *int
	fn func(ctx context.Context) (int, error)
}

// Converge runs one pass: it reads the cache, decides the work and applies it. It returns what
// it found and did, and the errors of failed changes (each retried by the next pass).
func (c *Converger) Converge(ctx context.Context) (Report, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	started := time.Now()
	now := c.cfg.Now()
	var r Report

	scheds, _ := c.st.SchedulingInfos(store.ListFilter{})
	actuals, _ := c.st.ActualLRPs(store.ListFilter{})
	tasks, _ := c.st.Tasks(store.ListFilter{})
	cellList, _ := c.st.Cells()
	domainList, _ := c.st.Domains()
	cells := make(map[string]bool, len(cellList))
	for _, cell := range cellList {
		cells[cell.GetCellId()] = true
	}
	domains := make(map[string]bool, len(domainList))
	for _, d := range domainList {
		domains[d.GetName()] = true
	}
	desired := make(map[string]*modelsv1.DesiredLRPSchedulingInfo, len(scheds))
	for _, s := range scheds {
		desired[s.GetProcessGuid()] = s
	}
	slots := map[string]map[int32]*slot{}
	slotOf := func(guid string, index int32) *slot {
		m := slots[guid]
		if m == nil {
			m = map[int32]*slot{}
			slots[guid] = m
		}
		if m[index] == nil {
			m[index] = &slot{}
		}
		return m[index]
	}
	for _, a := range actuals {
		switch a.GetPresence() {
		case modelsv1.ActualLRP_PRESENCE_ORDINARY:
			slotOf(a.GetKey().GetProcessGuid(), a.GetKey().GetIndex()).ord = a
		case modelsv1.ActualLRP_PRESENCE_SUSPECT:
			slotOf(a.GetKey().GetProcessGuid(), a.GetKey().GetIndex()).sus = a
		case modelsv1.ActualLRP_PRESENCE_EVACUATING:
			slotOf(a.GetKey().GetProcessGuid(), a.GetKey().GetIndex()).evac = a
		}
	}
	isDesired := func(guid string, index int32) bool {
		s := desired[guid]
		return s != nil && index < s.GetInstances()
	}
	one := func(ok bool, err error) (int, error) {
		if ok {
			return 1, err
		}
		return 0, err
	}

	var jobs []job
	add := func(n *int, fn func(ctx context.Context) (int, error)) { jobs = append(jobs, job{n: n, fn: fn}) }

	// Missing instances.
	for _, s := range scheds {
		guid, missing := s.GetProcessGuid(), 0
		for i := int32(0); i < s.GetInstances(); i++ {
			if sl := slots[guid][i]; sl == nil || sl.ord == nil {
				missing++
			}
		}
		if missing > 0 {
			r.LRPsMissing += missing
			add(&r.Created, func(ctx context.Context) (int, error) {
				created, err := c.core.DesiredLRPs.ConvergeMissingLRP(ctx, guid)
				return len(created), err
			})
		}
	}

	// Ordinary instances: extra, stale UNCLAIMED, vanished cells, crashes.
	var stale []core.LRPStart
	for _, a := range actuals {
		if a.GetPresence() != modelsv1.ActualLRP_PRESENCE_ORDINARY {
			continue
		}
		guid, index := a.GetKey().GetProcessGuid(), a.GetKey().GetIndex()
		if !isDesired(guid, index) {
			r.LRPsExtra++
			if domains[a.GetKey().GetDomain()] {
				add(&r.Retired, func(ctx context.Context) (int, error) {
					return one(c.core.ActualLRPs.ConvergeExtraLRP(ctx, guid, index))
				})
			}
			continue
		}
		switch a.GetState() {
		case modelsv1.ActualLRP_STATE_UNCLAIMED:
			if a.GetPlacementError() != nil || !a.GetSince().AsTime().Add(c.cfg.UnclaimedTimeout).After(now) {
				if n := len(stale); n > 0 && stale[n-1].SchedulingInfo.GetProcessGuid() == guid {
					stale[n-1].Indices = append(stale[n-1].Indices, index)
				} else {
					stale = append(stale, core.LRPStart{SchedulingInfo: desired[guid], Indices: []int32{index}})
				}
				r.Reauctioned++
			}
		case modelsv1.ActualLRP_STATE_CLAIMED, modelsv1.ActualLRP_STATE_RUNNING:
			if ik := a.GetInstanceKey(); !cells[ik.GetCellId()] {
				add(&r.Suspected, func(ctx context.Context) (int, error) {
					return one(c.core.ActualLRPs.ConvergeSuspectLRP(ctx, guid, index, ik))
				})
			}
		case modelsv1.ActualLRP_STATE_CRASHED:
			r.CrashedLRPs++
			if models.ShouldRestartCrashed(a, now) {
				add(&r.Restarted, func(ctx context.Context) (int, error) {
					return one(c.core.ActualLRPs.ConvergeCrashedLRP(ctx, guid, index))
				})
			}
		}
	}

	// Suspects: removed once replaced (or no longer desired), promoted if their cell is back.
	// Evacuating copies: removed once their cell is gone or the slot is no longer desired.
	for guid, m := range slots {
		for index, sl := range m {
			if sl.evac != nil && (!cells[sl.evac.GetInstanceKey().GetCellId()] || !isDesired(guid, index)) {
				add(&r.EvacuatingRemoved, func(ctx context.Context) (int, error) {
					return one(c.core.ActualLRPs.ConvergeRemoveEvacuatingLRP(ctx, guid, index))
				})
			}
			if sl.sus == nil {
				continue
			}
			r.SuspectLRPs++
			replaced := sl.ord != nil && sl.ord.GetState() == modelsv1.ActualLRP_STATE_RUNNING
			switch {
			case !isDesired(guid, index) || replaced:
				add(&r.SuspectsRemoved, func(ctx context.Context) (int, error) {
					return one(c.core.ActualLRPs.ConvergeRemoveSuspectLRP(ctx, guid, index))
				})
			case cells[sl.sus.GetInstanceKey().GetCellId()]:
				add(&r.Promoted, func(ctx context.Context) (int, error) {
					return one(c.core.ActualLRPs.ConvergePromoteSuspectLRP(ctx, guid, index))
				})
			}
		}
	}

	// Tasks.
	var pending []*modelsv1.Task
	for _, task := range tasks {
		guid := task.GetTaskGuid()
		switch task.GetState() {
		case modelsv1.Task_STATE_PENDING:
			if !task.GetCreatedAt().AsTime().Add(c.cfg.PendingTaskTimeout).After(now) {
				deadline := now.Add(-c.cfg.PendingTaskTimeout)
				add(&r.TasksFailed, func(ctx context.Context) (int, error) {
					return one(c.core.Tasks.ConvergeExpirePendingTask(ctx, guid, deadline))
				})
			} else if !task.GetUpdatedAt().AsTime().Add(c.cfg.UnclaimedTimeout).After(now) {
				pending = append(pending, task)
			}
		case modelsv1.Task_STATE_RUNNING:
			if !cells[task.GetCellId()] {
				add(&r.TasksFailed, func(ctx context.Context) (int, error) { return one(c.core.Tasks.ConvergeTaskOnVanishedCell(ctx, guid)) })
			}
		case modelsv1.Task_STATE_COMPLETED, modelsv1.Task_STATE_RESOLVING:
			if !core.CompletedAt(task).Add(c.cfg.CompletedTaskTimeout).After(now) {
				deadline := now.Add(-c.cfg.CompletedTaskTimeout)
				add(&r.TasksDeleted, func(ctx context.Context) (int, error) {
					return one(c.core.Tasks.ConvergeDeleteTask(ctx, guid, deadline))
				})
			} else if task.GetDefinition().GetCompletionCallbackUrl() != "" &&
				!task.GetUpdatedAt().AsTime().Add(c.cfg.UnclaimedTimeout).After(now) {
				add(&r.TaskCallbacksRetried, func(ctx context.Context) (int, error) {
					return one(c.core.Tasks.ConvergeRetryTaskCallback(ctx, guid))
				})
			}
		}
	}

	errs := c.run(ctx, jobs, &r)
	c.core.ActualLRPs.RequestLRPAuctions(stale)
	c.core.Tasks.RequestTaskAuctions(pending)
	r.TasksReauctioned = len(pending)
	r.Duration = time.Since(started)
	c.cfg.Metrics.observe(r)
	if len(errs) > 0 {
		return r, fmt.Errorf("convergence: %d changes failed: %w", r.Errors, errors.Join(errs...))
	}
	return r, nil
}

// run applies jobs with bounded parallelism, adding their counts to the report.
func (c *Converger) run(ctx context.Context, jobs []job, r *Report) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	next := make(chan job)
	for w := 0; w < min(workers, len(jobs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				n, err := j.fn(ctx)
				mu.Lock()
				*j.n += n
				if err != nil {
					r.Errors++
					if len(errs) < maxErrors {
						errs = append(errs, err)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		if ctx.Err() != nil {
			break
		}
		next <- j
	}
	close(next)
	wg.Wait()
	return errs
}
