package models

import (
	"math"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Diego's crash restart policy.
const (
	// MaxCrashes is the crash count at which an instance is no longer restarted.
	MaxCrashes = 200
	// ImmediateRestarts is how many crashes in a row restart at once.
	ImmediateRestarts = 3
	// CrashBackoffMin is the unit of the backoff: the delay is CrashBackoffMin × 2^(n−3).
	CrashBackoffMin = 30 * time.Second
	// CrashBackoffMax caps the delay before a restart.
	CrashBackoffMax = 16 * time.Minute
	// CrashCountResetAfter is how long an instance must have been RUNNING for its next crash
	// to count as the first.
	CrashCountResetAfter = 5 * time.Minute
)

// ShouldRestartImmediately reports whether an instance that has just crashed for the
// crashCount-th time (the count after the crash) restarts at once: true for 1..3.
func ShouldRestartImmediately(crashCount int32) bool {
	return crashCount >= 1 && crashCount <= ImmediateRestarts
}

// RestartDelay is how long a crashed instance with crashCount crashes waits before its restart:
// zero up to 3 crashes, then 30s × 2^(crashCount−3), capped at 16 minutes.
func RestartDelay(crashCount int32) time.Duration {
	if crashCount <= ImmediateRestarts {
		return 0
	}
	// 30s × 2^5 = 16 min already; larger exponents are capped without shifting.
	exp := crashCount - ImmediateRestarts
	if exp >= 5 {
		return CrashBackoffMax
	}
	return min(CrashBackoffMin<<exp, CrashBackoffMax)
}

// ShouldRestartCrashed reports whether a CRASHED instance is due for its restart at now: it has
// crashed fewer than MaxCrashes times and its restart delay since it crashed has passed.
func ShouldRestartCrashed(lrp *modelsv1.ActualLRP, now time.Time) bool {
	if lrp.GetState() != modelsv1.ActualLRP_STATE_CRASHED {
		return false
	}
	n := lrp.GetCrashCount()
	if n >= MaxCrashes {
		return false
	}
	since := time.Time{}
	if lrp.GetSince() != nil {
		since = lrp.GetSince().AsTime()
	}
	return !since.Add(RestartDelay(n)).After(now)
}

// CrashCountAfterCrash is the crash count of lrp once it crashes at now: 1 when it had been
// RUNNING for at least CrashCountResetAfter, else its count plus one.
func CrashCountAfterCrash(lrp *modelsv1.ActualLRP, now time.Time) int32 {
	if lrp.GetState() == modelsv1.ActualLRP_STATE_RUNNING && lrp.GetSince() != nil &&
		now.Sub(lrp.GetSince().AsTime()) >= CrashCountResetAfter {
		return 1
	}
	n := lrp.GetCrashCount()
	if n == math.MaxInt32 {
		return n
	}
	return n + 1
}
