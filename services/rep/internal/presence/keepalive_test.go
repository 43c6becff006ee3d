package presence

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
)

// TestKeepAlive checks the cell's own keepalive against a real etcd: it renews a lease past
// several TTLs, signalling each renewal; it ends promptly once etcd answers that the lease is
// gone; and it ends, about a TTL after its last renewal, while etcd is away. It warns only
// then: renewals answered in time say nothing.
func TestKeepAlive(t *testing.T) {
	const ttl = 2 * time.Second
	etcd := etcdtest.StartCluster(t, 1)
	cli := etcd.Client
	var out testkit.SyncBuffer
	p := New(cli, ttl, nil, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: &out}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	grant, err := cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		t.Fatal(err)
	}
	renewed := p.keepAlive(ctx, grant.ID)
	begin := time.Now()
	renewals := 0
	for time.Since(begin) < 3*ttl {
		select {
		case _, ok := <-renewed:
			if !ok {
				t.Fatalf("the keepalive ended after %d renewals, %s in", renewals, time.Since(begin))
			}
			renewals++
		case <-time.After(ttl):
			t.Fatalf("no renewal for a TTL after %d renewals", renewals)
		}
	}
	if ttlResp, err := cli.TimeToLive(ctx, grant.ID); err != nil || ttlResp.TTL <= 0 {
		t.Fatalf("after %s of keepalive on a %s lease: TTL %v, %v", time.Since(begin), ttl, ttlResp, err)
	}
	// A renewal every third of the TTL, and at once first: about 10 in 3 TTLs.
	if renewals < 7 || renewals > 12 {
		t.Errorf("%d renewals in %s of a %s lease, want about 10", renewals, 3*ttl, ttl)
	}

	// Revoked: etcd answers that the lease is gone at the next renewal.
	if _, err := cli.Revoke(ctx, grant.ID); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, renewed, ttl, "after the lease was revoked")
	if warned := out.String(); warned != "" {
		t.Errorf("warnings while etcd answered every renewal in time:\n%s", warned)
	}

	// etcd away: the keepalive ends about a TTL after the last renewal, not before.
	grant, err = cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		t.Fatal(err)
	}
	renewed = p.keepAlive(ctx, grant.ID)
	<-renewed
	etcd.StopAll()
	stopped := time.Now()
	waitEnd(t, renewed, 2*ttl, "with etcd stopped")
	if took := time.Since(stopped); took < ttl*2/3 {
		t.Errorf("the keepalive ended %s after etcd stopped, before the lease's TTL (%s) could have run out", took, ttl)
	}
	if warned := out.String(); !strings.Contains(warned, "cell presence keepalive stream broke") && !strings.Contains(warned, "no cell presence renewal answered") {
		t.Errorf("no warning that the renewals stopped with etcd; the log:\n%s", warned)
	}
}

// waitEnd waits up to within for renewed to be closed, reading the renewals before it.
func waitEnd(t *testing.T, renewed <-chan struct{}, within time.Duration, when string) {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case _, ok := <-renewed:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatalf("the keepalive still running %s after %s", within, when)
		}
	}
}

// TestResume checks how the presence finds out about its lease after the keepalive ended, against
// a real etcd: a live lease is kept, renewed by the question (a whole TTL again), and its key is
// written again under it when it went; a revoked lease is reported gone (lease 0), so the cell
// registers anew.
func TestResume(t *testing.T) {
	const ttl = 4 * time.Second
	etcd := etcdtest.StartCluster(t, 1)
	cli := etcd.Client
	presence := &modelsv1.CellPresence{CellId: "cell-r", RepAddress: "127.0.0.1:1"}
	p := New(cli, ttl, func() *modelsv1.CellPresence { return presence }, logtest.New(t))
	ctx := t.Context()

	grant, err := cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // part of the lease gone, as after a lapse
	lease, rev, err := p.resume(ctx, grant.ID)
	if err != nil || lease != grant.ID || rev == 0 {
		t.Fatalf("resume of a live lease: lease %x (want %x), revision %d, %v", lease, grant.ID, rev, err)
	}
	left, err := cli.TimeToLive(ctx, grant.ID)
	if err != nil {
		t.Fatal(err)
	}
	if left.TTL < int64(ttl/time.Second)-1 {
		t.Errorf("the lease has %d s left after resume, want about its TTL (%s): resume did not renew it", left.TTL, ttl)
	}
	get, err := cli.Get(ctx, CellKey("cell-r"))
	if err != nil || len(get.Kvs) != 1 || clientv3.LeaseID(get.Kvs[0].Lease) != grant.ID {
		t.Fatalf("the presence key after resume: %v, %v", get, err)
	}

	if _, err := cli.Revoke(ctx, grant.ID); err != nil {
		t.Fatal(err)
	}
	lease, _, err = p.resume(ctx, grant.ID)
	if err != nil || lease != 0 {
		t.Fatalf("resume of a revoked lease: lease %x, %v; want 0 (register anew)", lease, err)
	}
}
