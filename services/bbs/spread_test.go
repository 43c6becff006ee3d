package bbs_test

import (
	"maps"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// TestSpreadWithIsStoredAndUpdated: a desired LRP's spread peer is stored (in the full record and
// the scheduling info), replaced by an update that sets one, kept by an update that does not
// mention it, and cleared by an update that carries none.
func TestSpreadWithIsStoredAndUpdated(t *testing.T) {
	env := convStart(t)
	ctx := ctxT(t)
	d := lrp("web-v2", 1)
	d.SpreadWith = &modelsv1.SpreadWith{ProcessGuid: "web-v1", TotalInstances: 4}
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatal(err)
	}
	peer := func() *modelsv1.SpreadWith {
		t.Helper()
		got, err := env.Client.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web-v2"})
		if err != nil {
			t.Fatal(err)
		}
		infos, err := env.Client.DesiredLRPSchedulingInfos(ctx, &bbsv1.DesiredLRPSchedulingInfosRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{"web-v2"}}})
		if err != nil || len(infos.GetSchedulingInfos()) != 1 {
			t.Fatalf("scheduling infos %v %v", infos, err)
		}
		if a, b := got.GetDesiredLrp().GetSpreadWith(), infos.GetSchedulingInfos()[0].GetSpreadWith(); (a == nil) != (b == nil) ||
			a.GetProcessGuid() != b.GetProcessGuid() || a.GetTotalInstances() != b.GetTotalInstances() {
			t.Fatalf("the record's peer %v, the scheduling info's %v", a, b)
		}
		return got.GetDesiredLrp().GetSpreadWith()
	}
	if sw := peer(); sw.GetProcessGuid() != "web-v1" || sw.GetTotalInstances() != 4 {
		t.Fatalf("stored peer %v", sw)
	}
	two := int32(2)
	update := func(u *modelsv1.DesiredLRPUpdate) {
		t.Helper()
		if _, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web-v2", Update: u}); err != nil {
			t.Fatal(err)
		}
	}
	update(&modelsv1.DesiredLRPUpdate{Instances: &two})
	if sw := peer(); sw.GetProcessGuid() != "web-v1" || sw.GetTotalInstances() != 4 {
		t.Fatalf("an update without spread_with changed the peer: %v", sw)
	}
	update(&modelsv1.DesiredLRPUpdate{SpreadWith: &modelsv1.SpreadWithUpdate{SpreadWith: &modelsv1.SpreadWith{ProcessGuid: "web-v0", TotalInstances: 5}}})
	if sw := peer(); sw.GetProcessGuid() != "web-v0" || sw.GetTotalInstances() != 5 {
		t.Fatalf("replaced peer %v", sw)
	}
	update(&modelsv1.DesiredLRPUpdate{SpreadWith: &modelsv1.SpreadWithUpdate{}})
	if sw := peer(); sw != nil {
		t.Fatalf("cleared peer %v", sw)
	}
}

// TestAuctionCarriesTheSpreadPeersSurvivors: the start request of an LRP with a spread peer
// carries the peer's instances that outlive the step (index below total_instances minus the
// LRP's desired instances), per cell; unplaced instances and instances at or above the bound
// are not counted. An LRP without a peer, and one whose peer does not exist, carry none.
func TestAuctionCarriesTheSpreadPeersSurvivors(t *testing.T) {
	env := convStart(t)
	ctx := ctxT(t)
	for _, c := range []string{"cell-a", "cell-b", "cell-c"} {
		lrpRegisterCell(t, env.Env, c, "z-"+c)
	}
	lrpDesire(t, env.Env, "web-v1", 5)
	// Old indices 0..3 placed: 0 and 3 on cell-a, 1 on cell-b, 2 on cell-c (claimed only);
	// index 4 stays unclaimed.
	for i, cell := range []string{"cell-a", "cell-b", "cell-c", "cell-a"} {
		ik := lrpInstKey("old-"+cell+string(rune('0'+i)), cell)
		lrpClaim(t, env.Env, "web-v1", int32(i), ik)
		if i != 2 {
			lrpStart(t, env.Env, "web-v1", int32(i), ik, lrpNetInfo(uint32(61000+i)))
		}
	}
	env.auc.waitCount(t, "lrp:web-v1/0", 1)
	if p := env.auc.peer("web-v1"); p != nil {
		t.Fatalf("an LRP without spread_with carried peer %v", p)
	}

	// web-v2 with 1 desired instance of 5: old indices below 4 survive (0..3).
	d := lrp("web-v2", 1)
	d.SpreadWith = &modelsv1.SpreadWith{ProcessGuid: "web-v1", TotalInstances: 5}
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatal(err)
	}
	env.auc.waitCount(t, "lrp:web-v2/0", 1)
	wantPeer(t, env.auc, "web-v2", 4, map[string]int32{"cell-a": 2, "cell-b": 1, "cell-c": 1})

	// Scaled to 3: old indices below 2 survive (0 on cell-a, 1 on cell-b).
	three := int32(3)
	if _, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web-v2", Update: &modelsv1.DesiredLRPUpdate{Instances: &three}}); err != nil {
		t.Fatal(err)
	}
	env.auc.waitCount(t, "lrp:web-v2/2", 1)
	wantPeer(t, env.auc, "web-v2", 2, map[string]int32{"cell-a": 1, "cell-b": 1})

	// A peer that does not exist counts nothing: the request carries it with no cell.
	g := lrp("api-v2", 1)
	g.SpreadWith = &modelsv1.SpreadWith{ProcessGuid: "api-v1", TotalInstances: 3}
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: g}); err != nil {
		t.Fatal(err)
	}
	env.auc.waitCount(t, "lrp:api-v2/0", 1)
	wantPeer(t, env.auc, "api-v2", 2, map[string]int32{})
}

// wantPeer waits until guid's last start request carries a spread peer with the
// given bound and per-cell counts.
func wantPeer(t *testing.T, auc *convAuctioneer, guid string, below int32, cells map[string]int32) {
	t.Helper()
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		p := auc.peer(guid)
		ok := p != nil && p.GetBelowIndex() == below && maps.Equal(p.GetCellInstances(), cells) && p.GetProcessGuid() != ""
		return ok, p.String()
	}, guid+"'s spread peer")
}
