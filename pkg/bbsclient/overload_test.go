package bbsclient

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// refusingServer serves grpc.health.v1 on loopback and answers the first refuse calls with
// answer instead; calls counts every call that reached it.
func refusingServer(t *testing.T, refuse int64, answer error) (addr string, calls *atomic.Int64) {
	t.Helper()
	calls = new(atomic.Int64)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if calls.Add(1) <= refuse {
			return nil, answer
		}
		return handler(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return l.Addr().String(), calls
}

// TestRetryOverloaded drives a BBS connection (Dial) against a server that refuses some calls:
// refusals that name a wait are sent again, within the attempts and the deadline; every other
// answer reaches the caller as it is, after one call.
func TestRetryOverloaded(t *testing.T) {
	overloaded := rpcerr.Overloaded(time.Millisecond, "busy")
	for _, tc := range []struct {
		name      string
		refuse    int64
		answer    error
		timeout   time.Duration // the call's context
		wantCalls int64
		wantCode  codes.Code
		retried   int64 // refusals counted as retried
		returned  int64 // refusals counted as returned
	}{
		{"served after two refusals", 2, overloaded, 10 * time.Second, 3, codes.OK, 2, 0},
		{"refused every time", 1000, overloaded, 10 * time.Second, OverloadAttempts, codes.ResourceExhausted, OverloadAttempts - 1, 1},
		{"wait past the deadline", 1000, rpcerr.Overloaded(time.Hour, "busy"), 10 * time.Second, 1, codes.ResourceExhausted, 0, 1},
		{"exhausted without a retry-after", 1, status.Error(codes.ResourceExhausted, "quota"), 10 * time.Second, 1, codes.ResourceExhausted, 0, 0},
		{"unavailable", 1, status.Error(codes.Unavailable, "down"), 10 * time.Second, 1, codes.Unavailable, 0, 0},
		{"permission denied", 1, status.Error(codes.PermissionDenied, "no"), 10 * time.Second, 1, codes.PermissionDenied, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, calls := refusingServer(t, tc.refuse, tc.answer)
			conn, err := Dial(Config{BBSAddress: addr, BBSTLS: tlsx.Config{Insecure: true}})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			retriedBefore, returnedBefore := Refusals("Check", OutcomeRetried), Refusals("Check", OutcomeReturned)

			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if status.Code(err) != tc.wantCode {
				t.Fatalf("Check = %v, want code %s", err, tc.wantCode)
			}
			if got := calls.Load(); got != tc.wantCalls {
				t.Errorf("server saw %d calls, want %d", got, tc.wantCalls)
			}
			if got := Refusals("Check", OutcomeRetried) - retriedBefore; got != tc.retried {
				t.Errorf("retried refusals +%d, want +%d", got, tc.retried)
			}
			if got := Refusals("Check", OutcomeReturned) - returnedBefore; got != tc.returned {
				t.Errorf("returned refusals +%d, want +%d", got, tc.returned)
			}
		})
	}
}

// TestRetryOverloadedEndsWithTheContext: a caller that gives up while waiting gets the refusal
// back, and the call is not sent again.
func TestRetryOverloadedEndsWithTheContext(t *testing.T) {
	addr, calls := refusingServer(t, 1000, rpcerr.Overloaded(time.Hour, "busy"))
	conn, err := Dial(Config{BBSAddress: addr, BBSTLS: tlsx.Config{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	waiting := Refusals("Check", OutcomeRetried)
	go func() {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		done <- err
	}()
	// Cancel once the interceptor has the refusal and waits out its hour, not before (the
	// call would then end Canceled, never having been refused).
	for Refusals("Check", OutcomeRetried) == waiting {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Check = %v, want the refusal", err)
	}
	if got := calls.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1", got)
	}
}
