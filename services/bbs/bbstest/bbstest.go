// Package bbstest runs a real BBS for tests: an embedded etcd, the BBS service on a loopback
// port, and a gRPC client connected to it.
package bbstest

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// Env is a running BBS with its etcd.
type Env struct {
	// Client talks to the BBS over gRPC.
	Client bbsv1.BBSServiceClient
	// Etcd is a client of the BBS's etcd, for direct inspection and fault injection.
	Etcd *clientv3.Client
	// Addr is the BBS's gRPC address.
	Addr string
	// Service is the running BBS.
	Service *bbs.Service
	// Config is the configuration the BBS runs with.
	Config bbs.Config

	running *testkit.Running
}

// Stop stops the BBS before the test ends (to restart another over the same etcd) and returns
// its Run error.
func (e *Env) Stop() error { return e.running.Stop() }

// Start runs a BBS over a fresh embedded etcd for the duration of the test. configure, when
// given, adjusts the configuration first. The BBS runs no convergence loop (instances claimed
// on unregistered cells would otherwise be unclaimed by it); tests drive convergence through
// Service.Converger, or use StartWith without bbs.WithManualConvergence for the leader loop.
func Start(t testing.TB, configure ...func(*bbs.Config)) *Env {
	t.Helper()
	_, cli := etcdtest.Start(t)
	return StartOn(t, cli, configure...)
}

// StartWith runs a BBS over a fresh embedded etcd with exactly the given service options (e.g.
// bbs.WithClock, bbs.WithManualConvergence); without WithManualConvergence it campaigns for
// leadership and converges like a deployed BBS.
func StartWith(t testing.TB, opts []bbs.Option, configure ...func(*bbs.Config)) *Env {
	t.Helper()
	_, cli := etcdtest.Start(t)
	return StartOnWith(t, cli, opts, configure...)
}

// StartOn runs a BBS over an existing etcd client (several BBS instances may share one etcd),
// without a convergence loop, as Start.
func StartOn(t testing.TB, cli *clientv3.Client, configure ...func(*bbs.Config)) *Env {
	t.Helper()
	return StartOnWith(t, cli, []bbs.Option{bbs.WithManualConvergence()}, configure...)
}

// StartOnWith is StartOn with exactly the given service options (see StartWith).
func StartOnWith(t testing.TB, cli *clientv3.Client, opts []bbs.Option, configure ...func(*bbs.Config)) *Env {
	t.Helper()
	cfg := bbs.Default()
	cfg.ListenAddress = "127.0.0.1:0"
	cfg.TLS = tlsx.Config{Insecure: true}
	cfg.EtcdTLS = tlsx.Config{Insecure: true}
	cfg.BookmarkInterval = bbs.Duration(200 * time.Millisecond)
	for _, f := range configure {
		f(&cfg)
	}
	logger := logtest.New(t)
	svc, err := bbs.New(cfg, logger, cli, opts...)
	if err != nil {
		t.Fatalf("new bbs: %v", err)
	}
	running := testkit.Start(t, "bbs", svc)
	conn, err := bbsclient.Dial(bbsclient.Config{BBSAddress: svc.Addr().String(), BBSTLS: tlsx.Config{Insecure: true}})
	if err != nil {
		t.Fatalf("dial bbs: %v", err)
	}
	t.Cleanup(func() { conn.Close() }) // before Start's cleanup stops the BBS
	return &Env{Client: bbsv1.NewBBSServiceClient(conn), Etcd: cli, Addr: svc.Addr().String(), Service: svc, Config: cfg, running: running}
}

// CellKey is the etcd key of a cell's presence, for tests that register a cell without a rep.
func CellKey(cellID string) string { return store.CellKey(cellID) }
