package nsync_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/devcluster"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/nsync"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
	"github.com/gavel-sched/gavel/services/rep"
)

// BenchmarkDesireThroughNsync desires the same number of apps twice in one cluster of sim
// cells — once as LRPs directly at the BBS, once as apps through nsync — and reports each
// rate (apps/s until every instance is RUNNING) and nsync's as a fraction of the direct one.
func BenchmarkDesireThroughNsync(b *testing.B) {
	const apps, workers = 300, 16
	var cells []devcluster.Cell
	for i := range 10 {
		cfg := rep.Default()
		cfg.CellID, cfg.Zone = fmt.Sprintf("cell-%d", i), fmt.Sprintf("z%d", i%3)
		cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": "/rootfs"}
		cfg.Backend = rep.BackendSim
		cfg.Capacity = rep.Capacity{MemoryMB: 64 * 1024, DiskMB: 64 * 1024, Containers: 200}
		cfg.Sim.StartLatency = rep.Duration(10 * time.Millisecond)
		cfg.Log.Level = "error"
		cells = append(cells, devcluster.Cell{Config: cfg})
	}
	c := devcluster.New(devcluster.Config{
		Dir: b.TempDir(), BBSAddress: "127.0.0.1:0", AuctioneerAddress: "127.0.0.1:0",
		Cells: cells, Logger: logtest.New(b), Nsync: true,
		ConfigureNsync: func(cfg *nsync.Config) {
			cfg.BulkInterval, cfg.DomainTTL = nsync.Duration(time.Minute), nsync.Duration(2*time.Minute)
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- c.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		b.Fatalf("cluster: %v", err)
	}
	defer func() { cancel(); <-done }()

	running := func(domain string) int {
		resp, err := c.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{Domain: domain}})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, a := range resp.GetActualLrps() {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				n++
			}
		}
		return n
	}
	// run desires apps with desire(i) from workers goroutines and returns the rate at which
	// they all reach RUNNING in domain.
	run := func(domain string, desire func(i int) error) float64 {
		start := time.Now()
		var wg sync.WaitGroup
		var next atomic.Int64
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1) - 1); i < apps; i = int(next.Add(1) - 1) {
					if err := desire(i); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		deadline := time.Now().Add(5 * time.Minute)
		for running(domain) < apps {
			if time.Now().After(deadline) {
				b.Fatalf("%s: %d/%d running after 5 minutes", domain, running(domain), apps)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return apps / time.Since(start).Seconds()
	}
	app := func(i int) *nsyncv1.App {
		return &nsyncv1.App{Guid: fmt.Sprintf("app-%d", i), Name: "bench", SpaceGuid: "space", Stack: "cflinuxfs4",
			Command: "/bin/app", Instances: 1, MemoryMb: 64, DiskMb: 64, Ports: []uint32{8080},
			HealthCheck: &nsyncv1.HealthCheck{Type: nsyncv1.HealthCheck_TYPE_PORT}}
	}
	b.ResetTimer()
	for range b.N {
		direct := run("bench-direct", func(i int) error {
			d, err := build.LRP(app(i), 1, build.Work{Rootfs: "preloaded:cflinuxfs4"})
			if err != nil {
				return err
			}
			d.ProcessGuid, d.Domain = strings.Replace(d.GetProcessGuid(), "app-", "direct-", 1), "bench-direct"
			_, err = c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
			return err
		})
		through := run(build.AppsDomain, func(i int) error {
			_, err := c.Nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app(i)})
			return err
		})
		b.Logf("%d apps of 1 instance on 10 sim cells: direct at the BBS %.0f apps/s, through nsync %.0f apps/s (ratio %.2f)", apps, direct, through, through/direct)
		b.ReportMetric(direct, "direct_apps/s")
		b.ReportMetric(through, "nsync_apps/s")
		b.ReportMetric(through/direct, "nsync/direct")
	}
}

// BenchmarkRollingDeploy starts one app of 100 instances on 10 sim cells through nsync and
// times it until every instance is RUNNING, then rolls a new command out with max_in_flight 10
// and times it until the deployment succeeded, and reports the roll as a multiple of the fresh
// start.
func BenchmarkRollingDeploy(b *testing.B) {
	const instances, maxInFlight = 100, 10
	var cells []devcluster.Cell
	for i := range 10 {
		cfg := rep.Default()
		cfg.CellID, cfg.Zone = fmt.Sprintf("cell-%d", i), fmt.Sprintf("z%d", i%3)
		cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": "/rootfs"}
		cfg.Backend = rep.BackendSim
		cfg.Capacity = rep.Capacity{MemoryMB: 64 * 1024, DiskMB: 64 * 1024, Containers: 200}
		cfg.Sim.StartLatency = rep.Duration(100 * time.Millisecond)
		cfg.Log.Level = "error"
		cells = append(cells, devcluster.Cell{Config: cfg})
	}
	c := devcluster.New(devcluster.Config{
		Dir: b.TempDir(), BBSAddress: "127.0.0.1:0", AuctioneerAddress: "127.0.0.1:0",
		Cells: cells, Logger: logtest.New(b), Nsync: true,
		ConfigureNsync: func(cfg *nsync.Config) {
			cfg.BulkInterval, cfg.DomainTTL = nsync.Duration(time.Minute), nsync.Duration(2*time.Minute)
			cfg.DeployPoll = nsync.Duration(100 * time.Millisecond)
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- c.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		b.Fatalf("cluster: %v", err)
	}
	defer func() { cancel(); <-done }()
	running := func(pg string) int {
		resp, err := c.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{pg}}})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, a := range resp.GetActualLrps() {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				n++
			}
		}
		return n
	}
	until := func(what string, cond func() bool) {
		deadline := time.Now().Add(5 * time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				b.Fatalf("%s: not within 5 minutes", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		guid := fmt.Sprintf("big-%d", i)
		a := &nsyncv1.App{Guid: guid, Name: "bench", SpaceGuid: "space", Stack: "cflinuxfs4",
			Command: "/bin/app", Instances: instances, MemoryMb: 64, DiskMb: 64, Ports: []uint32{8080}}
		start := time.Now()
		if _, err := c.Nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: a}); err != nil {
			b.Fatal(err)
		}
		until("fresh start", func() bool { return running(guid+"-v1") == instances })
		fresh := time.Since(start)

		a.Command = "/bin/app --v2"
		start = time.Now()
		resp, err := c.Nsync.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: a, Options: &nsyncv1.DeploymentOptions{MaxInFlight: maxInFlight}})
		if err != nil {
			b.Fatal(err)
		}
		until("rollout", func() bool {
			d, err := c.Nsync.GetDeployment(ctx, &nsyncv1.GetDeploymentRequest{AppGuid: guid})
			if err != nil {
				b.Fatal(err)
			}
			if s := d.GetDeployment().GetState(); s == nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED {
				b.Fatalf("rollout failed: %s", d.GetDeployment().GetMessage())
			}
			return d.GetDeployment().GetId() == resp.GetDeployment().GetId() && d.GetDeployment().GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED
		})
		roll := time.Since(start)
		b.Logf("%d instances on 10 sim cells: fresh start %s, rolling deploy (max_in_flight %d) %s, ratio %.1f", instances, fresh.Round(time.Millisecond), maxInFlight, roll.Round(time.Millisecond), roll.Seconds()/fresh.Seconds())
		b.ReportMetric(fresh.Seconds(), "fresh_s")
		b.ReportMetric(roll.Seconds(), "roll_s")
		b.ReportMetric(roll.Seconds()/fresh.Seconds(), "roll/fresh")
	}
}
