// Package callback delivers task completion callbacks: an HTTP POST of the completed task's
// JSON to its completion_callback_url, retried with backoff; a delivered task is resolved and
// deleted. Undelivered tasks stay COMPLETED for convergence to retry.
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
	// QueueSize bounds the tasks waiting for delivery (default 10,000); beyond it tasks are left
	// for convergence.
	QueueSize int
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

// Worker delivers completion callbacks in the background.
type Worker struct {
	cfg      Config
	queue    chan *modelsv1.Task
	resolver Resolver
	mu       sync.Mutex
	inFlight map[string]bool
}

// New returns a worker that resolves delivered tasks through r.
func New(cfg Config, r Resolver) *Worker {
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 10_000
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
	return &Worker{cfg: cfg, queue: make(chan *modelsv1.Task, cfg.QueueSize), resolver: r, inFlight: map[string]bool{}}
}

// SetResolver sets the resolver when it is built after the worker (the BBS core needs the
// worker as its queue, the worker needs the core as its resolver).
func (w *Worker) SetResolver(r Resolver) { w.resolver = r }

// Enqueue queues a completed task for delivery without blocking; a task already queued or
// being delivered is not queued twice.
func (w *Worker) Enqueue(task *modelsv1.Task) {
	w.mu.Lock()
	if w.inFlight[task.GetTaskGuid()] {
		w.mu.Unlock()
		return
	}
	w.inFlight[task.GetTaskGuid()] = true
	w.mu.Unlock()
	select {
	case w.queue <- task:
	default:
		w.done(task.GetTaskGuid())
		w.cfg.Logger.Warn("callback queue full; leaving the task for convergence", "task_guid", task.GetTaskGuid())
	}
}

func (w *Worker) done(guid string) {
	w.mu.Lock()
	delete(w.inFlight, guid)
	w.mu.Unlock()
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
				case task := <-w.queue:
					w.deliver(ctx, task)
					w.done(task.GetTaskGuid())
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
	body, err := protojson.Marshal(task)
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
