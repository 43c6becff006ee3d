package grpcx

import (
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// TestServerSpans checks what a server span records (serverSpans): the caller's trace as its
// parent, the method, and the call's outcome, ended when the call ends; the server's own
// address is not set on it.
func TestServerSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(tracenoop.NewTracerProvider()) })
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, nil)
	conn := dial(t, r, insecureClient)

	ctx, parent := otel.Tracer("test").Start(testContext(t), "caller")
	if err := call(ctx, conn, "Echo", "ok"); err != nil {
		t.Fatal(err)
	}
	if err := call(ctx, conn, "Panic", ""); err == nil {
		t.Fatal("Panic succeeded")
	}
	parent.End()

	// The server ends a call's span after it has sent the call's status, so the caller can
	// have its answer before the span is recorded: wait for both, a bounded while.
	var servers []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		servers = servers[:0]
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindServer {
				servers = append(servers, s)
			}
		}
		if len(servers) >= 2 || time.Now().After(deadline) {
			break
		}
	}
	if len(servers) != 2 {
		t.Fatalf("%d server spans ended, want 2", len(servers))
	}
	// Either call's span may be recorded first.
	sort.Slice(servers, func(i, j int) bool {
		return strings.HasSuffix(servers[i].Name(), "/Echo") && !strings.HasSuffix(servers[j].Name(), "/Echo")
	})
	for i, s := range servers {
		if s.Parent().TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("%s: not in the caller's trace", s.Name())
		}
		attrs := map[attribute.Key]string{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value.Emit()
		}
		want := []string{"OK", "INTERNAL"}[i]
		if attrs["rpc.response.status_code"] != want || attrs["rpc.method"] != s.Name() {
			t.Errorf("%s: attributes %v, want rpc.method and status %s", s.Name(), attrs, want)
		}
		if _, ok := attrs["server.address"]; ok {
			t.Errorf("%s: server.address set: %v", s.Name(), attrs)
		}
		if (s.Status().Code == codes.Error) != (i == 1) {
			t.Errorf("%s: status %v", s.Name(), s.Status())
		}
	}
}
