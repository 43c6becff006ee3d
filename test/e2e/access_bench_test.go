package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// firehoseLines is how many lines a firehose instance prints: firehoseBurst at a time as fast
// as seq does, then a 50 ms pause (at most 40,000 lines/s offered, in bursts the cell's
// 8,192-line queue takes). A paced instance prints pacedLines a line at a time, as an app
// logging each request does (one write each, the shell's echo), pacedBurst of them then a
// 50 ms pause: at most 5,000 lines/s (a little less, as the pause forks sleep).
const (
	firehoseLines = 200_000
	firehoseBurst = 2_000
	pacedLines    = 40_000
	pacedBurst    = 250
)

// firehose is the script of an instance that waits for gate, then prints lines with seq in
// bursts of burst with 50 ms between them, then sleeps.
func firehose(gate string, lines, burst int) string {
	return fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; i=0; while [ $i -lt %d ]; do seq $((i*%d+1)) $((i*%d+%d)); sleep 0.05; i=$((i+1)); done; exec sleep 600",
		gate, lines/burst, burst, burst, burst)
}

// paced is the script of an instance that waits for gate, then prints lines one echo at a
// time, burst of them then a 50 ms pause, then sleeps.
func paced(gate string, lines, burst int) string {
	return fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; n=0; while [ $n -lt %d ]; do j=0; while [ $j -lt %d ]; do n=$((n+1)); echo $n; j=$((j+1)); done; sleep 0.05; done; exec sleep 600",
		gate, lines, burst)
}

// BenchmarkLogsThroughTheBuiltBBS measures, on the built binaries over mutual TLS (a BBS, an
// auctioneer, three process reps, each its own process), what following logs costs the BBS:
//
//   - lines/s from one process instance printing as fast as it can (a firehose) through its rep
//     and the BBS to a following gRPC client (this process), and the lines lost on the way;
//   - the BBS's CPU per 1,000 lines/s: the BBS process's user+system time (/proc/PID/stat) over
//     the stream, less its idle rate measured just before, per line delivered, times 1,000 (in
//     percent of a core for a stream of 1,000 lines/s);
//   - placement latency (desire → RUNNING, from each DesireLRP call to the instance's `since`)
//     of 40 one-instance LRPs in three arms: nothing streaming ("quiet"), one instance printing
//     about 5,000 lines/s followed through the BBS ("paced"), and a firehose followed through the
//     BBS ("firehose"). The arms are interleaved over logRounds rounds, each round in a
//     different order; p50 and p99 of each arm are the medians of its rounds'.
//
// Run once: go test ./test/e2e -run '^$' -bench LogsThroughTheBuiltBBS -benchtime 1x.
func BenchmarkLogsThroughTheBuiltBBS(b *testing.B) {
	const (
		placements = 40
		logRounds  = 5
	)
	c := startClusterOpts(b, clusterOptions{tls: true})
	ctx := b.Context()
	gate := b.TempDir()
	seq := 0
	// printing desires an instance running firehose or paced and returns its guid and gate.
	printing := func(kind string, lines, burst int) (string, string) {
		script := firehose
		if kind == "paced" {
			script = paced
		}
		seq++
		guid := fmt.Sprintf("%s-%d-x", kind, seq) // no guid is a prefix of another
		start := filepath.Join(gate, guid)
		d := tickLRP(guid, 1)
		d.Action.GetRun().Args = []string{"-c", script(start, lines, burst)}
		c.desire(b, d)
		c.waitRunning(b, guid, 1, 60*time.Second)
		return guid, start
	}

	for i := 0; i < b.N; i++ {
		// One firehose alone: the throughput and the BBS's CPU per line.
		guid, start := printing("firehose", firehoseLines, firehoseBurst)
		idleFrom, idleCPU := time.Now(), processCPU(b, c.bbsProc.Pid)
		time.Sleep(3 * time.Second)
		idleRate := (processCPU(b, c.bbsProc.Pid) - idleCPU).Seconds() / time.Since(idleFrom).Seconds()
		s := c.streamFirehose(ctx, b, guid, start, firehoseLines)
		<-s.done
		cpu := s.bbsCPU.Seconds() - idleRate*s.elapsed.Seconds()
		rate := float64(s.lines) / s.elapsed.Seconds()
		perThousand := cpu / float64(s.lines) * 1000 * 100 // % of a core at 1,000 lines/s
		b.ReportMetric(rate, "lines/s")
		b.ReportMetric(float64(firehoseLines-s.lines), "lost")
		b.ReportMetric(perThousand, "bbs_core_%_per_1000_lines/s")
		b.Logf("firehose alone: %d of %d lines in %d messages in %s (%.0f lines/s); BBS CPU %s over it, idle rate %.1f%% of a core: %.2f%% of a core per 1,000 lines/s; CPU of the others: %s",
			s.lines, firehoseLines, s.msgs, s.elapsed.Round(time.Millisecond), rate, s.bbsCPU, 100*idleRate, perThousand, s.others)
		c.removeAll(b, guid)

		arms := []string{"quiet", "paced", "firehose"}
		p50s, p99s := map[string][]time.Duration{}, map[string][]time.Duration{}
		for r := range logRounds {
			for k := range arms {
				arm := arms[(r+k)%len(arms)]
				var (
					s       *stream
					printer string
				)
				switch arm {
				case "paced":
					guid, start := printing("paced", pacedLines, pacedBurst)
					s, printer = c.streamFirehose(ctx, b, guid, start, pacedLines), guid
				case "firehose":
					guid, start := printing("firehose", firehoseLines, firehoseBurst)
					s, printer = c.streamFirehose(ctx, b, guid, start, firehoseLines), guid
				}
				prefix := fmt.Sprintf("%s-%d-%d", arm, i, r)
				began := time.Now()
				lat := c.placementLatencies(b, prefix, placements)
				took := time.Since(began)
				p50, p99 := percentile(lat, 50), percentile(lat, 99)
				p50s[arm], p99s[arm] = append(p50s[arm], p50), append(p99s[arm], p99)
				streamed := ""
				if s != nil {
					<-s.done
					streamed = fmt.Sprintf("; stream: %d lines in %d messages in %s (%.0f lines/s), BBS CPU %s; the others: %s",
						s.lines, s.msgs, s.elapsed.Round(time.Millisecond), float64(s.lines)/s.elapsed.Seconds(), s.bbsCPU, s.others)
				}
				b.Logf("round %d %s (from unix %.3f): placement p50 %s p99 %s (all RUNNING after %s)%s", r, arm,
					float64(began.UnixMicro())/1e6, p50.Round(time.Millisecond), p99.Round(time.Millisecond), took.Round(time.Millisecond), streamed)
				c.removeAll(b, prefix+"-")
				if printer != "" {
					c.removeAll(b, printer)
				}
			}
		}
		for _, arm := range arms {
			p50, p99 := median(p50s[arm]), median(p99s[arm])
			b.ReportMetric(float64(p99.Milliseconds()), "placement_p99_ms_"+arm)
			b.Logf("placement (desire → RUNNING) %s: median over %d rounds of %d instances: p50 %s, p99 %s (p99 of each round: %v)",
				arm, logRounds, placements, p50.Round(time.Millisecond), p99.Round(time.Millisecond), roundAll(p99s[arm]))
		}
	}
}

// median is the middle of ds (the lower of the two middle ones for an even count).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// roundAll rounds every duration to the millisecond, for logging.
func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// stream is one firehose followed through the BBS.
type stream struct {
	done    chan struct{}
	lines   int           // app lines received (after done)
	msgs    int           // messages received (after done)
	elapsed time.Duration // from the start to the last line
	bbsCPU  time.Duration // the BBS process's CPU time over elapsed
	others  string        // the other processes' CPU time over elapsed
}

// streamFirehose follows guid through the BBS, opens its gate, and counts its lines until the
// last of total or until none came for 3 s (lines a cell dropped never come).
func (c *cluster) streamFirehose(ctx context.Context, b *testing.B, guid, gate string, total int) *stream {
	b.Helper()
	zero := int32(0)
	sctx, cancel := context.WithCancel(ctx)
	follow, err := c.bbs.StreamLogs(sctx, &bbsv1.StreamLogsRequest{ProcessGuid: guid, Tail: &zero, Follow: true})
	if err != nil {
		b.Fatal(err)
	}
	s := &stream{done: make(chan struct{})}
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
	began, cpu0 := time.Now(), processCPU(b, c.bbsProc.Pid)
	others0 := map[*proc]time.Duration{}
	for _, p := range c.procs {
		others0[p] = processCPU(b, p.Pid)
	}
	self0 := processCPU(b, os.Getpid())
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	go func() {
		defer close(s.done)
		defer cancel()
		lastAt := began
		idle := time.NewTimer(3 * time.Second)
		for {
			select {
			case msg, ok := <-msgs:
				if !ok {
					return
				}
				s.msgs++
				for _, l := range msg.GetLines() {
					if l.GetSource() != "CELL" {
						s.lines++
						lastAt = time.Now()
					}
				}
				idle.Reset(3 * time.Second)
				if s.lines < total {
					continue
				}
			case <-idle.C:
			}
			s.elapsed, s.bbsCPU = lastAt.Sub(began), processCPU(b, c.bbsProc.Pid)-cpu0
			var others []string
			for _, p := range c.procs {
				if p != c.bbsProc {
					others = append(others, fmt.Sprintf("%s %s", p.Name, (processCPU(b, p.Pid)-others0[p]).Round(10*time.Millisecond)))
				}
			}
			s.others = strings.Join(append(others, fmt.Sprintf("the follower (this process) %s", (processCPU(b, os.Getpid())-self0).Round(10*time.Millisecond))), ", ")
			return
		}
	}()
	return s
}

// placementLatencies desires n one-instance LRPs named prefix-<i> and returns, for each, the
// time from its DesireLRP call to the RUNNING `since` the BBS recorded.
func (c *cluster) placementLatencies(b *testing.B, prefix string, n int) []time.Duration {
	b.Helper()
	desiredAt := map[string]time.Time{}
	for i := range n {
		guid := fmt.Sprintf("%s-%d", prefix, i)
		d := tickLRP(guid, 1)
		d.MemoryMb, d.DiskMb = 16, 16
		d.Action.GetRun().Args = []string{"-c", "exec sleep 600"}
		desiredAt[guid] = time.Now()
		c.desire(b, d)
	}
	var lat []time.Duration
	c.waitFor(b, 2*time.Minute, fmt.Sprintf("%d instances of %s-* running", n, prefix), func() (bool, string) {
		lat = lat[:0]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
		if err != nil {
			return false, err.Error()
		}
		for _, a := range resp.GetActualLrps() {
			at, ok := desiredAt[a.GetKey().GetProcessGuid()]
			if ok && a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				lat = append(lat, a.GetSince().AsTime().Sub(at))
			}
		}
		return len(lat) == n, fmt.Sprintf("%d running", len(lat))
	})
	return lat
}

// removeAll removes the desired LRPs whose guid starts with prefix and waits for their
// instances to go.
func (c *cluster) removeAll(b *testing.B, prefix string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := c.bbs.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range resp.GetDesiredLrps() {
		if strings.HasPrefix(d.GetProcessGuid(), prefix) {
			if _, err := c.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: d.GetProcessGuid()}); err != nil {
				b.Fatal(err)
			}
		}
	}
	c.waitFor(b, time.Minute, "the instances of "+prefix+"* gone", func() (bool, string) {
		resp, err := c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
		if err != nil {
			return false, err.Error()
		}
		left := 0
		for _, a := range resp.GetActualLrps() {
			if strings.HasPrefix(a.GetKey().GetProcessGuid(), prefix) {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d left", left)
	})
}

// processCPU is a process's user and system time so far (testkit.ProcessCPU).
func processCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	d, err := testkit.ProcessCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// percentile is the p-th percentile of ds (nearest rank).
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}
