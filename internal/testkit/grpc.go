package testkit

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// Dial returns a plaintext gRPC client connection to addr (a server under test on loopback); it
// fails the test when the connection cannot be set up. The caller closes it.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	return conn
}

// AuctioneerService is the auctioneer's gRPC service name, whose health is SERVING while that
// auctioneer leads.
const AuctioneerService = "gavel.auctioneer.v1.AuctioneerService"

// Serving asks conn's health service (within a second) whether service is SERVING, and says
// what it answered, for a wait's condition.
func Serving(conn grpc.ClientConnInterface, service string) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return false, err.Error()
	}
	return resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, resp.GetStatus().String()
}
