package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/devcluster"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep"
)

// BenchmarkLogsThroughTheBBS measures log lines per second from one process instance through
// its rep and the BBS to a following client (all in this process, on loopback): the instance
// prints 200,000 numbered lines as fast as seq does, and the follower counts what arrives until
// the last one (or until none came for 2 s: lines the cell dropped never come). Reported: lines/s received, and the lines lost on the way (the cell's bounded
// queues drop rather than slow the app). Run once: -bench LogsThroughTheBBS -benchtime 1x.
func BenchmarkLogsThroughTheBBS(b *testing.B) {
	const lines = 200_000
	cfg := rep.Default()
	cfg.CellID, cfg.Zone = "cell-0", "z1"
	cfg.Backend = rep.BackendProcess
	cfg.WorkDir = b.TempDir()
	cfg.PreloadedRootfses = map[string]string{"x": b.TempDir()}
	cfg.Capacity = rep.Capacity{MemoryMB: 4096, DiskMB: 4096, Containers: 20}
	cfg.Logs.MaxFileBytes = 64 << 20
	c := startCluster(b, []devcluster.Cell{{Config: cfg}})
	ctx := b.Context()
	gate := b.TempDir()
	for i := 0; i < b.N; i++ {
		guid := fmt.Sprintf("firehose-%d", i)
		start := filepath.Join(gate, guid)
		d := desiredLRP(guid, "preloaded:x", 1, nil)
		d.Ports = nil
		d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/sh",
			Args: []string{"-c", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.01; done; seq 1 %d; exec sleep 600", start, lines)}}}}
		if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
			b.Fatal(err)
		}
		for {
			as := actualLRPs(b, c, guid)
			if len(as) == 1 && as[0].GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		zero := int32(0)
		follow, err := c.BBS.StreamLogs(ctx, &bbsv1.StreamLogsRequest{ProcessGuid: guid, Tail: &zero, Follow: true})
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(start, nil, 0o644); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		began := time.Now()
		msgs := make(chan *bbsv1.StreamLogsResponse, 64)
		go func() {
			defer close(msgs)
			for {
				msg, err := follow.Recv()
				if err != nil {
					return
				}
				msgs <- msg
			}
		}()
		// Count until the last line or until nothing came for 2 s (lines the cell dropped
		// never come).
		got, lastAt := 0, began
		idle := time.NewTimer(2 * time.Second)
	receive:
		for {
			select {
			case msg, ok := <-msgs:
				if !ok {
					break receive
				}
				for _, l := range msg.GetLines() {
					if l.GetSource() != "CELL" {
						got++
						lastAt = time.Now()
						if l.GetText() == fmt.Sprint(lines) {
							break receive
						}
					}
				}
				idle.Reset(2 * time.Second)
			case <-idle.C:
				break receive
			}
		}
		elapsed := lastAt.Sub(began)
		b.StopTimer()
		b.ReportMetric(float64(got)/elapsed.Seconds(), "lines/s")
		b.ReportMetric(float64(lines-got), "lost")
	}
}
