package transform_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
)

// TestPluginCallsAreSpans: every plugin call is a client span "transform.<kind>" naming the
// plugin, a child of the caller's span (the desire's), and the plugin receives the W3C trace
// context in its request headers, so a traced plugin continues the same trace.
func TestPluginCallsAreSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(tracenoop.NewTracerProvider()) })

	var mu sync.Mutex
	var parents []string // traceparent headers the plugin saw on /transform calls
	p := addProperty("net", "k", "v")
	dir, err := os.MkdirTemp("", "gvtf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	l, err := plugin.Listen(filepath.Join(dir, "net.sock"))
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/transform/") {
			mu.Lock()
			parents = append(parents, r.Header.Get("traceparent"))
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })

	c, err := transform.Load(ctxT(t), []transform.PluginConfig{{Name: "net", Socket: filepath.Join(dir, "net.sock")}}, logtest.New(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, root := tracing.Tracer("test").Start(ctxT(t), "desire web")
	if _, err := c.DesiredLRP(ctx, lrp()); err != nil {
		t.Fatal(err)
	}
	root.End()

	var call sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "transform.desired_lrp" {
			call = s
		}
	}
	if call == nil {
		t.Fatalf("no transform.desired_lrp span among %d ended spans", len(rec.Ended()))
	}
	if call.Parent().SpanID() != root.SpanContext().SpanID() || call.SpanContext().TraceID() != root.SpanContext().TraceID() {
		t.Errorf("the plugin call's span is not a child of the caller's span")
	}
	named := false
	for _, a := range call.Attributes() {
		named = named || (a.Key == "gavel.plugin" && a.Value.AsString() == "net")
	}
	if !named {
		t.Errorf("span attributes %v lack gavel.plugin=net", call.Attributes())
	}
	mu.Lock()
	defer mu.Unlock()
	want := "00-" + root.SpanContext().TraceID().String() + "-" + call.SpanContext().SpanID().String() + "-01"
	if len(parents) != 1 || parents[0] != want {
		t.Errorf("the plugin saw traceparent %q, want [%s]", parents, want)
	}
}
