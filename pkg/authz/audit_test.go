package authz_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/authz"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// TestInfrastructureCallsAreNotAudited serves a rep API (every call unimplemented) behind the
// authorizer over mutual TLS on loopback: a health check, a health watch and a reflection
// listing by an identity without a role pass and write nothing to the audit log, while admin's
// mutating call and read-only's refused one are written, each with its role.
func TestInfrastructureCallsAreNotAudited(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "rep", "admin", "read-only", "stranger")
	if err != nil {
		t.Fatal(err)
	}
	policy := authz.Methods{
		Service: repv1.RepService_ServiceDesc.ServiceName,
		Reads:   []string{"State"},
		Grants:  map[string][]string{authz.Auctioneer: {"Perform"}},
	}
	dial, stop, audit := serveAudited(t, pki, policy, repv1.UnimplementedRepServiceServer{})
	callCtx, callCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer callCancel()

	// gRPC's own services, by an identity with no role: allowed, not audited.
	stranger := dial("stranger")
	if resp, err := healthpb.NewHealthClient(stranger).Check(callCtx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check: %v %v", resp, err)
	}
	watch, err := healthpb.NewHealthClient(stranger).Watch(callCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health watch: %v", err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("health watch: %v", err)
	}
	refl, err := reflectionv1.NewServerReflectionClient(stranger).ServerReflectionInfo(callCtx)
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	if err := refl.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatalf("reflection send: %v", err)
	}
	if resp, err := refl.Recv(); err != nil || len(resp.GetListServicesResponse().GetService()) == 0 {
		t.Fatalf("reflection list: %v %v", resp, err)
	}
	if err := refl.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := refl.Recv(); err == nil {
		t.Fatal("reflection: the stream did not end")
	}

	// The rep's API: admin's mutating call is audited, read-only's is refused and logged as
	// such, and a read is not audited.
	if _, err := repv1.NewRepServiceClient(dial("admin")).Evacuate(callCtx, &repv1.EvacuateRequest{}); err == nil {
		t.Fatal("Evacuate on an unimplemented server succeeded")
	}
	readOnly := repv1.NewRepServiceClient(dial("read-only"))
	if _, err := readOnly.Perform(callCtx, &repv1.PerformRequest{}); err == nil {
		t.Fatal("read-only may not Perform")
	}
	if _, err := readOnly.State(callCtx, &repv1.StateRequest{}); err == nil {
		t.Fatal("State on an unimplemented server succeeded")
	}
	// The watch's handler ends (and would be recorded) only once the stream is cancelled and
	// the server has stopped; stop it here, before reading the log.
	callCancel()
	log := stoppedLog(t, stop, audit,
		"audit: identity=spiffe://gavel/admin role=admin call=/gavel.rep.v1.RepService/Evacuate code=Unimplemented",
		"refused: identity=spiffe://gavel/read-only role=read-only call=/gavel.rep.v1.RepService/Perform",
	)
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if strings.Contains(line, "call=/grpc.") || strings.Contains(line, `role=""`) || strings.Contains(line, "/State") {
			t.Errorf("audited a health, reflection or read call: %s", line)
		}
	}
	if got := strings.Count(log, "audit: identity="); got != 1 {
		t.Errorf("%d audit entries, want 1 (admin's Evacuate):\n%s", got, log)
	}
}

// TestRoutineCallsAreAuditedOnlyWhenTheyFail serves a rep API whose Perform succeeds, fails
// and is shed in turn, with Perform quiet for the auctioneer (Methods.Quiet), over mutual TLS
// on loopback: the auctioneer's Perform that succeeds, and the one shed for load, write no
// audit line; the one that fails is written, and admin's Perform, the same call by a role for
// which it is not routine, is written too.
func TestRoutineCallsAreAuditedOnlyWhenTheyFail(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "rep", "admin", "auctioneer")
	if err != nil {
		t.Fatal(err)
	}
	policy := authz.Methods{
		Service: repv1.RepService_ServiceDesc.ServiceName,
		Reads:   []string{"State"},
		Grants:  map[string][]string{authz.Auctioneer: {"Perform"}},
		Quiet:   map[string][]string{authz.Auctioneer: {"Perform"}},
	}
	dial, stop, audit := serveAudited(t, pki, policy, &performer{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	auctioneer := repv1.NewRepServiceClient(dial("auctioneer"))
	if _, err := auctioneer.Perform(ctx, &repv1.PerformRequest{}); err != nil {
		t.Fatalf("the auctioneer's first Perform: %v", err)
	}
	if _, err := auctioneer.Perform(ctx, &repv1.PerformRequest{}); status.Code(err) != codes.Internal {
		t.Fatalf("the auctioneer's second Perform: %v, want Internal", err)
	}
	if _, err := auctioneer.Perform(ctx, &repv1.PerformRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the auctioneer's third Perform: %v, want ResourceExhausted", err)
	}
	if _, err := repv1.NewRepServiceClient(dial("admin")).Perform(ctx, &repv1.PerformRequest{}); err != nil {
		t.Fatalf("admin's Perform: %v", err)
	}
	log := stoppedLog(t, stop, audit,
		"audit: identity=spiffe://gavel/auctioneer role=auctioneer call=/gavel.rep.v1.RepService/Perform code=Internal",
		"audit: identity=spiffe://gavel/admin role=admin call=/gavel.rep.v1.RepService/Perform code=OK",
	)
	if got := strings.Count(log, "audit: identity="); got != 2 {
		t.Errorf("%d audit entries, want 2 (the auctioneer's failed Perform, admin's):\n%s", got, log)
	}
}

// performer is a rep API whose Perform succeeds, fails and is shed in turn.
type performer struct {
	repv1.UnimplementedRepServiceServer
	calls atomic.Int64
}

func (p *performer) Perform(context.Context, *repv1.PerformRequest) (*repv1.PerformResponse, error) {
	switch p.calls.Add(1) % 3 {
	case 2:
		return nil, status.Error(codes.Internal, "every second Perform of three fails")
	case 0:
		return nil, status.Error(codes.ResourceExhausted, "every third Perform is shed")
	}
	return &repv1.PerformResponse{}, nil
}

// stoppedLog stops the server (so every call has been recorded), checks that the audit log
// holds each of wants, and returns the log.
func stoppedLog(t *testing.T, stop func() error, audit *lockedBuffer, wants ...string) string {
	t.Helper()
	if err := stop(); err != nil {
		t.Errorf("server: %v", err)
	}
	log := audit.String()
	for _, want := range wants {
		if !strings.Contains(log, want) {
			t.Errorf("the audit log lacks %q:\n%s", want, log)
		}
	}
	return log
}

// serveAudited serves impl as the rep API on loopback over mutual TLS with pki["rep"], behind
// an authorizer of policy whose audit lines go to the returned buffer. It returns a dialer of
// the identities of pki and the server's stop (idempotent; also run at cleanup).
func serveAudited(t *testing.T, pki map[string]tlsx.Config, policy authz.Policy, impl repv1.RepServiceServer) (func(name string) *grpc.ClientConn, func() error, *lockedBuffer) {
	t.Helper()
	audit := &lockedBuffer{}
	a := authz.New(authz.Default(), policy, hclog.New(&hclog.LoggerOptions{Name: "audit", Level: hclog.Info, Output: audit}))
	srv, err := grpcx.NewServer(grpcx.ServerConfig{ListenAddress: "127.0.0.1:0", TLS: pki["rep"]}, hclog.NewNullLogger(),
		grpcx.WithUnaryInterceptors(a.Unary()), grpcx.WithStreamInterceptors(a.Stream()))
	if err != nil {
		t.Fatal(err)
	}
	repv1.RegisterRepServiceServer(srv.GRPC, impl)
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- srv.Run(ctx, func() { close(ready) }) }()
	stop := sync.OnceValue(func() error { cancel(); return <-done })
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("server: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("server: %v", err)
	}
	dial := func(name string) *grpc.ClientConn {
		conn, err := grpcx.Dial(srv.Addr().String(), grpcx.ClientConfig{TLS: pki[name]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	return dial, stop, audit
}

func TestInfrastructure(t *testing.T) {
	for method, want := range map[string]bool{
		"/grpc.health.v1.Health/Check":                                   true,
		"/grpc.health.v1.Health/Watch":                                   true,
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      true,
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": true,
		"/grpc.testing.TestService/EmptyCall":                            false,
		"/gavel.rep.v1.RepService/Evacuate":                              false,
	} {
		if got := authz.Infrastructure(method); got != want {
			t.Errorf("Infrastructure(%s) = %v, want %v", method, got, want)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for the logger's and the test's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
