package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// TestWriteWhileEtcdIsDown stops the store's etcd and writes: each change is answered
// Unavailable, with retry advice, long before the caller's own deadline, whether the caller
// waits for the bound or gives up sooner; and once etcd is back none of them is ever
// applied (on the old committer, a transaction queued during the outage landed once etcd
// returned).
func TestWriteWhileEtcdIsDown(t *testing.T) {
	dir, addr := t.TempDir(), testkit.ReservedAddr(t)
	// The member started again after the outage closes last, after the store and its client.
	var back *etcdembed.Server
	t.Cleanup(func() {
		if back != nil {
			_ = back.Close()
		}
	})
	srv, cli := etcdtest.Start(t, func(c *etcdembed.Config) { c.Dir, c.ClientAddr = dir, addr })
	st := New(cli, Options{Logger: logtest.New(t), UnreachableTimeout: 500 * time.Millisecond})
	testkit.Start(t, "store", st)
	claim := func(ctx context.Context, port uint32) error {
		_, err := st.Update(ctx, func(tx *Txn) error { return tx.PutPortOwner("tcp", port, "web") })
		return err
	}
	if err := claim(t.Context(), 61000); err != nil {
		t.Fatalf("write with etcd up: %v", err)
	}

	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for i, port := range []uint32{61001, 61002, 61003} {
		err := claim(ctx, port)
		if !errors.Is(err, rpcerr.ErrUnavailable) {
			t.Fatalf("write %d during the outage: %v, want Unavailable", i, err)
		}
		st := status.Convert(rpcerr.ToStatus(err))
		if st.Code() != codes.Unavailable || len(st.Details()) == 0 {
			t.Fatalf("write %d during the outage answered %v with details %v, want Unavailable with retry advice", i, st.Code(), st.Details())
		}
	}
	// A caller that gives up before the bound is not sent either.
	short, cancelShort := context.WithTimeout(t.Context(), 100*time.Millisecond)
	if err := claim(short, 61004); err == nil {
		t.Fatal("write with a short deadline during the outage succeeded")
	}
	cancelShort()

	// etcd comes back with its data: a new write lands, and once no transaction is in flight
	// nothing refused during the outage is there.
	var err error
	back, err = etcdembed.Start(t.Context(), etcdembed.Config{Dir: dir, ClientAddr: addr, UnsafeNoFsync: true, Quiet: true, FastElection: true})
	if err != nil {
		t.Fatalf("start etcd again: %v", err)
	}
	testkit.Eventually(t, 30*time.Second, func() bool { return claim(t.Context(), 61010) == nil }, "a write after etcd returned")
	testkit.Eventually(t, 10*time.Second, func() bool { return len(st.committer.slots) == 0 && len(st.committer.reqs) == 0 },
		"no transaction in flight")
	for _, port := range []uint32{61000, 61001, 61002, 61003, 61004, 61010} {
		resp, err := cli.Get(t.Context(), PortOwnerKey("tcp", port))
		if err != nil {
			t.Fatal(err)
		}
		if landed, want := len(resp.Kvs) == 1, port == 61000 || port == 61010; landed != want {
			t.Errorf("port %d: stored %v, want %v", port, landed, want)
		}
	}
}
