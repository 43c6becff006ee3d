package routeemitter_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// TestDrainingInstanceLeavesTheTable: the route-emitter reports the revision it has published
// to the BBS (a key under a lease, named by its table id), so a retired instance is first
// withdrawn from routing: its endpoint leaves the table while the record is still RUNNING and
// draining; the report then reaches the drain's revision.
func TestDrainingInstanceLeavesTheTable(t *testing.T) {
	env := bbstest.Start(t, func(c *bbs.Config) { c.DrainTimeout = bbs.Duration(time.Hour) })
	c, ctx := env.Client, ctxT(t)
	b, err := proto.Marshal(&modelsv1.CellPresence{CellId: "cell-1", RepAddress: "127.0.0.1:1", Zone: "z1", Address: "127.0.0.1",
		Capacity: &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 1024, Containers: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Etcd.Put(ctx, bbstest.CellKey("cell-1"), string(b)); err != nil {
		t.Fatal(err)
	}
	e := startEmitter(t, env.Addr)
	desire(t, c, lrp("app", 2, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["app.com"]}]`)))
	run(t, c, "app", 0, "a0", true, netInfo(8080, 61000))
	run(t, c, "app", 1, "a1", true, netInfo(8080, 61001))
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61000 app/1/a1@127.0.0.1:61001"})

	key := "/gavel/v1/routing/published/" + e.svc.TableID()
	reported := func() (int64, int64) {
		resp, err := env.Etcd.Get(ctx, key)
		if err != nil || len(resp.Kvs) == 0 {
			return 0, 0
		}
		v := &wrapperspb.Int64Value{}
		if err := proto.Unmarshal(resp.Kvs[0].Value, v); err != nil {
			t.Fatal(err)
		}
		return v.GetValue(), resp.Kvs[0].Lease
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		rev, lease := reported()
		return rev > 0 && lease != 0, fmt.Sprintf("revision %d, lease %x", rev, lease)
	}, "the route-emitter's report stored under a lease")

	n := int32(1)
	resp, err := c.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "app", Update: &modelsv1.DesiredLRPUpdate{Instances: &n}})
	if err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61000"})
	as, err := c.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{"app"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as.GetActualLrps() {
		if a.GetKey().GetIndex() == 1 && (a.GetState() != modelsv1.ActualLRP_STATE_RUNNING || a.GetDrainingSince() == nil || a.GetRoutable()) {
			t.Fatalf("retired instance %v, want RUNNING, draining, unrouted", a)
		}
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		rev, _ := reported()
		return rev >= resp.GetRevision(), fmt.Sprintf("reported %d, drain at %d", rev, resp.GetRevision())
	}, "the report reaching the drain's revision")
}
