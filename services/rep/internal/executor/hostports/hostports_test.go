package hostports

import (
	"slices"
	"testing"
)

// TestAcquireAllOrNoneSkippingBusyPorts: ports the host uses are skipped (and kept for later),
// a request larger than what is free takes nothing, and released ports come back last.
func TestAcquireAllOrNoneSkippingBusyPorts(t *testing.T) {
	busy := map[int]bool{101: true}
	a := Uint32{New(100, 104, func(p int) bool { return !busy[p] })}
	got, err := a.Acquire(2)
	if err != nil || !slices.Equal(got, []uint32{100, 102}) {
		t.Fatalf("Acquire(2) = %v, %v; want [100 102]", got, err)
	}
	if more, err := a.Acquire(3); err == nil {
		t.Fatalf("Acquire(3) with two free = %v, want an error", more)
	}
	a.Release([]uint32{100})
	busy[101] = false
	rest, err := a.Acquire(3)
	if err != nil || !slices.Equal(rest, []uint32{101, 103, 104}) {
		t.Fatalf("Acquire(3) = %v, %v; want [101 103 104] (the released 100 after them)", rest, err)
	}
	if last, err := a.Acquire(1); err != nil || !slices.Equal(last, []uint32{100}) {
		t.Fatalf("Acquire(1) = %v, %v; want [100]", last, err)
	}
}
