// Package etcdtest starts a throwaway embedded etcd for tests.
package etcdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	"github.com/gavel-sched/gavel/pkg/logging"
)

// startTimeout bounds how long Start waits for the server.
const startTimeout = 60 * time.Second

// Start runs a single-node etcd with fsync disabled and fast elections in a fresh temporary
// directory and returns it with a client connected to it. Both are closed
// when the test ends; etcd client errors are logged to t. Each configure, if
// any, may change the server's configuration before it starts.
func Start(t testing.TB, configure ...func(*etcdembed.Config)) (*etcdembed.Server, *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cfg := etcdembed.Config{
		Dir:           t.TempDir(),
		UnsafeNoFsync: true,
		Quiet:         true,
		FastElection:  true,
	}
	for _, c := range configure {
		c(&cfg)
	}
	e, err := etcdembed.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close embedded etcd: %v", err)
		}
	})

	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: e.Endpoints()}, logging.NewTest(t).Named("etcd-client"))
	if err != nil {
		t.Fatalf("connect to embedded etcd: %v", err)
	}
	// Registered after the server's cleanup, so it runs first.
	t.Cleanup(func() {
		if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("close etcd client: %v", err)
		}
	})
	return e, cli
}
