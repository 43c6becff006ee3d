package grpcx

import (
	"errors"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// rpcBuckets are the latency buckets of the per-RPC histograms, in seconds: from a cached read
// on loopback (a few hundred µs) to a struggling etcd transaction.
var rpcBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// clientMetrics counts and times every call made by a client of Dial or DialMulti in this
// process (grpc_client_started_total, grpc_client_handled_total{grpc_code},
// grpc_client_handling_seconds, and for long-lived streams the wait for each message,
// grpc_client_msg_recv_handling_seconds). One collector serves the whole process;
// RegisterClientMetrics exposes it in a service's registry.
var clientMetrics = grpcprom.NewClientMetrics(
	grpcprom.WithClientHandlingTimeHistogram(grpcprom.WithHistogramBuckets(rpcBuckets)),
	grpcprom.WithClientStreamRecvHistogram(grpcprom.WithHistogramBuckets(rpcBuckets)),
)

// RegisterClientMetrics adds the per-RPC client metrics of this process to reg. Several
// services in one process (gavel dev, tests) share them: each service's /metrics then shows
// every client call of the process.
func RegisterClientMetrics(reg prometheus.Registerer) error {
	if err := reg.Register(clientMetrics); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			return err
		}
	}
	return nil
}

// newServerMetrics returns the per-RPC server metrics of one server
// (grpc_server_started_total, grpc_server_handled_total{grpc_code},
// grpc_server_handling_seconds), registered in reg.
func newServerMetrics(reg prometheus.Registerer) (*grpcprom.ServerMetrics, error) {
	m := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(rpcBuckets)))
	if err := reg.Register(m); err != nil {
		return nil, err
	}
	if err := RegisterClientMetrics(reg); err != nil {
		return nil, err
	}
	return m, nil
}
