package bbs_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// TestMain fails the package when a test leaves a goroutine behind: the embedded etcd's and
// the gRPC and etcd clients' goroutines all end with their cleanups, so what remains is a leak.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hungRep is a rep whose StopLRPInstance hangs until its context ends.
type hungRep struct {
	called   chan struct{}
	returned atomic.Bool
	once     sync.Once
}

func (h *hungRep) StopLRPInstance(ctx context.Context, _ *modelsv1.CellPresence, _ *modelsv1.ActualLRPKey, _ *modelsv1.ActualLRPInstanceKey) error {
	h.once.Do(func() { close(h.called) })
	<-ctx.Done()
	h.returned.Store(true)
	return ctx.Err()
}

func (h *hungRep) CancelTask(ctx context.Context, _ *modelsv1.CellPresence, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestStopJoinsBackgroundWork removes an LRP whose instance runs on a cell whose rep hangs, so
// the stop request is in flight when the BBS stops: Run must cancel that work and return only
// after it has ended (and after the store's commit goroutines): nothing the BBS started
// outlives Run.
func TestStopJoinsBackgroundWork(t *testing.T) {
	_, cli := etcdtest.Start(t)
	if _, err := cli.Get(context.Background(), "/"); err != nil { // connects the etcd client
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()

	cfg := bbs.Default()
	cfg.ListenAddress = "127.0.0.1:0"
	cfg.TLS = tlsx.Config{Insecure: true}
	cfg.EtcdTLS = tlsx.Config{Insecure: true}
	rep := &hungRep{called: make(chan struct{})}
	svc, err := bbs.New(cfg, logtest.New(t), cli, bbs.WithManualConvergence(), bbs.WithCellClient(rep))
	if err != nil {
		t.Fatal(err)
	}
	running := testkit.Start(t, "bbs", svc)
	conn := testkit.Dial(t, svc.Addr().String())
	client := bbsv1.NewBBSServiceClient(conn)
	rctx := ctxT(t)

	b, err := proto.Marshal(&modelsv1.CellPresence{CellId: "hung", RepAddress: "127.0.0.1:1", Zone: "z1", Address: "10.0.0.1",
		Capacity: &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 1024, Containers: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(rctx, store.CellKey("hung"), string(b)); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := client.Cells(rctx, &bbsv1.CellsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetCells()) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := client.DesireLRP(rctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 1)}); err != nil {
		t.Fatal(err)
	}
	ik := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-web-0", CellId: "hung"}
	if _, err := client.ClaimActualLRP(rctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: ik}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.RemoveDesiredLRP(rctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rep.called:
	case <-rctx.Done():
		t.Fatal("the BBS never asked the rep to stop the instance")
	}
	// The stop request to the hung rep is in flight now; stop the BBS.
	conn.Close()
	if err := running.Stop(); err != nil {
		t.Fatalf("bbs stopped with error: %v", err)
	}
	if !rep.returned.Load() {
		t.Fatal("Run returned while a background stop request was still running")
	}
	goleak.VerifyNone(t, before)
}
