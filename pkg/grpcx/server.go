// Package grpcx builds Gavel's gRPC servers and clients: mutual TLS from
// tlsx, an interceptor chain (one hclog line per finished call, built only
// when its level is enabled; go-grpc-middleware's panic recovery and
// per-RPC metrics; caller-supplied interceptors; request validation),
// grpc.health.v1, server reflection, keepalives, message size limits and a
// graceful stop that fits lifecycle.Runner.
package grpcx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"

	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/pkg/wire"
)

// Defaults applied to zero-valued configuration fields.
const (
	// DefaultMaxMsgSize is the default limit on received and sent messages.
	DefaultMaxMsgSize = 256 << 20
	// DefaultGracefulStopTimeout bounds how long Run waits for in-flight
	// calls before closing connections.
	DefaultGracefulStopTimeout = 10 * time.Second
	// KeepaliveMinTime is the shortest client keepalive interval the server
	// tolerates; clients pinging more often are disconnected.
	KeepaliveMinTime = 5 * time.Second
	// ReadBufferSize is each connection's read buffer, servers' and clients': one TLS record's
	// plaintext (16 KiB), the most one read of a TLS connection returns, against gRPC's 32 KiB.
	ReadBufferSize = 16 << 10
	// StreamWindowSize and ConnWindowSize are every connection's HTTP/2 flow-control windows,
	// servers' and clients': fixed, so gRPC's dynamic window estimation is off. That estimation
	// sends a PING, answered by the peer, whenever data arrives on a connection with none
	// outstanding, so on a connection with a call every few seconds (a rep's claims and
	// starts, a presence renewal) each call cost a PING and its ack each way: two more frames
	// to read, two more to write, each its own TLS record and system call. The sizes are the
	// estimator's own ceiling for the connection and a quarter of it for one call, so a large
	// list is not slowed on loopback or a LAN (docs/decisions/0059-static-flow-control-windows.md).
	StreamWindowSize = 4 << 20
	// ConnWindowSize: see StreamWindowSize.
	ConnWindowSize = 16 << 20
)

// ServerConfig configures a gRPC server.
type ServerConfig struct {
	// ListenAddress is the TCP address to listen on, e.g. ":8889" or
	// "127.0.0.1:0" for an ephemeral port (see Server.Addr).
	ListenAddress string
	// TLS holds the server's certificate, key and the CA that client
	// certificates must chain to, or Insecure for plaintext.
	TLS tlsx.Config
	// MaxRecvMsgSize is the largest message the server accepts, in bytes;
	// zero means 256 MiB.
	MaxRecvMsgSize int
	// MaxSendMsgSize is the largest message the server sends, in bytes;
	// zero means 256 MiB.
	MaxSendMsgSize int
	// KeepaliveTime is how long a connection may be idle before the server
	// pings the client; zero means the gRPC default (2h).
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long the server waits for a ping ack before
	// closing the connection; zero means the gRPC default (20s).
	KeepaliveTimeout time.Duration
	// GracefulStopTimeout is how long Run waits, once stopping, for
	// in-flight calls to finish before closing connections; zero means 10s.
	GracefulStopTimeout time.Duration
}

// Validate reports whether cfg is usable.
func (c ServerConfig) Validate() error {
	switch {
	case c.ListenAddress == "":
		return errors.New("grpc server config: ListenAddress is required")
	case c.MaxRecvMsgSize < 0:
		return fmt.Errorf("grpc server config: MaxRecvMsgSize %d is negative", c.MaxRecvMsgSize)
	case c.MaxSendMsgSize < 0:
		return fmt.Errorf("grpc server config: MaxSendMsgSize %d is negative", c.MaxSendMsgSize)
	case c.KeepaliveTime < 0:
		return fmt.Errorf("grpc server config: KeepaliveTime %s is negative", c.KeepaliveTime)
	case c.KeepaliveTimeout < 0:
		return fmt.Errorf("grpc server config: KeepaliveTimeout %s is negative", c.KeepaliveTimeout)
	case c.GracefulStopTimeout < 0:
		return fmt.Errorf("grpc server config: GracefulStopTimeout %s is negative", c.GracefulStopTimeout)
	}
	if err := c.TLS.Validate(); err != nil {
		return fmt.Errorf("grpc server config: %w", err)
	}
	return nil
}

// serverOptions collects ServerOption settings.
type serverOptions struct {
	validator   func(req any) error
	unary       []grpc.UnaryServerInterceptor
	stream      []grpc.StreamServerInterceptor
	grpcOptions []grpc.ServerOption
	listener    net.Listener
	metrics     prometheus.Registerer
}

// ServerOption customises NewServer.
type ServerOption func(*serverOptions)

// WithValidator validates every unary request, and the first message
// received on every stream, before the handler sees it. If v returns an
// error that is already a gRPC status error it is returned as is; any other
// error becomes codes.InvalidArgument with the error's text.
func WithValidator(v func(req any) error) ServerOption {
	return func(o *serverOptions) { o.validator = v }
}

// WithUnaryInterceptors appends unary interceptors to the chain. They run
// after logging and recovery and before the validator (the place for
// authentication and authorisation).
func WithUnaryInterceptors(i ...grpc.UnaryServerInterceptor) ServerOption {
	return func(o *serverOptions) { o.unary = append(o.unary, i...) }
}

// WithStreamInterceptors appends stream interceptors to the chain, in the
// same position as WithUnaryInterceptors.
func WithStreamInterceptors(i ...grpc.StreamServerInterceptor) ServerOption {
	return func(o *serverOptions) { o.stream = append(o.stream, i...) }
}

// WithMetrics records per-RPC metrics of the server (started and handled calls by method and
// code, a latency histogram) in reg, together with this process's client metrics.
func WithMetrics(reg prometheus.Registerer) ServerOption {
	return func(o *serverOptions) { o.metrics = reg }
}

// WithServerOptions passes extra options, such as a stats handler, to
// grpc.NewServer. They are applied after the ones NewServer builds.
func WithServerOptions(opts ...grpc.ServerOption) ServerOption {
	return func(o *serverOptions) { o.grpcOptions = append(o.grpcOptions, opts...) }
}

// WithListener makes Run serve l instead of listening on ListenAddress (which then only names
// the address in logs and must still be set). A caller that must know the address before the
// server starts binds the port itself and hands the listener over, rather than picking a free
// port for the server to bind later, which another process may take meanwhile. Run closes l.
func WithListener(l net.Listener) ServerOption {
	return func(o *serverOptions) { o.listener = l }
}

// Server is a gRPC server with health and reflection registered. Register
// services on GRPC before calling Run.
type Server struct {
	// GRPC is the underlying server.
	GRPC *grpc.Server
	// Health is the grpc.health.v1 service. Run marks the server and every
	// registered service SERVING once listening, and NOT_SERVING when
	// stopping.
	Health *health.Server

	cfg      ServerConfig
	logger   hclog.Logger
	listener net.Listener // from WithListener; nil: listen on cfg.ListenAddress
	metrics  *grpcprom.ServerMetrics
	started  atomic.Bool

	mu   sync.Mutex
	addr net.Addr
}

// NewServer validates cfg and builds a server with the interceptor chain
// metrics (WithMetrics) → logging → recovery → WithUnary/StreamInterceptors → validator.
func NewServer(cfg ServerConfig, logger hclog.Logger, opts ...ServerOption) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if cfg.MaxRecvMsgSize == 0 {
		cfg.MaxRecvMsgSize = DefaultMaxMsgSize
	}
	if cfg.MaxSendMsgSize == 0 {
		cfg.MaxSendMsgSize = DefaultMaxMsgSize
	}
	if cfg.GracefulStopTimeout == 0 {
		cfg.GracefulStopTimeout = DefaultGracefulStopTimeout
	}
	var o serverOptions
	for _, opt := range opts {
		opt(&o)
	}
	creds, err := cfg.TLS.ServerCredentials()
	if err != nil {
		return nil, fmt.Errorf("grpc server: %w", err)
	}

	var unary []grpc.UnaryServerInterceptor
	var stream []grpc.StreamServerInterceptor
	var srvMetrics *grpcprom.ServerMetrics
	if o.metrics != nil {
		if srvMetrics, err = newServerMetrics(o.metrics); err != nil {
			return nil, fmt.Errorf("grpc server metrics: %w", err)
		}
		unary = append(unary, srvMetrics.UnaryServerInterceptor())
		stream = append(stream, srvMetrics.StreamServerInterceptor())
	}
	unary = append(append(unary, serverUnaryInterceptors(logger)...), o.unary...)
	stream = append(append(stream, serverStreamInterceptors(logger)...), o.stream...)
	if o.validator != nil {
		unary = append(unary, unaryValidator(o.validator))
		stream = append(stream, streamValidator(o.validator))
	}
	grpcOpts := []grpc.ServerOption{
		grpc.Creds(creds),
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(cfg.MaxSendMsgSize),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		// A connection holds a write buffer only while it writes, and reads through a buffer of
		// one TLS record: a BBS serves one mostly idle connection per cell, and gRPC's 32 KiB
		// buffers each way were 312 MiB at 5,000 cells.
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(ReadBufferSize),
		// Fixed windows: no BDP PING per call on a mostly idle connection (StreamWindowSize).
		grpc.StaticStreamWindowSize(StreamWindowSize),
		grpc.StaticConnWindowSize(ConnWindowSize),
		// Gavel's messages encoded by their generated code (pkg/wire); a WithServerOptions
		// codec, placed after this one, wraps it.
		grpc.ForceServerCodecV2(wire.Codec()),
		// A server span for every call when tracing is on, parented by the caller's W3C trace
		// context (pkg/tracing); the context reaches the handler either way.
		grpc.StatsHandler(serverSpans{otelgrpc.NewServerHandler()}),
	}
	s := &Server{
		GRPC:     grpc.NewServer(append(grpcOpts, o.grpcOptions...)...),
		Health:   health.NewServer(),
		cfg:      cfg,
		logger:   logger,
		listener: o.listener,
	}
	s.Health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s.GRPC, s.Health)
	reflection.Register(s.GRPC)
	s.metrics = srvMetrics
	return s, nil
}

// Run implements lifecycle.Runner. It listens on ListenAddress, marks the
// server SERVING, calls ready and serves until ctx is done. It then marks
// the server NOT_SERVING and stops gracefully, closing connections after
// GracefulStopTimeout if calls are still in flight. It returns nil after a
// stop caused by ctx, and an error if listening or serving fails. Run may be
// called only once.
func (s *Server) Run(ctx context.Context, ready func()) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("grpc server: Run called more than once")
	}
	lis := s.listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", s.cfg.ListenAddress); err != nil {
			return fmt.Errorf("grpc server: listen on %s: %w", s.cfg.ListenAddress, err)
		}
	}
	addr := lis.Addr()
	s.mu.Lock()
	s.addr = addr
	s.mu.Unlock()

	if s.metrics != nil {
		// Every method shows in /metrics from the start, at zero.
		s.metrics.InitializeMetrics(s.GRPC)
	}
	s.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for name := range s.GRPC.GetServiceInfo() {
		s.Health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	served := make(chan error, 1)
	go func() { served <- s.GRPC.Serve(lis) }()
	s.logger.Info("grpc server listening", "address", addr.String(), "tls", !s.cfg.TLS.Insecure)
	ready()

	select {
	case err := <-served:
		s.Health.Shutdown()
		s.GRPC.Stop()
		return fmt.Errorf("grpc server: serve on %s: %w", addr, err)
	case <-ctx.Done():
	}
	s.logger.Info("grpc server stopping", "address", addr.String())
	s.Health.Shutdown()
	s.gracefulStop()
	// Stopped before its goroutine reached Serve, the server answers ErrServerStopped: the stop
	// asked for, not a failure.
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("grpc server: serve on %s: %w", addr, err)
	}
	s.logger.Info("grpc server stopped", "address", addr.String())
	return nil
}

// gracefulStop waits up to GracefulStopTimeout for in-flight calls, then
// closes every connection.
func (s *Server) gracefulStop() {
	done := make(chan struct{})
	go func() {
		s.GRPC.GracefulStop()
		close(done)
	}()
	timer := time.NewTimer(s.cfg.GracefulStopTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		s.logger.Warn("graceful stop timed out, closing connections", "timeout", s.cfg.GracefulStopTimeout)
		s.GRPC.Stop()
		<-done
	}
}

// Addr returns the address the server listens on, or nil before Run has
// started listening.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// serverSpans is otelgrpc's server handler given only the events its spans need: TagRPC starts
// the span and the call's End ends it with the call's status. The others are no-ops in it
// (payloads, trailers) or set the server's own listening address on the span after it started
// (InHeader: server.address and server.port, the same on every span of the process), which
// costs a copy of the span's attributes, an address formatted and parsed, on every server span
// of a traced placement (docs/decisions/0043-compact-trace-context.md).
type serverSpans struct{ stats.Handler }

// HandleRPC passes the call's End to otelgrpc, and nothing else.
func (h serverSpans) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.End); ok {
		h.Handler.HandleRPC(ctx, s)
	}
}
