package rep_test

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
)

// BenchmarkSimInstancesHeld starts 1,000 instances on one sim cell (the scale harness's cells)
// in each op (the cell has room for four ops' instances) and reports what each running instance holds in this process once all are RUNNING:
// goroutines and goroutine stack bytes (runtime/metrics, after a collection), against the same
// process before the Perform. The BBS and etcd share the process; they keep no goroutine per
// instance.
func BenchmarkSimInstancesHeld(b *testing.B) {
	const n, perCall = 1000, 100
	env := bbstest.Start(b)
	r := startRep(b, env, func(c *rep.Config) {
		c.Capacity = rep.Capacity{MemoryMB: 4 * n * 128, DiskMB: 4 * n * 128, Containers: 4 * n}
		c.Sim.StartLatency = rep.Duration(time.Millisecond)
	})
	var goroutines, stackKiB float64
	for i := 0; i < b.N; i++ {
		d := desiredLRP(fmt.Sprintf("held-%d", i), n)
		desire(b, env, d)
		g0, s0 := heldNow()
		for from := 0; from < n; from += perCall {
			var work []*repv1.LRPInstance
			for idx := from; idx < from+perCall; idx++ {
				work = append(work, lrpWork(d, int32(idx)))
			}
			if resp := perform(b, r, work, nil); len(resp.GetFailedLrps()) > 0 {
				b.Fatalf("Perform refused %d instances", len(resp.GetFailedLrps()))
			}
		}
		waitAllRunning(b, env, d.GetProcessGuid(), n)
		g1, s1 := heldNow()
		goroutines += (g1 - g0) / n
		stackKiB += (s1 - s0) / n / 1024
		// Each op's instances stay: the next op's are measured on top of them.
	}
	b.ReportMetric(goroutines/float64(b.N), "goroutines/instance")
	b.ReportMetric(stackKiB/float64(b.N), "stack-KiB/instance")
}

// heldNow is this process's goroutines and goroutine stack bytes after a collection.
func heldNow() (goroutines, stackBytes float64) {
	runtime.GC()
	s := []metrics.Sample{{Name: "/sched/goroutines:goroutines"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	return float64(s[0].Value.Uint64()), float64(s[1].Value.Uint64())
}
