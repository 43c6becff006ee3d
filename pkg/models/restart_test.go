package models

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

func TestRestartSchedule(t *testing.T) {
	tests := []struct {
		crashCount  int32
		immediately bool
		delay       time.Duration
	}{
		{0, false, 0},
		{1, true, 0},
		{2, true, 0},
		{3, true, 0},
		{4, false, time.Minute},
		{5, false, 2 * time.Minute},
		{6, false, 4 * time.Minute},
		{7, false, 8 * time.Minute},
		{8, false, 16 * time.Minute},
		{9, false, 16 * time.Minute},
		{40, false, 16 * time.Minute},
		{199, false, 16 * time.Minute},
		{200, false, 16 * time.Minute},
		{math.MaxInt32, false, 16 * time.Minute},
	}
	for _, tt := range tests {
		if got := ShouldRestartImmediately(tt.crashCount); got != tt.immediately {
			t.Errorf("ShouldRestartImmediately(%d) = %v, want %v", tt.crashCount, got, tt.immediately)
		}
		if got := RestartDelay(tt.crashCount); got != tt.delay {
			t.Errorf("RestartDelay(%d) = %v, want %v", tt.crashCount, got, tt.delay)
		}
	}
}

func TestRestartDelayWholeSchedule(t *testing.T) {
	// Closed form for every count: 0 up to 3 crashes, then 30s doubled (n-3) times, capped.
	for n := int32(-1); n <= MaxCrashes+10; n++ {
		want := time.Duration(0)
		if n > 3 {
			want = 30 * time.Second
			for i := int32(0); i < n-3 && want < CrashBackoffMax; i++ {
				want *= 2
			}
			want = min(want, 16*time.Minute)
		}
		if got := RestartDelay(n); got != want {
			t.Errorf("RestartDelay(%d) = %v, want %v", n, got, want)
		}
		if got, want := ShouldRestartImmediately(n), n >= 1 && n <= 3; got != want {
			t.Errorf("ShouldRestartImmediately(%d) = %v, want %v", n, got, want)
		}
	}
}

func crashed(count int32, since time.Time) *modelsv1.ActualLRP {
	return &modelsv1.ActualLRP{
		State:      modelsv1.ActualLRP_STATE_CRASHED,
		CrashCount: count,
		Since:      timestamppb.New(since),
	}
}

func TestShouldRestartCrashed(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		lrp  *modelsv1.ActualLRP
		want bool
	}{
		{"nil", nil, false},
		{"running", &modelsv1.ActualLRP{State: modelsv1.ActualLRP_STATE_RUNNING, Since: timestamppb.New(now.Add(-time.Hour))}, false},
		{"unclaimed", &modelsv1.ActualLRP{State: modelsv1.ActualLRP_STATE_UNCLAIMED}, false},
		{"third crash just now", crashed(3, now), true},
		{"no since", &modelsv1.ActualLRP{State: modelsv1.ActualLRP_STATE_CRASHED, CrashCount: 10}, true},
		{"fourth crash before 1m", crashed(4, now.Add(-59*time.Second)), false},
		{"fourth crash at 1m", crashed(4, now.Add(-time.Minute)), true},
		{"seventh crash before 8m", crashed(7, now.Add(-8*time.Minute+time.Millisecond)), false},
		{"seventh crash at 8m", crashed(7, now.Add(-8*time.Minute)), true},
		{"eighth crash at 15m", crashed(8, now.Add(-15*time.Minute)), false},
		{"eighth crash at 16m", crashed(8, now.Add(-16*time.Minute)), true},
		{"199th crash before 16m", crashed(199, now.Add(-16*time.Minute+time.Second)), false},
		{"199th crash at 16m", crashed(199, now.Add(-16*time.Minute)), true},
		{"200th crash long ago", crashed(MaxCrashes, now.Add(-24*time.Hour)), false},
		{"beyond max", crashed(MaxCrashes+1, now.Add(-24*time.Hour)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ShouldRestartCrashed(tt.lrp, now); got != tt.want {
				t.Errorf("ShouldRestartCrashed = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestShouldRestartCrashedWholeSchedule(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	for n := int32(1); n <= MaxCrashes+5; n++ {
		delay := RestartDelay(n)
		due := ShouldRestartCrashed(crashed(n, now.Add(-delay)), now)
		early := delay > 0 && ShouldRestartCrashed(crashed(n, now.Add(-delay+time.Nanosecond)), now)
		if want := n < MaxCrashes; due != want {
			t.Errorf("crash %d at its delay %v: restart = %v, want %v", n, delay, due, want)
		}
		if early {
			t.Errorf("crash %d restarts before its delay %v", n, delay)
		}
	}
}

func TestCrashCountAfterCrash(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	running := func(count int32, since time.Time) *modelsv1.ActualLRP {
		return &modelsv1.ActualLRP{State: modelsv1.ActualLRP_STATE_RUNNING, CrashCount: count, Since: timestamppb.New(since)}
	}
	tests := []struct {
		name string
		lrp  *modelsv1.ActualLRP
		want int32
	}{
		{"first crash", running(0, now.Add(-time.Minute)), 1},
		{"running briefly", running(5, now.Add(-5*time.Minute+time.Second)), 6},
		{"running 5 minutes", running(5, now.Add(-5*time.Minute)), 1},
		{"running long", running(150, now.Add(-time.Hour)), 1},
		{"claimed long", &modelsv1.ActualLRP{State: modelsv1.ActualLRP_STATE_CLAIMED, CrashCount: 2, Since: timestamppb.New(now.Add(-time.Hour))}, 3},
		{"running without since", &modelsv1.ActualLRP{State: modelsv1.ActualLRP_STATE_RUNNING, CrashCount: 2}, 3},
		{"saturates", running(math.MaxInt32, now), math.MaxInt32},
		{"nil", nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CrashCountAfterCrash(tt.lrp, now); got != tt.want {
				t.Errorf("CrashCountAfterCrash = %d, want %d", got, tt.want)
			}
		})
	}
}
