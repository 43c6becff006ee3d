package rep_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/ocitest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// BenchmarkDesireToRunning measures, for the process and oci backends on the same machine in
// one run, how long an LRP instance takes from its desire (DesireLRP, then Perform on the cell,
// standing in for the auction) until the BBS has it RUNNING, with a preloaded rootfs and no
// checks, one instance at a time; each is stopped before the next. It reports p50 and p99.
// The goal for oci: p50 under 300 ms, p99 under 1 s.
func BenchmarkDesireToRunning(b *testing.B) {
	root := b.TempDir()
	for _, dir := range []string{"bin", "etc", "tmp"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := rootfstest.BuildStatic(".", filepath.Join(root, "bin"), "./internal/executor/oci/testdata/probe"); err != nil {
		b.Fatal(err)
	}
	env := bbstest.Start(b)
	for _, backend := range []string{rep.BackendProcess, rep.BackendOCI} {
		b.Run(backend, func(b *testing.B) {
			path := filepath.Join(root, "bin", "probe") // the process backend runs it from the host
			configure := func(c *rep.Config) {
				c.Backend = backend
				c.PreloadedRootfses = map[string]string{"cflinuxfs4": root}
				c.Capacity.Containers = 100
			}
			if backend == rep.BackendOCI {
				if m := ocitest.Missing(); m != "" {
					b.Skipf("%s (missing: %s)", ocitest.InstallHint, m)
				}
				d := ocitest.New(b)
				path = "/bin/probe"
				base := configure
				configure = func(c *rep.Config) {
					base(c)
					c.OCI.ContainerdSocket = d.Socket
				}
			}
			r := startRep(b, env, configure)
			var took []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d := desiredLRP(fmt.Sprintf("bench-%s-%d", backend, i), 1)
				d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path, Args: []string{"sleep"}}}}
				d.Ports, d.MemoryMb = nil, 64
				t0 := time.Now()
				desire(b, env, d)
				perform(b, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
				a := waitRunningFast(b, env, d.GetProcessGuid())
				took = append(took, time.Since(t0))
				b.StopTimer()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				if _, err := r.client.StopLRPInstance(ctx, &repv1.StopLRPInstanceRequest{Key: a.GetKey(), InstanceKey: a.GetInstanceKey()}); err != nil {
					b.Fatalf("StopLRPInstance: %v", err)
				}
				if _, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: d.GetProcessGuid()}); err != nil {
					b.Fatalf("RemoveDesiredLRP: %v", err)
				}
				cancel()
				b.StartTimer()
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// waitRunningFast polls the BBS every 2 ms until index 0 of guid is RUNNING.
func waitRunningFast(b *testing.B, env *bbstest.Env, guid string) *modelsv1.ActualLRP {
	deadline := time.Now().Add(time.Minute)
	index := int32(0)
	for time.Now().Before(deadline) {
		resp, err := env.Client.ActualLRPs(context.Background(), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}, Index: &index})
		if err != nil {
			b.Fatalf("ActualLRPs: %v", err)
		}
		for _, a := range resp.GetActualLrps() {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				return a
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.Fatalf("%s not RUNNING within a minute", guid)
	return nil
}
