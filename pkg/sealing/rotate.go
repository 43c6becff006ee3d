package sealing

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/pkg/retry"
)

// Rotation is the background re-encryption a service's leader runs: it calls Step, one bounded
// batch at a time, until nothing is left, logs once when done, then scans again every Interval
// (records written meanwhile by an instance still on an older active key). It keeps no state
// of its own: after a restart or a change of leader the next scan finds what is left.
type Rotation struct {
	// Step re-encrypts one bounded batch under the active key and returns how many records it
	// rewrote and how many are left to rewrite. A record changed meanwhile must not be
	// overwritten: Step writes through the store's compare-and-swap path.
	Step func(ctx context.Context) (rewritten, left int, err error)
	// Active is the active key's label, for the logs.
	Active string
	// Interval is the wait between scans once nothing is left (default 30s).
	Interval time.Duration
	// Logger receives a line when a pass starts and when it is done, and failed steps.
	Logger hclog.Logger
}

// rotationRetry is the wait after a failed step (a lost race, etcd unreachable).
var rotationRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// Run re-encrypts until ctx ends; it returns nil then.
func (r Rotation) Run(ctx context.Context) error {
	if r.Interval <= 0 {
		r.Interval = 30 * time.Second
	}
	log := r.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	backoff := rotationRetry.BackOff()
	total, running := 0, false
	for ctx.Err() == nil {
		n, left, err := r.Step(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			wait := backoff.NextBackOff()
			log.Warn("re-encryption step failed; retrying", "error", err, "backoff", wait)
			retry.Sleep(ctx, wait)
			continue
		}
		if n > 0 && !running {
			running = true
			log.Info("re-encrypting records under the active key", "active_key_label", r.Active, "left", left+n)
		}
		total += n
		if left > 0 {
			if n > 0 {
				backoff.Reset()
			} else { // what was picked went away meanwhile: look again shortly
				retry.Sleep(ctx, backoff.NextBackOff())
			}
			continue
		}
		backoff.Reset()
		if running {
			log.Info("re-encryption done: every record is sealed under the active key", "active_key_label", r.Active, "records", total)
			running, total = false, 0
		}
		retry.Sleep(ctx, r.Interval)
	}
	return nil
}
