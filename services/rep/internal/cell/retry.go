package cell

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Bounds of call's retries.
const callAttempts = 5

// callPolicy is the wait between call's attempts.
var callPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// call makes one BBS call, retrying (up to callAttempts, with backoff) while the BBS is
// unavailable, a compare-and-swap was lost or an attempt timed out. A BBS that sheds load
// (ResourceExhausted with a retry-after) is waited for as long as it asks and as often as it
// takes while ctx lasts: those refusals are not failed attempts.
func (c *Cell) call(ctx context.Context, what string, f func(ctx context.Context) error) error {
	return c.retry(ctx, what, callAttempts, f)
}

// retry is call with at most attempts failed attempts; zero retries until ctx ends.
func (c *Cell) retry(ctx context.Context, what string, attempts int, f func(ctx context.Context) error) error {
	b := callPolicy.BackOff()
	for failed := 0; ; {
		actx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		err := f(actx)
		cancel()
		if err == nil {
			return nil
		}
		if !retriable(err) || ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		wait, shed := rpcerr.RetryAfter(err)
		if shed {
			wait = jitter(wait)
		} else {
			if failed++; attempts > 0 && failed >= attempts {
				return fmt.Errorf("%s: %w", what, err)
			}
			wait = b.NextBackOff()
		}
		c.log.Debug("bbs call failed, retrying", "call", what, "failed_attempts", failed, "shed", shed, "error", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		}
	}
}

// jitter spreads a retry-after over [d, 2d) so that refused callers do not come back together.
func jitter(d time.Duration) time.Duration {
	return d + rand.N(max(d, time.Millisecond))
}

// retriable reports whether a BBS error may go away on its own.
func retriable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.ResourceExhausted:
		return true
	}
	return false
}

// gone reports whether a BBS error means the record is absent or no longer this container's,
// so there is nothing left to report.
func gone(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.FailedPrecondition:
		return true
	}
	return false
}
