package grpcx

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"

	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/pkg/wire"
)

// clientSpan is otelgrpc's filter for client spans (tracing.ClientSpan).
func clientSpan(info *stats.RPCTagInfo) bool { return tracing.ClientSpan(info.FullMethodName) }

// ClientConfig configures a gRPC client connection.
type ClientConfig struct {
	// TLS holds the client's certificate, key and the CA the server's
	// certificate must chain to, or Insecure for plaintext.
	TLS tlsx.Config
	// MaxRecvMsgSize is the largest message the client accepts, in bytes;
	// zero means 256 MiB.
	MaxRecvMsgSize int
	// MaxSendMsgSize is the largest message the client sends, in bytes;
	// zero means 256 MiB.
	MaxSendMsgSize int
	// KeepaliveTime is how long the connection may be idle before the client
	// pings the server (also when no call is active); zero disables client
	// pings. gRPC raises values below 10s to 10s.
	KeepaliveTime time.Duration
}

// Validate reports whether cfg is usable.
func (c ClientConfig) Validate() error {
	switch {
	case c.MaxRecvMsgSize < 0:
		return fmt.Errorf("grpc client config: MaxRecvMsgSize %d is negative", c.MaxRecvMsgSize)
	case c.MaxSendMsgSize < 0:
		return fmt.Errorf("grpc client config: MaxSendMsgSize %d is negative", c.MaxSendMsgSize)
	case c.KeepaliveTime < 0:
		return errors.New("grpc client config: KeepaliveTime is negative")
	}
	if err := c.TLS.Validate(); err != nil {
		return fmt.Errorf("grpc client config: %w", err)
	}
	return nil
}

// Dial validates cfg and creates a client connection to target with
// grpc.NewClient, using cfg's transport credentials, keepalive and message
// size limits, records per-RPC client metrics (see RegisterClientMetrics) and carries trace
// context (otelgrpc; see pkg/tracing); opts are
// applied after those. As with grpc.NewClient, no
// connection is made until the first call.
func Dial(target string, cfg ClientConfig, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("grpc dial %s: %w", target, err)
	}
	creds, err := cfg.TLS.ClientCredentials()
	if err != nil {
		return nil, fmt.Errorf("grpc dial %s: %w", target, err)
	}
	recv, send := cfg.MaxRecvMsgSize, cfg.MaxSendMsgSize
	if recv == 0 {
		recv = DefaultMaxMsgSize
	}
	if send == 0 {
		send = DefaultMaxMsgSize
	}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Gavel's messages encoded by their generated code (pkg/wire).
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(recv), grpc.MaxCallSendMsgSize(send), grpc.ForceCodecV2(wire.Codec())),
		grpc.WithChainUnaryInterceptor(clientMetrics.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(clientMetrics.StreamClientInterceptor()),
		// W3C trace context out on every call, and a client span when tracing is on, except for
		// the calls recorded by their server span alone (tracing.ClientSpan).
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithFilter(clientSpan))),
		// A connection holds a write buffer only while it writes, and reads through a buffer of
		// one TLS record: the auctioneer keeps a mostly idle connection to every cell's rep (as
		// NewServer's servers do for their callers).
		grpc.WithSharedWriteBuffer(true),
		grpc.WithReadBufferSize(ReadBufferSize),
	}
	dialOpts = append(dialOpts, StaticWindows()...)
	if cfg.KeepaliveTime > 0 {
		dialOpts = append(dialOpts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                cfg.KeepaliveTime,
			PermitWithoutStream: true,
		}))
	}
	conn, err := grpc.NewClient(target, append(dialOpts, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("grpc dial %s: %w", target, err)
	}
	return conn, nil
}

// StaticWindows are the dial options that fix a client connection's flow-control windows at
// StreamWindowSize and ConnWindowSize, turning off gRPC's per-call BDP PING (see
// StreamWindowSize). Dial applies them; a client built outside Dial (the etcd client) adds them.
func StaticWindows() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithStaticStreamWindowSize(StreamWindowSize),
		grpc.WithStaticConnWindowSize(ConnWindowSize),
	}
}
