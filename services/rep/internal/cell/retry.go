package cell

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/retry"
)

// Bounds of call's retries.
const callAttempts = 5

// callPolicy is the wait between call's attempts.
var callPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// call makes one BBS call, retrying (up to callAttempts, with backoff) while the BBS is
// unavailable, a compare-and-swap was lost or an attempt timed out. A BBS that sheds load
// (ResourceExhausted with a retry-after) is waited for by the BBS connection itself
// (bbsclient.RetryOverloaded, within each attempt's CallTimeout); a refusal that outlasted
// those waits is tried again after a backoff as often as it takes while ctx lasts: refusals
// are not failed attempts.
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
		shed := status.Code(err) == codes.ResourceExhausted
		if !shed {
			if failed++; attempts > 0 && failed >= attempts {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		wait := b.NextBackOff()
		// The rep's lifecycle calls have no client span (tracing.ClientSpan): each failed
		// attempt retried here is an event of the span the call was made in, so one no server
		// span saw (the BBS unreachable, a timeout) still shows in the trace.
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.AddEvent("bbs call failed, retrying", trace.WithAttributes(attribute.String("gavel.call", what),
				attribute.Bool("gavel.shed", shed), attribute.String("error", err.Error())))
		}
		c.log.Debug("bbs call failed, retrying", "call", what, "failed_attempts", failed, "shed", shed, "error", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		}
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
