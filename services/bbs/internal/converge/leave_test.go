package converge

import (
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// TestFullPassLeavesCellsJudgedByACellLossPass: with two cells lost and a cell-loss pass
// judging one of them, a full pass replaces the other cell's instance and leaves the judged
// cell's alone (its pass replaces it); once no pass judges the cell, a full pass replaces it.
func TestFullPassLeavesCellsJudgedByACellLossPass(t *testing.T) {
	_, cli := etcdtest.Start(t)
	st := store.New(cli, store.Options{Logger: logtest.New(t)})
	testkit.Start(t, "store", st)
	co := core.New(st, core.Config{})
	ctx := t.Context()
	if _, err := co.DesiredLRPs.DesireLRP(ctx, &modelsv1.DesiredLRP{ProcessGuid: "web", Domain: "apps",
		Rootfs: "docker:///busybox", Instances: 2, MemoryMb: 64, DiskMb: 64}); err != nil {
		t.Fatal(err)
	}
	// Instance 0 runs on cell-a, instance 1 on cell-b; neither cell has a presence.
	for i, cell := range []string{"cell-a", "cell-b"} {
		ik := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-" + cell, CellId: cell}
		if _, err := co.ActualLRPs.ClaimActualLRP(ctx, "web", int32(i), ik); err != nil {
			t.Fatal(err)
		}
		if _, err := co.ActualLRPs.StartActualLRP(ctx, "web", int32(i), ik, &modelsv1.ActualLRPNetInfo{Address: "10.0.0.1"}, true, "apps"); err != nil {
			t.Fatal(err)
		}
	}
	c := New(co, st, Config{Interval: time.Hour})
	c.judging["cell-a"] = true // a cell-loss pass under way judges cell-a

	suspects := func() map[string]bool {
		out := map[string]bool{}
		all, _ := st.ActualLRPs(store.ListFilter{})
		for _, a := range all {
			if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_SUSPECT {
				out[a.GetInstanceKey().GetCellId()] = true
			}
		}
		return out
	}
	r, err := c.Converge(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := suspects(); r.Suspected != 1 || !got["cell-b"] || got["cell-a"] {
		t.Fatalf("full pass replaced %d, suspects on %v; want cell-b's instance only", r.Suspected, got)
	}

	// Once no cell-loss pass judges cell-a, the next full pass replaces its instance.
	c.judgingMu.Lock()
	delete(c.judging, "cell-a")
	c.judgingMu.Unlock()
	if r, err = c.Converge(ctx); err != nil {
		t.Fatal(err)
	}
	if got := suspects(); r.Suspected != 1 || !got["cell-a"] || !got["cell-b"] {
		t.Fatalf("second full pass replaced %d, suspects on %v; want cell-a's now too", r.Suspected, got)
	}
}
