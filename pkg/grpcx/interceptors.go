package grpcx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// callLevel logs successful calls at debug and failed ones at warn, except calls refused
// because the server sheds load (ResourceExhausted): those are the expected answer under a
// burst, counted and summarised by whoever refuses them, and one line each would add load.
func callLevel(code codes.Code) hclog.Level {
	if code == codes.OK || code == codes.ResourceExhausted {
		return hclog.Debug
	}
	return hclog.Warn
}

// logFinished writes one "finished call" line for a call to fullMethod that started at start
// and ended with err, at callLevel of its code. The fields (the names go-grpc-middleware's
// logging interceptor uses) are built only when that level is enabled: at the default info
// level a successful call costs a status lookup and nothing more.
func logFinished(ctx context.Context, l hclog.Logger, fullMethod, methodType string, start time.Time, err error) {
	if errors.Is(err, io.EOF) {
		err = nil
	}
	code := status.Code(err)
	level := callLevel(code)
	if l.GetLevel() > level {
		return
	}
	service, method := splitMethod(fullMethod)
	fields := make([]any, 0, 24)
	fields = append(fields, "protocol", "grpc", "grpc.component", "server",
		"grpc.service", service, "grpc.method", method, "grpc.method_type", methodType)
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		fields = append(fields, "peer.address", p.Addr.String())
	}
	if id, ok := tlsx.PeerIdentity(ctx); ok {
		fields = append(fields, "peer.identity", id)
	}
	if id := tracing.TraceID(ctx); id != "" {
		fields = append(fields, "trace_id", id)
	}
	fields = append(fields, "grpc.start_time", start.Format(time.RFC3339))
	if d, ok := ctx.Deadline(); ok {
		fields = append(fields, "grpc.request.deadline", d.Format(time.RFC3339))
	}
	fields = append(fields, "grpc.code", code.String())
	if err != nil {
		fields = append(fields, "grpc.error", err.Error())
	}
	fields = append(fields, "grpc.time_ms", fmt.Sprintf("%.3f", float64(time.Since(start))/float64(time.Millisecond)))
	l.Log(level, "finished call", fields...)
}

// splitMethod splits "/pkg.Service/Method" into its service and method.
func splitMethod(fullMethod string) (service, method string) {
	fullMethod = strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(fullMethod, '/'); i >= 0 {
		return fullMethod[:i], fullMethod[i+1:]
	}
	return "unknown", fullMethod
}

// unaryCallLogger logs every finished unary call (logFinished).
func unaryCallLogger(l hclog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		logFinished(ctx, l, info.FullMethod, "unary", start, err)
		return resp, err
	}
}

// streamCallLogger logs every finished stream (logFinished).
func streamCallLogger(l hclog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		methodType := "bidi_stream"
		switch {
		case info.IsClientStream && !info.IsServerStream:
			methodType = "client_stream"
		case info.IsServerStream && !info.IsClientStream:
			methodType = "server_stream"
		}
		logFinished(ss.Context(), l, info.FullMethod, methodType, start, err)
		return err
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
		unaryCallLogger(logger),
		recovery.UnaryServerInterceptor(recoveryHandler(logger)),
	}
}

// serverStreamInterceptors is the start of every server's stream chain.
func serverStreamInterceptors(logger hclog.Logger) []grpc.StreamServerInterceptor {
	return []grpc.StreamServerInterceptor{
		streamCallLogger(logger),
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
