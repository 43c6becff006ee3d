package etcdx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
)

// contender is one Election running in the background, recording its terms.
type contender struct {
	e      *etcdx.Election
	cancel context.CancelFunc
	done   chan error
	terms  chan struct{} // one send per term started
	ended  chan struct{} // one send per term ended
}

func startContender(t *testing.T, cli *clientv3.Client, id string) *contender {
	t.Helper()
	e, err := etcdx.NewElection(cli, "test-svc", id, 2*time.Second, logtest.New(t).Named(id))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &contender{e: e, cancel: cancel, done: make(chan error, 1), terms: make(chan struct{}, 16), ended: make(chan struct{}, 16)}
	go func() {
		c.done <- e.Run(ctx, func(ctx context.Context) error {
			c.terms <- struct{}{}
			<-ctx.Done()
			c.ended <- struct{}{}
			return ctx.Err()
		})
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

func (c *contender) stop(t *testing.T) {
	t.Helper()
	c.cancel()
	select {
	case err, ok := <-c.done:
		if ok && err != nil {
			t.Errorf("%s: Run returned %v", c.e.ID(), err)
		}
		if ok {
			close(c.done)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("%s: Run did not return", c.e.ID())
	}
}

func waitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// leaders returns the contenders that lead now.
func leaders(cs ...*contender) []*contender {
	var out []*contender
	for _, c := range cs {
		if c.e.IsLeader() {
			out = append(out, c)
		}
	}
	return out
}

// waitOneLeader waits until exactly one contender leads and stays the only one for a while.
func waitOneLeader(t *testing.T, cs ...*contender) *contender {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if l := leaders(cs...); len(l) == 1 {
			time.Sleep(300 * time.Millisecond)
			if again := leaders(cs...); len(again) == 1 && again[0] == l[0] {
				return l[0]
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no single leader: %d lead", len(leaders(cs...)))
	return nil
}

func TestElectionOneLeaderAndHandOverWhenSessionDies(t *testing.T) {
	_, cli := etcdtest.Start(t)
	a := startContender(t, cli, "a")
	b := startContender(t, cli, "b")

	first := waitOneLeader(t, a, b)
	other := b
	if first == b {
		other = a
	}
	waitSignal(t, first.terms, "first term")
	select {
	case <-other.terms:
		t.Fatal("the standby started a term while the leader leads")
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if id, err := first.e.Leader(ctx); err != nil || id != first.e.ID() {
		t.Fatalf("Leader() = %q, %v; want %q", id, err, first.e.ID())
	}

	// Kill the leader's session by revoking the lease its key is attached to.
	resp, err := cli.Get(ctx, etcdx.LockKey("test-svc")+"/", append(clientv3.WithFirstCreate(), clientv3.WithLimit(1))...)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read leader key: %v (%d keys)", err, len(resp.Kvs))
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatalf("revoke leader lease: %v", err)
	}
	waitSignal(t, first.ended, "the old leader's term to end")
	waitSignal(t, other.terms, "the standby to take over")
	if got := waitOneLeader(t, a, b); got != other {
		t.Fatalf("leader after hand-over is %s, want %s", got.e.ID(), other.e.ID())
	}
	if id, err := other.e.Leader(ctx); err != nil || id != other.e.ID() {
		t.Fatalf("Leader() = %q, %v; want %q", id, err, other.e.ID())
	}

	// A clean stop resigns at once, handing leadership back.
	other.stop(t)
	waitSignal(t, first.terms, "the first contender to lead again")
	if got := waitOneLeader(t, a, b); got != first {
		t.Fatalf("leader after stop is %s, want %s", got.e.ID(), first.e.ID())
	}
}

func TestElectionLeadErrorEndsRun(t *testing.T) {
	_, cli := etcdtest.Start(t)
	boom := errors.New("boom")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err := etcdx.RunElection(ctx, cli, "test-err", "x", time.Second, func(context.Context) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want %v", err, boom)
	}
	// Resigned: nobody leads afterwards.
	e, _ := etcdx.NewElection(cli, "test-err", "y", time.Second, nil)
	if id, err := e.Leader(ctx); err != nil || id != "" {
		t.Fatalf("Leader() after failed term = %q, %v; want none", id, err)
	}
}

func TestNewElectionValidates(t *testing.T) {
	_, cli := etcdtest.Start(t)
	for _, tc := range []struct {
		name, service, id string
		ttl               time.Duration
	}{
		{"no service", "", "x", time.Second},
		{"no id", "svc", "", time.Second},
		{"negative ttl", "svc", "x", -time.Second},
	} {
		if _, err := etcdx.NewElection(cli, tc.service, tc.id, tc.ttl, nil); err == nil {
			t.Errorf("%s: NewElection succeeded", tc.name)
		}
	}
	if _, err := etcdx.NewElection(nil, "svc", "x", 0, nil); err == nil {
		t.Error("nil client: NewElection succeeded")
	}
}
