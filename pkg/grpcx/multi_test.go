package grpcx

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

func TestSplitTargets(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{""}, nil},
		{[]string{"a:1"}, []string{"a:1"}},
		{[]string{"a:1,b:2", "", " b:2 , c:3,"}, []string{"a:1", "b:2", "c:3"}},
	} {
		if got := SplitTargets(tc.in...); !slices.Equal(got, tc.want) {
			t.Errorf("SplitTargets(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDialMultiRefusesBadTargets(t *testing.T) {
	if _, err := DialMulti(nil, insecureClient); err == nil {
		t.Error("DialMulti without targets succeeded")
	}
	if _, err := DialMulti([]string{"127.0.0.1:1", "no-port"}, insecureClient); err == nil {
		t.Error("DialMulti with a target without port succeeded")
	}
}

// TestDialMultiFailsOver balances over two servers, stops one and checks that every later call
// reaches the other.
func TestDialMultiFailsOver(t *testing.T) {
	a, b := start(t, insecureServer, nil), start(t, insecureServer, nil)
	conn, err := DialMulti([]string{a.srv.Addr().String() + "," + b.srv.Addr().String()}, insecureClient)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := testContext(t)

	// Both servers serve once both connections are up.
	deadline := time.Now().Add(5 * time.Second)
	for a.handlers.calls.Load() == 0 || b.handlers.calls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("calls not spread: a=%d b=%d", a.handlers.calls.Load(), b.handlers.calls.Load())
		}
		if err := call(ctx, conn, "Echo", ""); err != nil {
			t.Fatalf("Echo with both servers up: %v", err)
		}
	}

	a.stop()
	if err := a.wait(t); err != nil {
		t.Fatalf("server a: %v", err)
	}
	// A call racing the stop may fail; once one succeeds, every call must reach b.
	deadline = time.Now().Add(5 * time.Second)
	for call(ctx, conn, "Echo", "") != nil {
		if time.Now().After(deadline) {
			t.Fatal("no call succeeded after server a stopped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := b.handlers.calls.Load()
	for i := range 20 {
		if err := call(ctx, conn, "Echo", ""); err != nil {
			t.Fatalf("call %d with server a down: %v", i, err)
		}
		if err := callStream(ctx, conn, ""); err != nil {
			t.Fatalf("stream %d with server a down: %v", i, err)
		}
	}
	if got := b.handlers.calls.Load() - before; got != 40 {
		t.Errorf("server b served %d of 40 calls", got)
	}
}

// TestDialMultiSkipsDeadAddress never reaches one of its addresses and still serves every call.
func TestDialMultiSkipsDeadAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	live := start(t, insecureServer, nil)
	conn, err := DialMulti([]string{dead, live.srv.Addr().String()}, insecureClient)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := testContext(t)
	for i := range 20 {
		if err := call(ctx, conn, "Echo", ""); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if got := live.handlers.calls.Load(); got != 20 {
		t.Errorf("live server served %d of 20 calls", got)
	}
}

var insecureServer = ServerConfig{TLS: tlsx.Config{Insecure: true}}
