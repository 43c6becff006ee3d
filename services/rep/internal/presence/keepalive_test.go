package presence

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
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
