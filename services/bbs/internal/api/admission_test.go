package api

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

func TestAdmission(t *testing.T) {
	const method = "/gavel.bbs.v1.BBSService/"
	tests := []struct {
		name     string
		limit    int
		holding  []string // calls in flight, blocked in their handler
		call     string
		wantCode codes.Code
	}{
		{name: "write under the limit", limit: 4, holding: []string{"ClaimActualLRP", "StartActualLRP"}, call: "StartActualLRP", wantCode: codes.OK},
		{name: "write at the limit", limit: 2, holding: []string{"ClaimActualLRP", "StartActualLRP"}, call: "CrashActualLRP", wantCode: codes.ResourceExhausted},
		{name: "read at the limit", limit: 2, holding: []string{"ClaimActualLRP", "StartActualLRP"}, call: "ActualLRPs", wantCode: codes.OK},
		{name: "new work at half the limit", limit: 4, holding: []string{"DesireLRP", "DesireTask"}, call: "UpdateDesiredLRP", wantCode: codes.ResourceExhausted},
		{name: "lifecycle write while new work holds its half", limit: 4, holding: []string{"DesireLRP", "DesireTask"}, call: "ClaimActualLRP", wantCode: codes.OK},
		{name: "unbounded", limit: 0, holding: []string{"ClaimActualLRP", "StartActualLRP"}, call: "StartActualLRP", wantCode: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAdmission(tt.limit, 250*time.Millisecond, logtest.New(t))
			intercept := a.UnaryServerInterceptor()
			release := make(chan struct{})
			var entered, done sync.WaitGroup
			for _, m := range tt.holding {
				entered.Add(1)
				done.Add(1)
				go func() {
					defer done.Done()
					_, err := intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: method + m}, func(context.Context, any) (any, error) {
						entered.Done()
						<-release
						return nil, nil
					})
					if err != nil {
						t.Errorf("holding call %s: %v", m, err)
					}
				}()
			}
			entered.Wait()
			ran := false
			_, err := intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: method + tt.call}, func(context.Context, any) (any, error) {
				ran = true
				return nil, nil
			})
			close(release)
			done.Wait()
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("%s: code %v (%v), want %v", tt.call, got, err, tt.wantCode)
			}
			if tt.wantCode == codes.ResourceExhausted {
				if ran {
					t.Fatal("a refused call reached its handler")
				}
				if d, ok := rpcerr.RetryAfter(err); !ok || d != 250*time.Millisecond {
					t.Fatalf("retry after = %v, %v; want 250ms", d, ok)
				}
				if a.Refused() != 1 {
					t.Fatalf("refused = %d, want 1", a.Refused())
				}
			}
			// Every slot is free again once the calls end.
			if a.inflight.Load() != 0 || a.intake.Load() != 0 {
				t.Fatalf("slots held after the calls ended: %d writes, %d new work", a.inflight.Load(), a.intake.Load())
			}
		})
	}
}
