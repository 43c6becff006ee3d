package bbs_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// TestActualLRPsListsTheStoredRecords checks that the list, which the BBS sends from the
// encodings its cache keeps (decision 0053), gives every record exactly as etcd holds it: for
// records the cache followed from the watch, and for records it loaded at start-up.
func TestActualLRPsListsTheStoredRecords(t *testing.T) {
	_, cli := etcdtest.Start(t)
	env := bbstest.StartOn(t, cli)
	lrpRegisterCell(t, env, "cell-a", "z1")
	lrpDesire(t, env, "web", 3)
	lrpDesire(t, env, "worker", 1)
	ik := lrpInstKey("inst-0", "cell-a")
	lrpClaim(t, env, "web", 0, ik)
	lrpStart(t, env, "web", 0, ik, lrpNetInfo(61001))
	lrpClaim(t, env, "web", 1, lrpInstKey("inst-1", "cell-a"))

	want := func(t *testing.T, env *bbstest.Env) []*modelsv1.ActualLRP {
		t.Helper()
		var out []*modelsv1.ActualLRP
		for _, k := range [][2]any{{"web", int32(0)}, {"web", int32(1)}, {"web", int32(2)}, {"worker", int32(0)}} {
			a := lrpStored(t, env, k[0].(string), k[1].(int32), modelsv1.ActualLRP_PRESENCE_ORDINARY)
			if a == nil {
				t.Fatalf("%v not stored", k)
			}
			out = append(out, a)
		}
		return out
	}
	check := func(t *testing.T, env *bbstest.Env) {
		t.Helper()
		resp, err := env.Client.ActualLRPs(ctxT(t), &bbsv1.ActualLRPsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		w := want(t, env)
		got := resp.GetActualLrps()
		if len(got) != len(w) {
			t.Fatalf("listed %d records, want %d: %v", len(got), len(w), got)
		}
		for i := range w {
			if !proto.Equal(got[i], w[i]) {
				t.Fatalf("record %d listed as\n%v\nstored as\n%v", i, got[i], w[i])
			}
		}
		if len(resp.ProtoReflect().GetUnknown()) != 0 {
			t.Fatal("the client decoded fields it does not know: the records are not sent as actual_lrps")
		}
		if resp.GetRevision() == 0 {
			t.Fatal("the list must return the revision it read")
		}
		one, err := env.Client.ActualLRPs(ctxT(t), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{"web"}, CellId: "cell-a"}})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(one.GetActualLrps()); n != 2 || !proto.Equal(one.GetActualLrps()[0], w[0]) || !proto.Equal(one.GetActualLrps()[1], w[1]) {
			t.Fatalf("filtered list %v, want web/0 and web/1", one.GetActualLrps())
		}
	}
	t.Run("followed", func(t *testing.T) { check(t, env) })
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Run("loaded", func(t *testing.T) { check(t, bbstest.StartOn(t, cli)) })
}
