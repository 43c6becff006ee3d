// Package retry is how Gavel waits between attempts: capped exponential backoff from
// github.com/cenkalti/backoff/v5, with the project's choices (no overall deadline unless asked,
// a context that ends the waiting) in one place.
//
// Loops that retry one call use Do. Loops that keep a longer-lived state machine (a watch
// that is resumed, an election that is campaigned again) hold a Policy's BackOff, take
// NextBackOff after each failure, Reset it after progress and wait with Sleep.
package retry

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy is a capped exponential backoff.
type Policy struct {
	// Initial is the wait after the first failure.
	Initial time.Duration
	// Max caps the wait before jitter; zero means no cap.
	Max time.Duration
	// Multiplier grows the wait after each failure; zero means 2.
	Multiplier float64
	// Jitter spreads each wait uniformly over ±Jitter of it (0 to 1); zero waits exactly.
	Jitter float64
}

// BackOff returns a fresh backoff following p. It is not safe for concurrent use.
func (p Policy) BackOff() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		RandomizationFactor: p.Jitter,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.Max,
	}
	if b.Multiplier == 0 {
		b.Multiplier = 2
	}
	if b.MaxInterval <= 0 {
		b.MaxInterval = time.Duration(1<<63 - 1)
	}
	b.Reset()
	return b
}

// Permanent marks an error that retrying cannot change: Do returns it at once.
func Permanent(err error) error { return backoff.Permanent(err) }

// Do calls op until it returns nil or a Permanent error, tries calls were made (zero: no
// limit) or ctx ends, waiting p's backoff between calls. notify, when set, is told each
// failure that will be retried and the wait before the next call. Do returns nil, op's last
// error (unwrapped from Permanent) or, when ctx ended first, its cause.
func Do(ctx context.Context, p Policy, tries uint, op func() error, notify func(err error, next time.Duration)) error {
	opts := []backoff.RetryOption{
		backoff.WithBackOff(p.BackOff()),
		backoff.WithMaxElapsedTime(0),
		backoff.WithMaxTries(tries),
	}
	if notify != nil {
		opts = append(opts, backoff.WithNotify(notify))
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) { return struct{}{}, op() }, opts...)
	if perm := (*backoff.PermanentError)(nil); errors.As(err, &perm) {
		return perm.Unwrap()
	}
	return err
}

// Sleep waits d or until ctx ends, reporting whether the wait completed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
