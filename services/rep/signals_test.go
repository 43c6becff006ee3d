package rep_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
)

// drainingRep is a rep run as ServeUntilSignal runs it, with drain for SIGTERM/SIGUSR1 and
// cancel for SIGINT.
type drainingRep struct {
	*repEnv
	drain  chan os.Signal
	cancel context.CancelFunc
	done   chan error
}

// startDraining runs a rep with one running instance of guid under drain signals; an
// evacuation is bounded by a minute, far longer than the tests wait.
func startDraining(t *testing.T, env *bbstest.Env, guid string) *drainingRep {
	t.Helper()
	svc, cfg := newRep(t, env, env.Etcd, env.Client, func(c *rep.Config) { c.EvacuationTimeout = rep.Duration(time.Minute) })
	d := &drainingRep{drain: make(chan os.Signal, 2), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	ready := make(chan struct{})
	go func() { d.done <- rep.Draining(svc, d.drain).Run(ctx, func() { close(ready) }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d.done:
		case <-time.After(testkit.StopTimeout):
			t.Error("rep did not stop")
		}
	})
	select {
	case <-ready:
	case err := <-d.done:
		t.Fatalf("rep stopped before it was ready: %v", err)
	case <-time.After(testkit.ReadyTimeout):
		t.Fatal("rep not ready")
	}
	conn := testkit.Dial(t, svc.Addr().String())
	t.Cleanup(func() { conn.Close() })
	d.repEnv = &repEnv{svc: svc, cfg: cfg, client: repv1.NewRepServiceClient(conn)}
	lrp := desiredLRP(guid, 1)
	desire(t, env, lrp)
	perform(t, d.repEnv, []*repv1.LRPInstance{lrpWork(lrp, 0)}, nil)
	waitRunning(t, env, d.repEnv, guid, 0)
	return d
}

// stopped waits for the rep to return by itself within timeout.
func (d *drainingRep) stopped(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("rep stopped with error: %v", err)
		}
		d.done <- nil // for the cleanup
	case <-time.After(timeout):
		t.Fatalf("rep still running %s later", timeout)
	}
}

// waitEvacuating waits until guid/0 has its EVACUATING copy.
func waitEvacuating(t *testing.T, env *bbstest.Env, guid string) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool {
		return actual(t, env, guid, 0, modelsv1.ActualLRP_PRESENCE_EVACUATING) != nil
	}, "EVACUATING copy")
}

// TestDrainSignal: SIGTERM (or SIGUSR1) evacuates the cell, and the rep stops once its
// instance is handed over, revoking its presence.
func TestDrainSignal(t *testing.T) {
	env := bbstest.Start(t)
	d := startDraining(t, env, "drained")
	d.drain <- syscall.SIGTERM
	waitEvacuating(t, env, "drained")
	select {
	case err := <-d.done:
		t.Fatalf("rep stopped before its instance was handed over: %v", err)
	default:
	}
	netInfo := actual(t, env, "drained", 0, modelsv1.ActualLRP_PRESENCE_EVACUATING).GetNetInfo()
	repl := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "replacement", CellId: "cell-elsewhere"}
	if _, err := env.Client.ClaimActualLRP(ctxT(t), &bbsv1.ClaimActualLRPRequest{ProcessGuid: "drained", InstanceKey: repl}); err != nil {
		t.Fatalf("claim replacement: %v", err)
	}
	if _, err := env.Client.StartActualLRP(ctxT(t), &bbsv1.StartActualLRPRequest{ProcessGuid: "drained", InstanceKey: repl, NetInfo: netInfo, Routable: true}); err != nil {
		t.Fatalf("start replacement: %v", err)
	}
	d.stopped(t, 10*time.Second)
	testkit.Eventually(t, 10*time.Second, func() bool { return cellOf(t, env, d.cfg.CellID) == nil }, "presence revoked")
}

// TestSecondDrainSignalStopsAtOnce: a second drain signal during the evacuation stops the rep
// without waiting for the hand-over (or the minute's evacuation timeout).
func TestSecondDrainSignalStopsAtOnce(t *testing.T) {
	env := bbstest.Start(t)
	d := startDraining(t, env, "impatient")
	d.drain <- syscall.SIGUSR1
	waitEvacuating(t, env, "impatient")
	d.drain <- syscall.SIGTERM
	d.stopped(t, 10*time.Second)
}

// TestInterruptStopsWithoutEvacuating: SIGINT (the context's end) stops the rep at once; its
// instance is not handed over.
func TestInterruptStopsWithoutEvacuating(t *testing.T) {
	env := bbstest.Start(t)
	d := startDraining(t, env, "interrupted")
	d.cancel()
	d.stopped(t, 10*time.Second)
	if e := actual(t, env, "interrupted", 0, modelsv1.ActualLRP_PRESENCE_EVACUATING); e != nil {
		t.Fatalf("interrupted rep evacuated: %v", e)
	}
}
