package testkit

import (
	"testing"

	"google.golang.org/grpc"

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
