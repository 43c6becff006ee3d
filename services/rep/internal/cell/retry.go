package cell

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bounds of call's retries.
const (
	callAttempts   = 5
	callBackoff    = 100 * time.Millisecond
	callMaxBackoff = 2 * time.Second
)

// call makes one BBS call, retrying (up to callAttempts, with backoff) while the BBS is
// unavailable, a compare-and-swap was lost or an attempt timed out.
func (c *Cell) call(ctx context.Context, what string, f func(ctx context.Context) error) error {
	backoff := callBackoff
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		err := f(actx)
		cancel()
		if err == nil {
			return nil
		}
		if !retriable(err) || attempt == callAttempts || ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		c.log.Debug("bbs call failed, retrying", "call", what, "attempt", attempt, "error", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, callMaxBackoff)
	}
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
