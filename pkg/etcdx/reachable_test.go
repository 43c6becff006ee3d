package etcdx_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// TestMain runs the etcd members etcdtest.StartCluster asks for.
func TestMain(m *testing.M) {
	etcdtest.RunMemberIfAsked()
	os.Exit(m.Run())
}

// TestGuardWhileEtcdIsDown: through Guard, every call to a killed etcd answers Unavailable
// with retry advice within the bound, long before the caller's deadline, and none of the
// writes lands once etcd is back (without the guard, a transaction waits for etcd until the
// caller's deadline).
func TestGuardWhileEtcdIsDown(t *testing.T) {
	etcd := etcdtest.StartCluster(t, 1)
	kv := etcdx.Guard(etcd.Client, 300*time.Millisecond)
	ctx := t.Context()
	if _, err := kv.Put(ctx, "/guard/up", "x"); err != nil {
		t.Fatalf("put with etcd up: %v", err)
	}
	etcd.StopAll()
	deadline, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, perr := kv.Put(deadline, "/guard/put", "x")
	_, terr := kv.Txn(deadline).If(clientv3.Compare(clientv3.CreateRevision("/guard/txn"), "=", 0)).
		Then(clientv3.OpPut("/guard/txn", "x")).Commit()
	_, derr := kv.Delete(deadline, "/guard/up")
	_, gerr := kv.Get(deadline, "/guard/up")
	for what, err := range map[string]error{"put": perr, "txn": terr, "delete": derr, "get": gerr} {
		if !errors.Is(err, rpcerr.ErrUnavailable) {
			t.Fatalf("%s with etcd down: %v, want Unavailable", what, err)
		}
		if st := status.Convert(rpcerr.ToStatus(err)); st.Code() != codes.Unavailable || len(st.Details()) == 0 {
			t.Fatalf("%s with etcd down answers %v without retry advice", what, st.Code())
		}
	}

	etcd.StartAll()
	back := false
	for end := time.Now().Add(30 * time.Second); !back && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		_, err := kv.Put(ctx, "/guard/back", "x")
		back = err == nil
	}
	if !back {
		t.Fatal("no write went through within 30s of etcd's return")
	}
	resp, err := etcd.Client.Get(ctx, "/guard/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	if len(keys) != 2 || keys[0] != "/guard/back" || keys[1] != "/guard/up" {
		t.Fatalf("keys after the outage: %v, want /guard/back and /guard/up only", keys)
	}
}

// TestWhileReachableEndsACallWhenEtcdGoesAway: a call in flight when etcd is killed ends
// within the bound, marked as a lost connection, not at its caller's deadline.
func TestWhileReachableEndsACallWhenEtcdGoesAway(t *testing.T) {
	etcd := etcdtest.StartCluster(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	callCtx, done := etcdx.WhileReachable(ctx, etcd.Client, 300*time.Millisecond)
	defer done()
	etcd.StopAll()
	<-callCtx.Done()
	if !etcdx.ConnectionLost(callCtx) || ctx.Err() != nil {
		t.Fatalf("call context ended with %v (caller's: %v), want the connection lost", context.Cause(callCtx), ctx.Err())
	}
}
