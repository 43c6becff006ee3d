package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/rep"
)

// TestMain runs the etcd members etcdtest.StartCluster asks for.
func TestMain(m *testing.M) {
	etcdtest.RunMemberIfAsked()
	os.Exit(m.Run())
}

// TestEtcdOutage kills every member of a 3-member etcd under a running cluster, as an operator
// stopping etcd would, for half, nine tenths, one, one and a fifth and twice the cells' lease
// TTL (the 5, 9, 10, 12 and 20 s of the default 10 s TTL, scaled to a 3 s TTL), and starts
// them again with their data each time. Throughout:
//   - writes during an outage answer Unavailable within the BBS's etcd_unreachable_timeout,
//     long before the callers' deadline, and none of them lands afterwards;
//   - reads answer from the BBS's cache;
//   - the running instances are untouched: same instance guids, on the same cells, RUNNING;
//   - no cell's presence key is written anew or moved to another lease, no cell disappears,
//     and no SUSPECT instance record ever appears.
//
// GAVEL_OUTAGE_TTL=10s runs it at the default TTL, with the literal outages.
func TestEtcdOutage(t *testing.T) {
	ttl := 3 * time.Second
	if v := os.Getenv("GAVEL_OUTAGE_TTL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("GAVEL_OUTAGE_TTL: %v", err)
		}
		ttl = d
	}
	outages := []time.Duration{ttl / 2, ttl * 9 / 10, ttl, ttl * 6 / 5, 2 * ttl}
	if testing.Short() {
		outages = []time.Duration{ttl * 6 / 5}
	}
	etcd := etcdtest.StartCluster(t, 3)
	var cells []devcluster.Cell
	for i := range 3 {
		cell := simCell(fmt.Sprintf("cell-%d", i), "z1", nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)
		cell.Config.LeaseTTL = rep.Duration(ttl)
		cells = append(cells, cell)
	}
	c := startClusterWith(t, devcluster.Config{Cells: cells, EtcdEndpoints: etcd.Endpoints(),
		ConfigureBBS: func(cfg *bbs.Config) { cfg.EtcdUnreachableTimeout = bbs.Duration(time.Second) }})

	ctx := t.Context()
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: desiredLRP("web", "preloaded:cflinuxfs4", 6, nil)}); err != nil {
		t.Fatal(err)
	}
	running := func() (map[int32]*modelsv1.ActualLRP, error) {
		resp, err := c.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{"web"}}})
		if err != nil {
			return nil, err
		}
		out := map[int32]*modelsv1.ActualLRP{}
		for _, a := range resp.GetActualLrps() {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
				out[a.GetKey().GetIndex()] = a
			}
		}
		return out, nil
	}
	var before map[int32]*modelsv1.ActualLRP
	testkit.Eventually(t, 30*time.Second, func() bool {
		r, err := running()
		before = r
		return err == nil && len(r) == 6
	}, "6 instances of web running")

	// Every event from here on: a SUSPECT copy or a departed cell would show in it.
	var mu sync.Mutex
	var trouble []string
	note := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		trouble = append(trouble, fmt.Sprintf(format, args...))
	}
	sctx, stopWatching := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		stream, err := c.BBS.SubscribeToEvents(sctx, &bbsv1.SubscribeToEventsRequest{})
		if err != nil {
			note("subscribe: %v", err)
			return
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				if sctx.Err() == nil {
					note("event stream ended: %v", err)
				}
				return
			}
			for _, ev := range resp.GetEvents() {
				for _, a := range []*modelsv1.ActualLRP{ev.GetActualLrpCreated().GetActualLrp(), ev.GetActualLrpChanged().GetAfter()} {
					if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_SUSPECT {
						note("revision %d: SUSPECT instance %s/%d", resp.GetRevision(), a.GetKey().GetProcessGuid(), a.GetKey().GetIndex())
					}
				}
				if d := ev.GetCellDisappeared(); d != nil {
					note("revision %d: cell %s disappeared", resp.GetRevision(), d.GetCell().GetCellId())
				}
			}
		}
	}()
	t.Cleanup(func() { stopWatching(); <-watched })

	type presence struct{ created, lease int64 }
	presences := func() (map[string]presence, error) {
		out := map[string]presence{}
		for _, cell := range cells {
			key := "/gavel/v1/cell/" + cell.Config.CellID
			resp, err := etcd.Client.Get(ctx, key)
			if err != nil {
				return nil, err
			}
			if len(resp.Kvs) != 1 {
				return nil, fmt.Errorf("%s is absent", key)
			}
			out[cell.Config.CellID] = presence{resp.Kvs[0].CreateRevision, resp.Kvs[0].Lease}
		}
		return out, nil
	}
	first, err := presences()
	if err != nil {
		t.Fatal(err)
	}

	// A deadline far past the BBS's bound: an answer before it is the BBS's own.
	callerDeadline := 30 * time.Second
	for n, outage := range outages {
		start := time.Now()
		etcd.StopAll()

		// Reads answer from the cache.
		if r, err := running(); err != nil || len(r) != 6 {
			t.Fatalf("outage %d (%s): reading the instances: %d running, %v", n, outage, len(r), err)
		}
		// Writes answer Unavailable, with retry advice, before the caller's deadline.
		wctx, cancel := context.WithTimeout(ctx, callerDeadline)
		_, derr := c.BBS.DesireLRP(wctx, &bbsv1.DesireLRPRequest{DesiredLrp: desiredLRP(fmt.Sprintf("refused-%d", n), "preloaded:cflinuxfs4", 1, nil)})
		_, uerr := c.BBS.UpdateDesiredLRP(wctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web",
			Update: &modelsv1.DesiredLRPUpdate{Annotation: proto.String(fmt.Sprintf("refused-%d", n))}})
		cancel()
		// The first write may reach the BBS before its etcd client has seen the members go
		// (the connection still looks ready, so the transaction is sent and its answer lost):
		// that one may answer DeadlineExceeded, the documented "may or may not have been made",
		// and is checked below not to have been made. The second comes after it, once the BBS
		// knows, and must be refused outright.
		if st := status.Convert(derr); st.Code() == codes.DeadlineExceeded && strings.Contains(st.Message(), "may or may not") {
			t.Logf("outage %d (%s): DesireLRP sent as etcd went down: %v", n, outage, derr)
		} else if st.Code() != codes.Unavailable || len(st.Details()) == 0 {
			t.Fatalf("outage %d (%s): DesireLRP answered %v (%d details), want Unavailable with retry advice", n, outage, derr, len(st.Details()))
		}
		if st := status.Convert(uerr); st.Code() != codes.Unavailable || len(st.Details()) == 0 {
			t.Fatalf("outage %d (%s): UpdateDesiredLRP answered %v (%d details), want Unavailable with retry advice", n, outage, uerr, len(st.Details()))
		}
		time.Sleep(time.Until(start.Add(outage))) // the rest of the outage itself
		etcd.StartAll()

		// Back: a write goes through again, every cell keeps the same presence key and lease
		// and renews it (its lease outlives the outage by more than a TTL below).
		testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
			_, err := c.BBS.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web",
				Update: &modelsv1.DesiredLRPUpdate{Annotation: proto.String(fmt.Sprintf("after-%d", n))}})
			return err == nil, fmt.Sprint(err)
		}, fmt.Sprintf("a write after outage %d", n))
		// Nothing refused, or left in doubt, during the outage was made.
		if _, err := c.BBS.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: fmt.Sprintf("refused-%d", n)}); status.Code(err) != codes.NotFound {
			t.Fatalf("after outage %d (%s): the LRP whose desire was refused: %v, want NotFound", n, outage, err)
		}
		now, err := presences()
		if err != nil {
			t.Fatalf("after outage %d (%s): %v", n, outage, err)
		}
		for id, p := range now {
			if p != first[id] {
				t.Fatalf("after outage %d (%s): cell %s presence created at %d on lease %x, was %d on %x", n, outage, id, p.created, p.lease, first[id].created, first[id].lease)
			}
		}
	}
	time.Sleep(ttl + ttl/2) // past a whole TTL: leases that were not renewed would expire now

	after, err := running()
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range before {
		b := after[i]
		if b == nil || b.GetInstanceKey().GetInstanceGuid() != a.GetInstanceKey().GetInstanceGuid() || b.GetInstanceKey().GetCellId() != a.GetInstanceKey().GetCellId() {
			t.Errorf("instance web/%d: was %v, now %v", i, a.GetInstanceKey(), b.GetInstanceKey())
		}
	}
	if now, err := presences(); err != nil || fmt.Sprint(now) != fmt.Sprint(first) {
		t.Errorf("presences at the end: %v (%v), want %v", now, err, first)
	}
	desired, err := c.BBS.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range desired.GetDesiredLrps() {
		if d.GetProcessGuid() != "web" {
			t.Errorf("desired LRP %s stored: its DesireLRP was answered Unavailable during an outage", d.GetProcessGuid())
		}
		if want := fmt.Sprintf("after-%d", len(outages)-1); d.GetProcessGuid() == "web" && d.GetAnnotation() != want {
			t.Errorf("web's annotation is %q, want %q: an update answered Unavailable landed", d.GetAnnotation(), want)
		}
	}
	stopWatching()
	<-watched
	mu.Lock()
	defer mu.Unlock()
	for _, tr := range trouble {
		t.Error(tr)
	}
}
