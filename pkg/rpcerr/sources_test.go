package rpcerr_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// TestErrorSources maps an error from every source a handler can see — Gavel's domain errors,
// Gavel's own statuses, the context, the etcd client (constants and errors returned by a real
// etcd) and peers' transport statuses — and checks that etcd's and peers' codes never reach a
// client as if they were Gavel's.
func TestErrorSources(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx := context.Background()
	// A real etcd: an expired (here revoked) lease, and enabling auth with no root user.
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	_, expiredLease := cli.KeepAliveOnce(ctx, lease.ID)
	_, authNoRoot := cli.AuthEnable(ctx)
	if expiredLease == nil || authNoRoot == nil {
		t.Fatalf("etcd did not fail: lease %v, auth %v", expiredLease, authNoRoot)
	}
	peerDown := status.Error(codes.Unavailable, "connection refused")
	peerNotFound := status.Error(codes.NotFound, "instance not found")

	tests := []struct {
		name    string
		err     error
		code    codes.Code
		backend bool // a storage or transport failure whose cause is logged
	}{
		// Domain errors, bare and wrapped, win over anything else in the chain.
		{"domain not found", fmt.Errorf("claim: %w", rpcerr.NotFound("actual lrp web/0")), codes.NotFound, false},
		{"domain exists", rpcerr.AlreadyExists("web"), codes.AlreadyExists, false},
		{"domain precondition", rpcerr.FailedPrecondition("x"), codes.FailedPrecondition, false},
		{"domain aborted", rpcerr.Aborted("x"), codes.Aborted, false},
		{"domain unavailable", rpcerr.Unavailable("x"), codes.Unavailable, false},
		{"domain invalid", rpcerr.Invalid("f", "bad"), codes.InvalidArgument, false},
		{"domain over etcd cause", errors.Join(rpcerr.NotFound("lrp"), rpctypes.ErrLeaseNotFound), codes.NotFound, false},
		{"compacted", fmt.Errorf("watch: %w", rpctypes.ErrCompacted), codes.OutOfRange, false},
		// Gavel's own statuses (authorization, validation) keep their code.
		{"gavel status", status.Error(codes.PermissionDenied, "rep of cell c1 may not"), codes.PermissionDenied, false},
		// The context.
		{"deadline", fmt.Errorf("txn: %w", context.DeadlineExceeded), codes.DeadlineExceeded, false},
		{"canceled", context.Canceled, codes.Canceled, false},
		// etcd, from a real server.
		{"etcd expired lease", fmt.Errorf("keepalive: %w", expiredLease), codes.Internal, true},
		{"etcd expired lease bare", expiredLease, codes.Internal, true},
		{"etcd auth without root", fmt.Errorf("auth: %w", authNoRoot), codes.Internal, true},
		// etcd, the client's constants and the raw statuses.
		{"etcd lease not found status", rpctypes.ErrGRPCLeaseNotFound, codes.Internal, true},
		{"etcd permission denied", fmt.Errorf("put: %w", rpctypes.ErrPermissionDenied), codes.Internal, true},
		{"etcd permission denied status", rpctypes.ErrGRPCPermissionDenied, codes.Internal, true},
		{"etcd failed precondition", fmt.Errorf("grant: %w", rpctypes.ErrGRPCLeaseExist), codes.Internal, true},
		{"etcd no leader", fmt.Errorf("txn: %w", rpctypes.ErrNoLeader), codes.Unavailable, true},
		{"etcd timeout", rpctypes.ErrGRPCTimeout, codes.Unavailable, true},
		{"etcd too many requests", fmt.Errorf("txn: %w", rpctypes.ErrTooManyRequests), codes.Unavailable, true},
		// Peers (auctioneer, reps) over gRPC.
		{"peer unavailable", fmt.Errorf("stop on cell c1: %w", peerDown), codes.Unavailable, true},
		{"peer not found", fmt.Errorf("stop on cell c1: %w", peerNotFound), codes.Internal, true},
		// Anything else.
		{"plain", errors.New("boom"), codes.Internal, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rpcerr.Code(tt.err); got != tt.code {
				t.Fatalf("Code(%v) = %v, want %v", tt.err, got, tt.code)
			}
			if got := status.Code(rpcerr.ToStatus(tt.err)); got != tt.code {
				t.Fatalf("ToStatus(%v) code = %v, want %v", tt.err, got, tt.code)
			}
			if got := rpcerr.IsBackendFailure(tt.err); got != tt.backend {
				t.Fatalf("IsBackendFailure(%v) = %v, want %v", tt.err, got, tt.backend)
			}
		})
	}
}

// TestInterceptorLogsBackendCause checks the interceptor logs the cause of a storage failure
// and answers with Gavel's code.
func TestInterceptorLogsBackendCause(t *testing.T) {
	var logged strings.Builder
	log := hclogTo(&logged)
	ic := rpcerr.UnaryServerInterceptor(rpcerr.WithLogger(log))
	_, err := ic(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/gavel.bbs.v1.BBSService/DesireLRP"},
		func(context.Context, any) (any, error) {
			return nil, fmt.Errorf("desire web: %w", rpctypes.ErrLeaseNotFound)
		})
	if status.Code(err) != codes.Internal {
		t.Fatalf("code %v, want Internal", status.Code(err))
	}
	if !strings.Contains(logged.String(), "requested lease not found") || !strings.Contains(logged.String(), "DesireLRP") {
		t.Fatalf("cause not logged: %q", logged.String())
	}
}

func hclogTo(w *strings.Builder) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: w, Level: hclog.Debug})
}
