package core

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Background runs work the core has promised but a request need not wait for (auction
// requests, stopping instances, cancelling tasks) on a fixed pool of workers fed by a bounded
// queue. It is a member of the BBS's run group: Run starts the workers, and when its context
// ends it stops taking work, cancels the jobs in flight, drops the queued ones (convergence
// redoes all of them) and returns only once every worker has exited.
type Background struct {
	log     hclog.Logger
	workers int
	timeout time.Duration
	jobs    chan backgroundJob

	mu      sync.Mutex
	running bool
}

type backgroundJob struct {
	what string
	fn   func(ctx context.Context) error
}

// Background defaults.
const (
	// DefaultBackgroundWorkers is how many background jobs run at once.
	DefaultBackgroundWorkers = 16
	// DefaultBackgroundQueue is how many background jobs may wait; more are dropped.
	DefaultBackgroundQueue = 4096
	// backgroundTimeout bounds one background job.
	backgroundTimeout = 30 * time.Second
)

// NewBackground returns a queue of capacity queue served by workers workers (defaults for
// values ≤ 0). Nothing runs until Run.
func NewBackground(workers, queue int, logger hclog.Logger) *Background {
	if workers <= 0 {
		workers = DefaultBackgroundWorkers
	}
	if queue <= 0 {
		queue = DefaultBackgroundQueue
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Background{log: logger, workers: workers, timeout: backgroundTimeout, jobs: make(chan backgroundJob, queue)}
}

// Go queues fn; it reports false, and fn never runs, when the queue is full or the pool is not
// running. fn gets a context that ends after the job's time bound or when the pool stops.
func (b *Background) Go(what string, fn func(ctx context.Context) error) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.running {
		return false
	}
	select {
	case b.jobs <- backgroundJob{what: what, fn: fn}:
		return true
	default:
		return false
	}
}

// Run serves the queue until ctx ends, then stops as described on Background.
func (b *Background) Run(ctx context.Context, ready func()) error {
	b.mu.Lock()
	b.running = true
	b.mu.Unlock()
	var wg sync.WaitGroup
	for range b.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-b.jobs:
					b.run(ctx, j)
				}
			}
		}()
	}
	ready()
	<-ctx.Done()
	b.mu.Lock()
	b.running = false
	b.mu.Unlock()
	wg.Wait()
	dropped := 0
	for {
		select {
		case <-b.jobs:
			dropped++
			continue
		default:
		}
		break
	}
	if dropped > 0 {
		b.log.Info("stopping: dropped queued background jobs; convergence redoes them", "jobs", dropped)
	}
	return nil
}

func (b *Background) run(ctx context.Context, j backgroundJob) {
	jctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	if err := j.fn(jctx); err != nil {
		b.log.Warn("background request failed; convergence will retry", "what", j.what, "error", err)
	}
}
