// Package callback delivers task completion callbacks: an HTTP POST of the completed task's
// JSON to its completion_callback_url, retried with backoff; a delivered task is resolved and
// deleted. Undelivered tasks stay COMPLETED for convergence to retry.
//
// The Queue takes completed tasks (the BBS core enqueues them); a Worker delivers what the
// queue holds and resolves delivered tasks (through the core). The queue is built first, the
// core over it, the worker last over both: nothing is wired after it is built.
package callback

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/encoding/protojson"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Resolver finishes a task whose callback was delivered.
type Resolver interface {
	ResolvingTask(ctx context.Context, guid string) error
	DeleteTask(ctx context.Context, guid string) error
}

// Config tunes the worker; zero values take defaults.
type Config struct {
	// Workers is how many callbacks are delivered at once (default 8).
	Workers int
	// Attempts is how many times one callback is tried (default 5).
	Attempts int
	// Backoff is the wait before the second attempt, doubled after each failure (default 500ms).
	Backoff time.Duration
	// Timeout bounds one HTTP request (default 10s).
	Timeout time.Duration
	// Client sends the requests (default an http.Client with Timeout).
	Client *http.Client
	// Logger receives the worker's logs.
	Logger hclog.Logger
}

// DefaultQueueSize bounds a Queue built with no size.
const DefaultQueueSize = 10_000

// Queue holds completed tasks waiting for delivery, each task at most once at a time (queued
// or being delivered).
type Queue struct {
	tasks    chan *modelsv1.Task
	log      hclog.Logger
	mu       sync.Mutex
	inFlight map[string]bool
}

// NewQueue returns a queue of at most size tasks (default DefaultQueueSize); beyond it tasks
// are left for convergence, and logged to logger.
func NewQueue(size int, logger hclog.Logger) *Queue {
	if size <= 0 {
		size = DefaultQueueSize
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Queue{tasks: make(chan *modelsv1.Task, size), log: logger, inFlight: map[string]bool{}}
}

// Enqueue queues a completed task for delivery without blocking; a task already queued or
// being delivered is not queued twice.
func (q *Queue) Enqueue(task *modelsv1.Task) {
	q.mu.Lock()
	if q.inFlight[task.GetTaskGuid()] {
		q.mu.Unlock()
		return
	}
	q.inFlight[task.GetTaskGuid()] = true
	q.mu.Unlock()
	select {
	case q.tasks <- task:
	default:
		q.done(task.GetTaskGuid())
		q.log.Warn("callback queue full; leaving the task for convergence", "task_guid", task.GetTaskGuid())
	}
}

// done ends a task's turn in the queue: it may be queued again.
func (q *Queue) done(guid string) {
	q.mu.Lock()
	delete(q.inFlight, guid)
	q.mu.Unlock()
}

// Worker delivers the completion callbacks of a Queue in the background.
type Worker struct {
	cfg      Config
	queue    *Queue
	resolver Resolver
}

// New returns a worker that delivers the callbacks of q and resolves delivered tasks through
// r.
func New(cfg Config, q *Queue, r Resolver) *Worker {
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 5
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 500 * time.Millisecond
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Worker{cfg: cfg, queue: q, resolver: r}
}

// Run delivers queued callbacks until ctx ends.
func (w *Worker) Run(ctx context.Context, ready func()) error {
	var wg sync.WaitGroup
	for i := 0; i < w.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case task := <-w.queue.tasks:
					w.deliver(ctx, task)
					w.queue.done(task.GetTaskGuid())
				}
			}
		}()
	}
	ready()
	wg.Wait()
	return nil
}

// errPermanent marks an answer that retrying cannot change.
var errPermanent = errors.New("permanent failure")

func (w *Worker) deliver(ctx context.Context, task *modelsv1.Task) {
	log := w.cfg.Logger.With("task_guid", task.GetTaskGuid(), "url", task.GetDefinition().GetCompletionCallbackUrl())
	// The callback URL is no authenticated caller: it gets the task with its secrets redacted.
	body, err := protojson.Marshal(models.RedactSecrets(task))
	if err != nil {
		log.Error("encoding task for its callback", "error", err)
		return
	}
	attempt := 0
	err = retry.Do(ctx, retry.Policy{Initial: w.cfg.Backoff}, uint(w.cfg.Attempts), func() error {
		attempt++
		err := w.post(ctx, task.GetDefinition().GetCompletionCallbackUrl(), body)
		if errors.Is(err, errPermanent) {
			return retry.Permanent(err)
		}
		return err
	}, func(err error, next time.Duration) {
		log.Debug("completion callback failed; retrying", "attempt", attempt, "backoff", next, "error", err)
	})
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("completion callback not delivered; the task stays COMPLETED for convergence", "attempts", attempt, "error", err)
		}
		return
	}
	if err := w.resolver.ResolvingTask(ctx, task.GetTaskGuid()); err != nil {
		if !errors.Is(err, rpcerr.ErrFailedPrecondition) && !errors.Is(err, rpcerr.ErrNotFound) {
			log.Warn("resolving task after its callback", "error", err)
		}
		return
	}
	if err := w.resolver.DeleteTask(ctx, task.GetTaskGuid()); err != nil {
		log.Warn("deleting task after its callback", "error", err)
	}
}

func (w *Worker) post(ctx context.Context, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", errPermanent, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 500, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusRequestTimeout:
		return fmt.Errorf("callback answered %s", resp.Status)
	default:
		return fmt.Errorf("%w: callback answered %s", errPermanent, resp.Status)
	}
}
