package gostack

import (
	"runtime"
	"sync"
	"testing"
)

// stackInUse is the memory the runtime holds for goroutine stacks. A collection frees the
// stacks of goroutines that ended, and also shrinks those of goroutines using a quarter of
// theirs or less, so it is only run before the goroutines measured start.
func stackInUse(collect bool) uint64 {
	if collect {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}

// parked starts n goroutines that run before and then wait, and reports the stack memory
// they hold while they wait.
func parked(n int, before func()) uint64 {
	release := make(chan struct{})
	var started, done sync.WaitGroup
	base := stackInUse(true)
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			before()
			started.Done()
			<-release
		}()
	}
	started.Wait()
	held := stackInUse(false) - base
	close(release)
	done.Wait()
	return held
}

// TestGrowGivesEachGoroutineItsStackAtOnce: goroutines that called Grow hold stacks of at
// least 32 KiB each; goroutines that did not hold a fraction of that. It fails if the compiler
// optimised Grow's frame away.
func TestGrowGivesEachGoroutineItsStackAtOnce(t *testing.T) {
	const n = 256
	grown := parked(n, Grow)
	plain := parked(n, func() {})
	t.Logf("%d goroutines' stacks: %d KiB with Grow, %d KiB without", n, grown>>10, plain>>10)
	if per := grown / n; per < 24<<10 { // 32 KiB each, less what other goroutines freed meanwhile
		t.Errorf("a goroutine that called Grow holds %d bytes of stack, want 32 KiB", per)
	}
	if plain >= grown/2 {
		t.Errorf("goroutines without Grow hold %d bytes of stack, with it %d: Grow made no difference", plain, grown)
	}
}

// deep recurses through n frames of 256 bytes each, as a call path through interceptors,
// a handler and a store would.
//
//go:noinline
func deep(n int) byte {
	var pad [256]byte
	pad[n%len(pad)] = byte(n)
	if n == 0 {
		return pad[0]
	}
	return deep(n-1) + pad[n%len(pad)]
}

// BenchmarkNewGoroutineGoingDeep: a new goroutine whose path reaches about 24 KiB of stack,
// with the stack grown early by Grow and grown by the runtime as it goes.
func BenchmarkNewGoroutineGoingDeep(b *testing.B) {
	for _, bc := range []struct {
		name string
		grow bool
	}{{"runtime", false}, {"Grow", true}} {
		b.Run(bc.name, func(b *testing.B) {
			var wg sync.WaitGroup
			for b.Loop() {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if bc.grow {
						Grow()
					}
					deep(80)
				}()
				wg.Wait()
			}
		})
	}
}
