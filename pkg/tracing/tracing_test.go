package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// TestCarryJoin checks that a trace context carried in a piece of work (Carry) is the parent of
// what joins it (Join): same trace, span and flags, and its tracestate; that a context without
// one carries nothing; and that CarrySampled keeps only sampled ones.
func TestCarryJoin(t *testing.T) {
	ts, err := trace.ParseTraceState("gavel=1,other=x")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xab, 1}, SpanID: trace.SpanID{0xcd, 2}, TraceFlags: trace.FlagsSampled, TraceState: ts})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	tc := Carry(ctx)
	if want := "00-ab010000000000000000000000000000-cd02000000000000-01"; tc.GetTraceparent() != want {
		t.Fatalf("traceparent %q, want %q", tc.GetTraceparent(), want)
	}
	if tc.GetTracestate() != "gavel=1,other=x" {
		t.Fatalf("tracestate %q", tc.GetTracestate())
	}
	got := trace.SpanContextFromContext(Join(context.Background(), tc))
	if !got.IsRemote() || !got.Equal(sc.WithRemote(true)) {
		t.Fatalf("joined %+v, want the remote form of %+v", got, sc)
	}
	if CarrySampled(ctx) == nil {
		t.Fatal("CarrySampled dropped a sampled context")
	}

	unsampled := trace.ContextWithSpanContext(context.Background(), sc.WithTraceFlags(0))
	if Carry(unsampled) == nil || CarrySampled(unsampled) != nil {
		t.Fatal("an unsampled context: Carry must carry it (the decision travels), CarrySampled must not")
	}
	if Carry(context.Background()) != nil || CarrySampled(context.Background()) != nil {
		t.Fatal("a context without a trace carried one")
	}
	if bg := context.Background(); Join(bg, nil) != bg {
		t.Fatal("Join of nil changed the context")
	}
}
