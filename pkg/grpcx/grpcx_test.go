package grpcx

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// testService is a hand-written service whose methods take health check
// requests, so the tests need no generated code of their own.
const testService = "gavel.grpcx.test.Test"

// testHandlers implements testService and counts the calls that reach it.
type testHandlers struct {
	calls   atomic.Int32
	release chan struct{} // Slow returns when this is closed
}

func (h *testHandlers) echo(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.calls.Add(1)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *testHandlers) panic(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.calls.Add(1)
	panic("handler exploded")
}

func (h *testHandlers) slow(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.calls.Add(1)
	select {
	case <-h.release:
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// stream receives one request and answers it; Service "panic" panics.
func (h *testHandlers) stream(_ any, ss grpc.ServerStream) error {
	var req healthpb.HealthCheckRequest
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	h.calls.Add(1)
	if req.Service == "panic" {
		panic("stream exploded")
	}
	return ss.SendMsg(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// unaryMethod adapts fn to a grpc.MethodDesc that honours the interceptor chain.
func unaryMethod(name string, fn func(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error)) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := new(healthpb.HealthCheckRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			call := func(ctx context.Context, req any) (any, error) {
				return fn(ctx, req.(*healthpb.HealthCheckRequest))
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + testService + "/" + name}
			return interceptor(ctx, req, info, call)
		},
	}
}

var streamDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true}

func (h *testHandlers) register(s *grpc.Server) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: testService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			unaryMethod("Echo", h.echo),
			unaryMethod("Panic", h.panic),
			unaryMethod("Slow", h.slow),
		},
		Streams: []grpc.StreamDesc{{
			StreamName:    streamDesc.StreamName,
			ServerStreams: true,
			Handler:       h.stream,
		}},
	}, h)
}

// call invokes a unary test method.
func call(ctx context.Context, conn *grpc.ClientConn, method, service string) error {
	return conn.Invoke(ctx, "/"+testService+"/"+method, &healthpb.HealthCheckRequest{Service: service}, new(healthpb.HealthCheckResponse))
}

// callStream sends one request on the test stream and reads the answer.
func callStream(ctx context.Context, conn *grpc.ClientConn, service string) error {
	cs, err := conn.NewStream(ctx, &streamDesc, "/"+testService+"/Stream")
	if err != nil {
		return err
	}
	if err := cs.SendMsg(&healthpb.HealthCheckRequest{Service: service}); err != nil {
		return err
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	return cs.RecvMsg(new(healthpb.HealthCheckResponse))
}

// running is a started test server.
type running struct {
	srv      *Server
	handlers *testHandlers
	stop     context.CancelFunc
	done     chan struct{} // closed when Run has returned
	err      error         // Run's result, once done is closed
}

// wait returns Run's result, failing the test if it takes too long.
func (r *running) wait(t testing.TB) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

// start runs a server on 127.0.0.1:0 with the test service and waits for ready.
func start(t testing.TB, cfg ServerConfig, logger hclog.Logger, opts ...ServerOption) *running {
	t.Helper()
	cfg.ListenAddress = "127.0.0.1:0"
	if logger == nil {
		logger = logtest.New(t)
	}
	srv, err := NewServer(cfg, logger, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if srv.Addr() != nil {
		t.Error("Addr() before Run should be nil")
	}
	h := &testHandlers{release: make(chan struct{})}
	h.register(srv.GRPC)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: srv, handlers: h, stop: cancel, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(r.done)
		r.err = srv.Run(ctx, func() { close(ready) })
	}()
	select {
	case <-ready:
	case <-r.done:
		t.Fatalf("Run returned before ready: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("server not ready")
	}
	t.Cleanup(func() {
		cancel()
		r.wait(t)
	})
	return r
}

// dial connects to r with cfg and closes the connection when the test ends.
func dial(t testing.TB, r *running, cfg ClientConfig, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := Dial(r.srv.Addr().String(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var insecureClient = ClientConfig{TLS: tlsx.Config{Insecure: true}}

func TestConfigValidate(t *testing.T) {
	ok := tlsx.Config{Insecure: true}
	tests := []struct {
		name    string
		err     error
		wantErr string
	}{
		{name: "server ok", err: ServerConfig{ListenAddress: ":0", TLS: ok}.Validate()},
		{name: "server no address", err: ServerConfig{TLS: ok}.Validate(), wantErr: "ListenAddress"},
		{name: "server no TLS", err: ServerConfig{ListenAddress: ":0"}.Validate(), wantErr: "CertFile"},
		{name: "server negative size", err: ServerConfig{ListenAddress: ":0", TLS: ok, MaxRecvMsgSize: -1}.Validate(), wantErr: "MaxRecvMsgSize"},
		{name: "server negative timeout", err: ServerConfig{ListenAddress: ":0", TLS: ok, GracefulStopTimeout: -1}.Validate(), wantErr: "GracefulStopTimeout"},
		{name: "client ok", err: insecureClient.Validate()},
		{name: "client no TLS", err: ClientConfig{}.Validate(), wantErr: "CertFile"},
		{name: "client negative size", err: ClientConfig{TLS: ok, MaxSendMsgSize: -1}.Validate(), wantErr: "MaxSendMsgSize"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.wantErr == "" {
				if tt.err != nil {
					t.Fatalf("Validate() = %v, want nil", tt.err)
				}
				return
			}
			if tt.err == nil || !strings.Contains(tt.err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", tt.err, tt.wantErr)
			}
		})
	}
	if _, err := NewServer(ServerConfig{}, nil); err == nil {
		t.Error("NewServer accepted an invalid config")
	}
	if _, err := Dial("127.0.0.1:1", ClientConfig{}); err == nil {
		t.Error("Dial accepted an invalid config")
	}
}

func TestHealthAndReflection(t *testing.T) {
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, nil)
	conn := dial(t, r, insecureClient)
	ctx := testContext(t)

	for _, service := range []string{"", testService, healthpb.Health_ServiceDesc.ServiceName} {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("Check(%q): %v", service, err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q) = %v, want SERVING", service, resp.Status)
		}
	}

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"grpc.health.v1.Health", testService} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}
	stream.CloseSend()
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestPanicRecovery(t *testing.T) {
	var logs syncBuffer
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: &logs})
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, logger)
	conn := dial(t, r, insecureClient)
	ctx := testContext(t)

	tests := []struct {
		name string
		call func() error
	}{
		{name: "unary", call: func() error { return call(ctx, conn, "Panic", "") }},
		{name: "stream", call: func() error { return callStream(ctx, conn, "panic") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); status.Code(err) != codes.Internal {
				t.Fatalf("panicking call = %v, want Internal", err)
			}
			if err := call(ctx, conn, "Echo", ""); err != nil {
				t.Fatalf("server did not survive the panic: %v", err)
			}
		})
	}
	out := logs.String()
	for _, want := range []string{"recovered from panic in handler", "handler exploded", "stream exploded", "stack=", "grpcx_test.go"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

func TestCallLogging(t *testing.T) {
	var logs syncBuffer
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: &logs})
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, logger,
		WithValidator(func(any) error { return errors.New("never valid") }))
	conn := dial(t, r, insecureClient)
	if err := call(testContext(t), conn, "Echo", ""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("call = %v, want InvalidArgument", err)
	}
	out := logs.String()
	for _, want := range []string{"[WARN]  finished call", "grpc.method=Echo", "grpc.service=" + testService, "grpc.code=InvalidArgument"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

func TestCallLoggingQuietAtInfo(t *testing.T) {
	var logs syncBuffer
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: &logs})
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, logger,
		WithValidator(func(req any) error {
			if hc, ok := req.(*healthpb.HealthCheckRequest); ok && hc.Service == "invalid" {
				return errors.New("service must not be invalid")
			}
			return nil
		}))
	conn := dial(t, r, insecureClient)
	if err := call(testContext(t), conn, "Echo", ""); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); strings.Contains(out, "finished call") {
		t.Fatalf("a successful call was logged at info level:\n%s", out)
	}
	_, err := healthpb.NewHealthClient(conn).Check(testContext(t), &healthpb.HealthCheckRequest{Service: "invalid"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("check = %v, want InvalidArgument", err)
	}
	out := logs.String()
	for _, want := range []string{"[WARN]  finished call", "grpc.service=grpc.health.v1.Health", "grpc.method=Check",
		"grpc.method_type=unary", "grpc.code=InvalidArgument", "grpc.error=", "grpc.time_ms=", "peer.address=127.0.0.1:"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

func TestSplitMethod(t *testing.T) {
	for in, want := range map[string][2]string{
		"/gavel.bbs.v1.BBSService/DesireLRP": {"gavel.bbs.v1.BBSService", "DesireLRP"},
		"/grpc.health.v1.Health/Check":       {"grpc.health.v1.Health", "Check"},
		"Plain":                              {"unknown", "Plain"},
	} {
		if s, m := splitMethod(in); s != want[0] || m != want[1] {
			t.Errorf("splitMethod(%q) = %q, %q; want %q, %q", in, s, m, want[0], want[1])
		}
	}
}

func TestValidator(t *testing.T) {
	validate := func(req any) error {
		hc, ok := req.(*healthpb.HealthCheckRequest)
		if !ok {
			return nil
		}
		switch hc.Service {
		case "invalid":
			return errors.New("service must not be invalid")
		case "denied":
			return status.Error(codes.PermissionDenied, "not for you")
		}
		return nil
	}
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, nil, WithValidator(validate))
	conn := dial(t, r, insecureClient)
	ctx := testContext(t)

	tests := []struct {
		name      string
		call      func(service string) error
		service   string
		wantCode  codes.Code
		wantMsg   string
		wantCalls int32
	}{
		{name: "unary valid", call: unaryEcho(ctx, conn), service: "ok", wantCode: codes.OK, wantCalls: 1},
		{name: "unary invalid", call: unaryEcho(ctx, conn), service: "invalid", wantCode: codes.InvalidArgument, wantMsg: "service must not be invalid"},
		{name: "unary status kept", call: unaryEcho(ctx, conn), service: "denied", wantCode: codes.PermissionDenied, wantMsg: "not for you"},
		{name: "stream valid", call: streamEcho(ctx, conn), service: "ok", wantCode: codes.OK, wantCalls: 1},
		{name: "stream invalid", call: streamEcho(ctx, conn), service: "invalid", wantCode: codes.InvalidArgument, wantMsg: "service must not be invalid"},
		{name: "health check validated", call: healthCheck(ctx, conn), service: "invalid", wantCode: codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := r.handlers.calls.Load()
			err := tt.call(tt.service)
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.wantCode)
			}
			if tt.wantMsg != "" && status.Convert(err).Message() != tt.wantMsg {
				t.Errorf("message = %q, want %q", status.Convert(err).Message(), tt.wantMsg)
			}
			if got := r.handlers.calls.Load() - before; got != tt.wantCalls {
				t.Errorf("handler ran %d times, want %d", got, tt.wantCalls)
			}
		})
	}
}

func unaryEcho(ctx context.Context, conn *grpc.ClientConn) func(string) error {
	return func(service string) error { return call(ctx, conn, "Echo", service) }
}

func streamEcho(ctx context.Context, conn *grpc.ClientConn) func(string) error {
	return func(service string) error { return callStream(ctx, conn, service) }
}

func healthCheck(ctx context.Context, conn *grpc.ClientConn) func(string) error {
	return func(service string) error {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		return err
	}
}

func TestUserInterceptorsAndMutualTLS(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "server", "rep/cell-1")
	if err != nil {
		t.Fatal(err)
	}
	ids := make(chan string, 10)
	identify := func(ctx context.Context) {
		id, _ := tlsx.PeerIdentity(ctx)
		ids <- id
	}
	r := start(t, ServerConfig{TLS: pki["server"]}, nil,
		WithUnaryInterceptors(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			identify(ctx)
			return h(ctx, req)
		}),
		WithStreamInterceptors(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			identify(ss.Context())
			return h(srv, ss)
		}),
	)

	tests := []struct {
		name    string
		cfg     ClientConfig
		wantErr bool
	}{
		{name: "mutual TLS", cfg: ClientConfig{TLS: pki["rep/cell-1"]}},
		{name: "plaintext client", cfg: insecureClient, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t, r, tt.cfg)
			ctx := testContext(t)
			errUnary := call(ctx, conn, "Echo", "")
			errStream := callStream(ctx, conn, "")
			if tt.wantErr {
				if errUnary == nil || errStream == nil {
					t.Fatalf("calls succeeded (%v, %v), want failures", errUnary, errStream)
				}
				return
			}
			if errUnary != nil || errStream != nil {
				t.Fatalf("calls failed: %v, %v", errUnary, errStream)
			}
			for range 2 {
				if id := <-ids; id != "spiffe://gavel/rep/cell-1" {
					t.Errorf("identity = %q", id)
				}
			}
		})
	}

	plain := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, nil)
	conn := dial(t, plain, ClientConfig{TLS: pki["rep/cell-1"]})
	if err := call(testContext(t), conn, "Echo", ""); err == nil {
		t.Error("TLS client reached a plaintext server")
	}
}

func TestMessageSizeLimits(t *testing.T) {
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}, MaxRecvMsgSize: 1024}, nil)
	ctx := testContext(t)
	big := strings.Repeat("x", 2048)

	tests := []struct {
		name     string
		cfg      ClientConfig
		wantCode codes.Code
	}{
		{name: "server limit", cfg: insecureClient, wantCode: codes.ResourceExhausted},
		{name: "client limit", cfg: ClientConfig{TLS: tlsx.Config{Insecure: true}, MaxSendMsgSize: 1024}, wantCode: codes.ResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := r.handlers.calls.Load()
			err := call(ctx, dial(t, r, tt.cfg), "Echo", big)
			if status.Code(err) != tt.wantCode {
				t.Fatalf("call = %v, want %v", err, tt.wantCode)
			}
			if r.handlers.calls.Load() != before {
				t.Error("oversized request reached the handler")
			}
		})
	}
}

func TestGracefulStop(t *testing.T) {
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, nil)
	conn := dial(t, r, insecureClient)
	ctx := testContext(t)

	inFlight := make(chan error, 1)
	go func() { inFlight <- call(ctx, conn, "Slow", "") }()
	for r.handlers.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	r.stop()

	// Health flips to NOT_SERVING and Run waits for the call in flight.
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := r.srv.Health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("health still SERVING after stop")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-r.done:
		t.Fatalf("Run returned (%v) with a call in flight", r.err)
	case <-time.After(100 * time.Millisecond):
	}

	close(r.handlers.release)
	if err := <-inFlight; err != nil {
		t.Fatalf("in-flight call failed: %v", err)
	}
	if err := r.wait(t); err != nil {
		t.Fatalf("Run() = %v, want nil", err)
	}
	if err := call(ctx, conn, "Echo", ""); err == nil {
		t.Error("call succeeded after stop")
	}
}

func TestGracefulStopTimeout(t *testing.T) {
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}, GracefulStopTimeout: 200 * time.Millisecond}, nil)
	conn := dial(t, r, insecureClient)
	ctx := testContext(t)

	inFlight := make(chan error, 1)
	go func() { inFlight <- call(ctx, conn, "Slow", "") }()
	for r.handlers.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	begin := time.Now()
	r.stop()
	if err := r.wait(t); err != nil {
		t.Fatalf("Run() = %v, want nil", err)
	}
	if took := time.Since(begin); took < 200*time.Millisecond || took > 5*time.Second {
		t.Errorf("stop took %v, want about 200ms", took)
	}
	if err := <-inFlight; status.Code(err) != codes.Unavailable {
		t.Errorf("in-flight call = %v, want Unavailable", err)
	}
}

func TestRunErrors(t *testing.T) {
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, nil)
	if err := r.srv.Run(context.Background(), func() {}); err == nil || !strings.Contains(err.Error(), "more than once") {
		t.Errorf("second Run() = %v, want error", err)
	}

	taken, err := NewServer(ServerConfig{ListenAddress: r.srv.Addr().String(), TLS: tlsx.Config{Insecure: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	readyCalled := false
	err = taken.Run(context.Background(), func() { readyCalled = true })
	if err == nil || !strings.Contains(err.Error(), "listen on") || readyCalled {
		t.Errorf("Run on a taken port = %v (ready called: %v), want listen error", err, readyCalled)
	}
}

func TestWithListenerServesTheHandedOverListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, nil, WithListener(l))
	if r.srv.Addr().String() != l.Addr().String() {
		t.Fatalf("Addr() = %v, want the handed-over listener's %v", r.srv.Addr(), l.Addr())
	}
	conn := dial(t, r, insecureClient)
	if _, err := healthpb.NewHealthClient(conn).Check(testContext(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check over the handed-over listener: %v", err)
	}
	r.stop()
	if err := r.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Run returned: %v, want the listener closed", err)
	}
}

// TestRunStoppedAtOnce: a server whose context ends as soon as it is ready stops cleanly, even
// when the stop comes before its goroutine has reached Serve (then gRPC answers
// ErrServerStopped, which is the stop asked for, not a failure).
func TestRunStoppedAtOnce(t *testing.T) {
	for i := range 50 {
		srv, err := NewServer(ServerConfig{ListenAddress: "127.0.0.1:0", TLS: tlsx.Config{Insecure: true}}, logtest.New(t))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if err := srv.Run(ctx, cancel); err != nil {
			t.Fatalf("run %d: Run returned %v after a stop, want nil", i, err)
		}
	}
}
