package grpcx

import (
	"context"
	"runtime/debug"

	grpclogging "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// InterceptorLogger adapts an hclog logger to go-grpc-middleware's logging
// interface: slog-style levels map to the nearest hclog level and fields are
// passed on as key/value pairs.
func InterceptorLogger(l hclog.Logger) grpclogging.Logger {
	return grpclogging.LoggerFunc(func(_ context.Context, lvl grpclogging.Level, msg string, fields ...any) {
		switch {
		case lvl >= grpclogging.LevelError:
			l.Error(msg, fields...)
		case lvl >= grpclogging.LevelWarn:
			l.Warn(msg, fields...)
		case lvl >= grpclogging.LevelInfo:
			l.Info(msg, fields...)
		case lvl >= grpclogging.LevelDebug:
			l.Debug(msg, fields...)
		default:
			l.Trace(msg, fields...)
		}
	})
}

// callLevel logs successful calls at debug and failed ones at warn, except calls refused
// because the server sheds load (ResourceExhausted): those are the expected answer under a
// burst, counted and summarised by whoever refuses them, and one line each would add load.
func callLevel(code codes.Code) grpclogging.Level {
	if code == codes.OK || code == codes.ResourceExhausted {
		return grpclogging.LevelDebug
	}
	return grpclogging.LevelWarn
}

// peerFields adds the caller's certificate identity, when there is one.
func peerFields(ctx context.Context) grpclogging.Fields {
	if id, ok := tlsx.PeerIdentity(ctx); ok {
		return grpclogging.Fields{"peer.identity", id}
	}
	return nil
}

// loggingOptions configures the logging interceptors: one line per finished
// call.
func loggingOptions() []grpclogging.Option {
	return []grpclogging.Option{
		grpclogging.WithLogOnEvents(grpclogging.FinishCall),
		grpclogging.WithLevels(callLevel),
		grpclogging.WithFieldsFromContext(peerFields),
	}
}

// recoveryHandler turns a handler panic into codes.Internal, logging the
// panic value and stack.
func recoveryHandler(logger hclog.Logger) recovery.Option {
	return recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		method, _ := grpc.Method(ctx)
		logger.Error("recovered from panic in handler", "grpc.method", method, "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
}

// serverUnaryInterceptors is the start of every server's unary chain.
func serverUnaryInterceptors(logger hclog.Logger) []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{
		grpclogging.UnaryServerInterceptor(InterceptorLogger(logger), loggingOptions()...),
		recovery.UnaryServerInterceptor(recoveryHandler(logger)),
	}
}

// serverStreamInterceptors is the start of every server's stream chain.
func serverStreamInterceptors(logger hclog.Logger) []grpc.StreamServerInterceptor {
	return []grpc.StreamServerInterceptor{
		grpclogging.StreamServerInterceptor(InterceptorLogger(logger), loggingOptions()...),
		recovery.StreamServerInterceptor(recoveryHandler(logger)),
	}
}

// validationError keeps gRPC status errors and makes others InvalidArgument.
func validationError(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

// unaryValidator rejects invalid requests before the handler runs.
func unaryValidator(validate func(req any) error) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := validate(req); err != nil {
			return nil, validationError(err)
		}
		return handler(ctx, req)
	}
}

// streamValidator validates the first message received on each stream.
func streamValidator(validate func(req any) error) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &validatingStream{ServerStream: ss, validate: validate})
	}
}

// validatingStream validates the first message it receives. gRPC forbids
// concurrent RecvMsg calls on one stream, so checked needs no lock.
type validatingStream struct {
	grpc.ServerStream
	validate func(req any) error
	checked  bool
}

// RecvMsg receives m and, if it is the stream's first message, validates it.
func (s *validatingStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.checked {
		return nil
	}
	s.checked = true
	if err := s.validate(m); err != nil {
		return validationError(err)
	}
	return nil
}
