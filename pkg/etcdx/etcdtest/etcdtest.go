// Package etcdtest starts a throwaway embedded etcd for tests.
package etcdtest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx"
)

// startTimeout bounds how long Start waits for the server.
const startTimeout = 60 * time.Second

// Start runs a single-node etcd with fsync disabled in a fresh temporary
// directory and returns it with a client connected to it. Both are closed
// when the test ends; etcd client errors are logged to t.
func Start(t testing.TB) (*etcdx.Embedded, *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	e, err := etcdx.StartEmbedded(ctx, etcdx.EmbeddedConfig{
		Dir:           t.TempDir(),
		UnsafeNoFsync: true,
		Quiet:         true,
	})
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close embedded etcd: %v", err)
		}
	})

	out := &testWriter{t: t}
	logger := hclog.New(&hclog.LoggerOptions{
		Name:   "etcd-client",
		Output: out,
		Level:  hclog.Error,
	})
	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: e.Endpoints()}, logger)
	if err != nil {
		t.Fatalf("connect to embedded etcd: %v", err)
	}
	// Registered after the server's cleanup, so it runs first.
	t.Cleanup(func() {
		if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("close etcd client: %v", err)
		}
		out.done.Store(true)
	})
	return e, cli
}

// testWriter sends log lines to t until the test is done; logging to t after
// the test has completed would panic.
type testWriter struct {
	t    testing.TB
	done atomic.Bool
}

// Write logs p to t, or drops it once the test is done.
func (w *testWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}
