package presence

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
)

// TestMain runs the etcd members StartCluster asks for.
func TestMain(m *testing.M) {
	etcdtest.RunMemberIfAsked()
	os.Exit(m.Run())
}

// TestEtcdOutageKeepsThePresence kills etcd for half, nine tenths, one, one and a fifth and
// twice the presence's TTL (the 5, 9, 10, 12 and 20 s of a 10 s TTL), starting it again with
// its data each time: the cell's key is never deleted or written anew, and stays on the same
// lease, which the rep keeps alive again after each outage. (The rep used to revoke the lease
// once its keepalive ended, and the revoke reached an etcd that had kept the lease.)
func TestEtcdOutageKeepsThePresence(t *testing.T) {
	const ttl = 2 * time.Second
	outages := []time.Duration{ttl / 2, ttl * 9 / 10, ttl, ttl * 6 / 5, 2 * ttl}
	if testing.Short() {
		outages = []time.Duration{ttl * 6 / 5}
	}
	etcd := etcdtest.StartCluster(t, 1)
	cli := etcd.Client

	p := New(cli, ttl, func() *modelsv1.CellPresence {
		return &modelsv1.CellPresence{CellId: "cell-1", RepAddress: "127.0.0.1:1"}
	}, logtest.New(t))
	testkit.Start(t, "presence", p)
	key := CellKey("cell-1")
	get := func() (createRev int64, lease clientv3.LeaseID, err error) {
		resp, err := cli.Get(t.Context(), key)
		if err != nil {
			return 0, 0, err
		}
		if len(resp.Kvs) != 1 {
			return 0, 0, fmt.Errorf("%s is absent", key)
		}
		return resp.Kvs[0].CreateRevision, clientv3.LeaseID(resp.Kvs[0].Lease), nil
	}
	created, lease, err := get()
	if err != nil || lease != p.Lease() {
		t.Fatalf("after registering: %s created at %d on lease %x (rep holds %x), %v", key, created, lease, p.Lease(), err)
	}

	for _, outage := range outages {
		etcd.StopAll()
		time.Sleep(outage) // the outage itself, not a wait for an outcome
		etcd.StartAll()
		// Renewed once more after the outage: the same lease is kept alive again.
		ctx, cancel := context.WithTimeout(t.Context(), 3*ttl)
		testkit.Eventually(t, 3*ttl, func() bool {
			r, err := cli.TimeToLive(ctx, lease)
			return err == nil && r.TTL > 0 && p.Held() && p.Lease() == lease
		}, fmt.Sprintf("the rep keeping its lease alive after a %s outage", outage))
		cancel()
		c, l, err := get()
		if err != nil || c != created || l != lease {
			t.Fatalf("after a %s outage: %s created at %d on lease %x (%v); want created at %d on lease %x",
				outage, key, c, l, err, created, lease)
		}
	}
	// The lease outlives another TTL: it is really renewed, not just not yet expired.
	time.Sleep(ttl + ttl/2)
	if c, l, err := get(); err != nil || c != created || l != lease {
		t.Fatalf("a TTL after the last outage: %s created at %d on lease %x (%v)", key, c, l, err)
	}
}
