package logs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/services/rep/internal/logs"
)

// BenchmarkCaptureAndFollow measures what the cell's log store costs per line captured, written
// to disk and handed to one follower (which drains its batches): the process's CPU time per
// line ("cpu-ns/line"), and the follower's batches per 1,000 lines (each a StreamLogs message
// of the rep, and of the BBS, for a follower through it). "burst" captures lines as fast as the
// store takes them; "paced" captures one line every 200 µs (5,000 lines/s, an app logging a line
// at a time), where a writer that woke for every line would hand the follower a batch per line.
//
// Run: go test ./services/rep/internal/logs -run '^$' -bench CaptureAndFollow -benchtime 20000x
func BenchmarkCaptureAndFollow(b *testing.B) {
	for _, tc := range []struct {
		name  string
		every time.Duration
	}{{"burst", 0}, {"paced", 200 * time.Microsecond}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := logs.New(logs.Options{Dir: b.TempDir(), MaxFileBytes: 64 << 20})
			if err != nil {
				b.Fatal(err)
			}
			testkit.Start(b, "logs", s)
			k := logs.Key{ProcessGuid: "web", Index: 0, InstanceGuid: "i-0"}
			inst, err := s.Open(k, logs.SourceLRP)
			if err != nil {
				b.Fatal(err)
			}
			_, sub, err := s.Follow(logs.Filter{ProcessGuid: "web", AnyIndex: true}, time.Time{}, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			got, batches := make(chan int), 0
			go func() {
				n := 0
				for n < b.N {
					n += len(<-sub.Lines())
					batches++
				}
				got <- n
			}()
			text := "2026-11-26T15:04:05Z INFO request handled path=/api/v1/items status=200 duration_ms=12"
			cpu0 := testkit.SelfCPU(b)
			next := time.Now()
			b.ResetTimer()
			for i := range b.N {
				if tc.every > 0 {
					next = next.Add(tc.every)
					time.Sleep(time.Until(next))
				} else if i%1024 == 1023 {
					for uint64(i)-s.Written() > 4096 { // stay within the queue: no drops
						time.Sleep(100 * time.Microsecond)
					}
				}
				inst.Line("", logs.Stdout, text)
			}
			select {
			case <-got:
			case <-time.After(10 * time.Second):
				b.Fatalf("the follower got fewer than %d lines (dropped %d)", b.N, s.Dropped())
			}
			b.StopTimer()
			cpu := testkit.SelfCPU(b) - cpu0
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/line")
			b.ReportMetric(float64(batches)*1000/float64(b.N), "batches/1000lines")
			if d := s.Dropped(); d > 0 {
				b.Fatal(fmt.Sprintf("%d lines dropped", d))
			}
		})
	}
}
