package cell

import (
	"context"
	"fmt"
	"time"

	"github.com/gavel-sched/gavel/pkg/retry"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bounds of call's retries.
const callAttempts = 5

// callPolicy is the wait between call's attempts.
var callPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// call makes one BBS call, retrying (up to callAttempts, with backoff) while the BBS is
// unavailable, a compare-and-swap was lost or an attempt timed out.
func (c *Cell) call(ctx context.Context, what string, f func(ctx context.Context) error) error {
	attempt := 0
	err := retry.Do(ctx, callPolicy, callAttempts, func() error {
		attempt++
		actx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		defer cancel()
		err := f(actx)
		if err != nil && !retriable(err) {
			return retry.Permanent(err)
		}
		return err
	}, func(err error, next time.Duration) {
		c.log.Debug("bbs call failed, retrying", "call", what, "attempt", attempt, "error", err, "retry_in", next)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
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
