package store

import (
	"context"
	"errors"
	"slices"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// racingKV runs race before the nth transaction it is asked for, as a concurrent writer would.
type racingKV struct {
	clientv3.KV
	n    int
	race func()
}

func (k *racingKV) Txn(ctx context.Context) clientv3.Txn {
	k.n--
	if k.n == 0 {
		k.race()
	}
	return k.KV.Txn(ctx)
}

func TestPoolsAndBindings(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx := context.Background()
	s := New(cli, nil)
	for _, name := range []string{"a", "b"} {
		if err := s.CreatePool(ctx, &nsyncv1.PlacementPool{Name: name, Require: []string{name}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreatePool(ctx, &nsyncv1.PlacementPool{Name: "a"}); !errors.Is(err, rpcerr.ErrAlreadyExists) {
		t.Fatalf("second create: %v", err)
	}
	if err := s.Bind(ctx, "s1", "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(ctx, "s1", "b"); err != nil { // moves s1: a's reverse index must forget it
		t.Fatal(err)
	}
	if err := s.Bind(ctx, "s2", "missing"); !errors.Is(err, rpcerr.ErrNotFound) {
		t.Fatalf("bind to a missing pool: %v", err)
	}
	if err := s.SetDefault(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePool(ctx, "a", false); err != nil {
		t.Fatalf("delete of a pool no longer bound: %v", err)
	}
	err := s.DeletePool(ctx, "b", false)
	if !errors.Is(err, rpcerr.ErrFailedPrecondition) {
		t.Fatalf("delete of a bound default pool: %v", err)
	}
	all, err := s.AllPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if all.For("s1").GetName() != "b" || all.For("unbound").GetName() != "b" || !slices.Equal(all.SpacesOf("b"), []string{"s1"}) {
		t.Fatalf("pools %+v", all)
	}
	if err := s.DeletePool(ctx, "b", true); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
	resp, err := cli.Get(ctx, Root, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("after the forced delete %d keys remain under %s (%v)", resp.Count, Root, err)
	}
}

func TestLostRacesAreAborted(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx := context.Background()
	base := New(cli, nil)
	if err := base.CreatePool(ctx, &nsyncv1.PlacementPool{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	// A space bound between the delete's read of the bindings and its transaction.
	racy := &racingKV{KV: cli, n: 2, race: func() {
		if err := base.Bind(ctx, "late", "p"); err != nil {
			t.Fatal(err)
		}
	}}
	if err := New(racy, nil).DeletePool(ctx, "p", false); !errors.Is(err, rpcerr.ErrAborted) {
		t.Fatalf("delete racing a bind: %v, want Aborted", err)
	}
	if _, _, err := base.Pool(ctx, "p"); err != nil {
		t.Fatalf("the pool was deleted under a new binding: %v", err)
	}
	// An app record changed between read and write.
	rec := &nsyncv1.AppRecord{App: &nsyncv1.App{Guid: "app", Instances: 1}}
	if _, err := base.CreateApp(ctx, rec); err != nil {
		t.Fatal(err)
	}
	cur, err := base.GetApp(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	rec.App.Instances = 2
	if _, err := base.PutApp(ctx, rec, cur.ModRevision); err != nil {
		t.Fatal(err)
	}
	rec.App.Instances = 3
	if _, err := base.PutApp(ctx, rec, cur.ModRevision); !errors.Is(err, rpcerr.ErrAborted) {
		t.Fatalf("stale write: %v, want Aborted", err)
	}
	if got, _ := base.GetApp(ctx, "app"); got.Record.GetApp().GetInstances() != 2 {
		t.Fatalf("stale write overwrote the record: %v", got.Record)
	}
}
