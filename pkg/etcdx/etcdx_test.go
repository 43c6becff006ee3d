package etcdx_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
)

func TestConfigValidate(t *testing.T) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	tests := []struct {
		name    string
		cfg     etcdx.Config
		wantErr string // empty: valid
	}{
		{name: "plaintext", cfg: etcdx.Config{Endpoints: []string{"http://127.0.0.1:2379"}}},
		{name: "bare host port", cfg: etcdx.Config{Endpoints: []string{"10.0.0.1:2379", "10.0.0.2:2379"}}},
		{name: "tls", cfg: etcdx.Config{Endpoints: []string{"https://etcd:2379"}, TLS: tlsCfg}},
		{name: "unix socket", cfg: etcdx.Config{Endpoints: []string{"unix:///run/etcd.sock"}}},
		{name: "auth", cfg: etcdx.Config{Endpoints: []string{"http://etcd:2379"}, Username: "u", Password: "p"}},
		{name: "dial timeout", cfg: etcdx.Config{Endpoints: []string{"http://etcd:2379"}, DialTimeout: time.Second}},
		{name: "no endpoints", cfg: etcdx.Config{}, wantErr: "at least one endpoint"},
		{name: "empty endpoint", cfg: etcdx.Config{Endpoints: []string{""}}, wantErr: "whitespace"},
		{name: "padded endpoint", cfg: etcdx.Config{Endpoints: []string{" http://etcd:2379"}}, wantErr: "whitespace"},
		{name: "bad scheme", cfg: etcdx.Config{Endpoints: []string{"ftp://etcd:2379"}}, wantErr: "unsupported scheme"},
		{name: "missing host", cfg: etcdx.Config{Endpoints: []string{"http://"}}, wantErr: "missing address"},
		{name: "https without tls", cfg: etcdx.Config{Endpoints: []string{"https://etcd:2379"}}, wantErr: "requires TLS"},
		{name: "http with tls", cfg: etcdx.Config{Endpoints: []string{"http://etcd:2379"}, TLS: tlsCfg}, wantErr: "plaintext"},
		{name: "negative timeout", cfg: etcdx.Config{Endpoints: []string{"http://etcd:2379"}, DialTimeout: -time.Second}, wantErr: "negative"},
		{name: "username only", cfg: etcdx.Config{Endpoints: []string{"http://etcd:2379"}, Username: "u"}, wantErr: "together"},
		{name: "password only", cfg: etcdx.Config{Endpoints: []string{"http://etcd:2379"}, Password: "p"}, wantErr: "together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestEmbeddedConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     etcdembed.Config
		wantErr string
	}{
		{name: "minimal", cfg: etcdembed.Config{Dir: "/tmp/x"}},
		{name: "fixed port", cfg: etcdembed.Config{Dir: "/tmp/x", ClientAddr: "127.0.0.1:2379"}},
		{name: "no dir", cfg: etcdembed.Config{}, wantErr: "data dir"},
		{name: "no port", cfg: etcdembed.Config{Dir: "/tmp/x", ClientAddr: "127.0.0.1"}, wantErr: "client addr"},
		{name: "no host", cfg: etcdembed.Config{Dir: "/tmp/x", ClientAddr: ":2379"}, wantErr: "host is required"},
		{name: "bad port", cfg: etcdembed.Config{Dir: "/tmp/x", ClientAddr: "127.0.0.1:http"}, wantErr: "invalid port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestEmbeddedPutGet(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx := testContext(t)

	if _, err := cli.Put(ctx, "/gavel/test/key", "value"); err != nil {
		t.Fatalf("put: %v", err)
	}
	resp, err := cli.Get(ctx, "/gavel/test/key")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "value" {
		t.Fatalf("get = %v, want one kv with value %q", resp.Kvs, "value")
	}
}

func TestEmbeddedTxnOpsLimit(t *testing.T) {
	_, cli := etcdtest.Start(t)
	// etcd limits the longest of a transaction's compare, success and
	// failure lists; each case compares and puts the same number of keys.
	tests := []struct {
		name    string
		keys    int
		wantErr error
	}{
		{name: "100 keys", keys: 100},
		{name: "beyond etcd default", keys: 129},
		{name: "at limit", keys: etcdembed.DefaultMaxTxnOps},
		{name: "over limit", keys: etcdembed.DefaultMaxTxnOps + 1, wantErr: rpctypes.ErrTooManyOps},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			prefix := fmt.Sprintf("/gavel/test/%d/", tt.keys)
			cmps := make([]clientv3.Cmp, 0, tt.keys)
			puts := make([]clientv3.Op, 0, tt.keys)
			for i := range tt.keys {
				key := fmt.Sprintf("%s%04d", prefix, i)
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", 0))
				puts = append(puts, clientv3.OpPut(key, "v"))
			}
			resp, err := cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("txn of %d keys: err = %v, want %v", tt.keys, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("txn of %d keys: %v", tt.keys, err)
			}
			if !resp.Succeeded {
				t.Fatalf("txn of %d keys did not succeed", tt.keys)
			}
			got, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatalf("count keys: %v", err)
			}
			if got.Count != int64(tt.keys) {
				t.Fatalf("count = %d, want %d", got.Count, tt.keys)
			}
		})
	}
}

func TestTwoEmbeddedAtOnce(t *testing.T) {
	e1, c1 := etcdtest.Start(t)
	e2, c2 := etcdtest.Start(t)
	ctx := testContext(t)

	if a, b := e1.Endpoints()[0], e2.Endpoints()[0]; hostPort(t, a) == hostPort(t, b) {
		t.Fatalf("both servers listen on %s", a)
	}
	if _, err := c1.Put(ctx, "k", "one"); err != nil {
		t.Fatalf("put on first: %v", err)
	}
	resp, err := c2.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get on second: %v", err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("second server sees the first's key: %v", resp.Kvs)
	}
}

func TestEmbeddedCloseFreesPort(t *testing.T) {
	e, err := etcdembed.Start(testContext(t), etcdembed.Config{Dir: t.TempDir(), UnsafeNoFsync: true, Quiet: true})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	addr := hostPort(t, e.Endpoints()[0])
	if err := e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("port still taken after close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("close listener: %v", err)
	}
}

func TestEmbeddedTakenClientPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })

	_, err = etcdembed.Start(testContext(t), etcdembed.Config{
		Dir:        t.TempDir(),
		ClientAddr: l.Addr().String(),
		Quiet:      true,
	})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("StartEmbedded on a taken port: err = %v, want address already in use", err)
	}
}

func TestEmbeddedRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	cfg := etcdembed.Config{Dir: dir, UnsafeNoFsync: true, Quiet: true}

	e, err := etcdembed.Start(testContext(t), cfg)
	if err != nil {
		t.Fatalf("first start: %v", err)
	}
	cli := newClient(t, e)
	if _, err := cli.Put(testContext(t), "kept", "yes"); err != nil {
		t.Fatalf("put: %v", err)
	}
	_ = cli.Close()
	if err := e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	// The restart gets new ports; the member's data must survive.
	e, err = etcdembed.Start(testContext(t), cfg)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	cli = newClient(t, e)
	t.Cleanup(func() { _ = cli.Close() })
	resp, err := cli.Get(testContext(t), "kept")
	if err != nil {
		t.Fatalf("get after restart: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "yes" {
		t.Fatalf("get after restart = %v, want value %q", resp.Kvs, "yes")
	}
}

func TestEmbeddedRun(t *testing.T) {
	e, err := etcdembed.New(etcdembed.Config{Dir: t.TempDir(), UnsafeNoFsync: true, Quiet: true})
	if err != nil {
		t.Fatalf("new: %v", err)
	}
	if eps := e.Endpoints(); eps != nil {
		t.Fatalf("endpoints before start = %v, want nil", eps)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, func() { close(ready) }) }()

	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("Run not ready after 60s")
	}
	cli := newClient(t, e)
	if _, err := cli.Put(testContext(t), "k", "v"); err != nil {
		t.Fatalf("put while running: %v", err)
	}
	_ = cli.Close()
	addr := hostPort(t, e.Endpoints()[0])

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30s after cancel")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("port still taken after Run returned: %v", err)
	}
	_ = l.Close()
}

func TestEmbeddedRunStopsOnClose(t *testing.T) {
	e, err := etcdembed.Start(testContext(t), etcdembed.Config{Dir: t.TempDir(), UnsafeNoFsync: true, Quiet: true})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- e.Run(context.Background(), func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after Close = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30s after Close")
	}
}

func TestNewClientUnreachable(t *testing.T) {
	// Start and stop a server so the endpoint is a port nobody listens on.
	e, err := etcdembed.Start(testContext(t), etcdembed.Config{Dir: t.TempDir(), UnsafeNoFsync: true, Quiet: true})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	eps := e.Endpoints()
	if err := e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	const dialTimeout = time.Second
	start := time.Now()
	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: eps, DialTimeout: dialTimeout}, nil)
	elapsed := time.Since(start)
	if err == nil {
		_ = cli.Close()
		t.Fatal("NewClient against a closed endpoint succeeded")
	}
	if !strings.Contains(err.Error(), eps[0]) {
		t.Errorf("error %q does not name the endpoint %s", err, eps[0])
	}
	// Allow some scheduling slack on a loaded machine.
	if elapsed > dialTimeout+500*time.Millisecond {
		t.Errorf("NewClient took %s, want at most about %s", elapsed, dialTimeout)
	}
}

func TestNewClientInvalidConfig(t *testing.T) {
	if _, err := etcdx.NewClient(etcdx.Config{}, nil); err == nil {
		t.Fatal("NewClient with no endpoints succeeded")
	}
}

// testContext returns a context that ends with the test or after 30s.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newClient connects to e; the caller closes the client.
func newClient(t testing.TB, e *etcdembed.Server) *clientv3.Client {
	t.Helper()
	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: e.Endpoints()}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return cli
}

// hostPort returns the host:port of an endpoint URL.
func hostPort(t testing.TB, endpoint string) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		t.Fatalf("endpoint %q is not a URL with a host: %v", endpoint, err)
	}
	return u.Host
}
