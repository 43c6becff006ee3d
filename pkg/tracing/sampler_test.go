package tracing

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TestSampler checks Gavel's policy: chatter starts no trace but is recorded inside one, other
// calls start a trace at the ratio, and a child follows its parent's decision.
func TestSampler(t *testing.T) {
	sampled := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true}))
	unsampled := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{2}, SpanID: trace.SpanID{2}, Remote: true}))
	for _, tc := range []struct {
		name   string
		ratio  float64
		parent context.Context
		span   string
		want   sdktrace.SamplingDecision
	}{
		{"a desire starts a trace", 1, context.Background(), "gavel.bbs.v1.BBSService/DesireLRP", sdktrace.RecordAndSample},
		{"at ratio 0 nothing starts one", 0, context.Background(), "gavel.bbs.v1.BBSService/DesireLRP", sdktrace.Drop},
		{"a cell-state fetch starts none", 1, context.Background(), "gavel.rep.v1.RepService/State", sdktrace.Drop},
		{"a batched Perform starts none", 1, context.Background(), "gavel.rep.v1.RepService/Perform", sdktrace.Drop},
		{"a health check starts none", 1, context.Background(), "grpc.health.v1.Health/Check", sdktrace.Drop},
		{"the event stream starts none", 1, context.Background(), "gavel.bbs.v1.BBSService/SubscribeToEvents", sdktrace.Drop},
		{"chatter inside a trace is recorded", 1, sampled, "gavel.rep.v1.RepService/State", sdktrace.RecordAndSample},
		{"a child follows its sampled parent at ratio 0", 0, sampled, "gavel.bbs.v1.BBSService/ClaimActualLRP", sdktrace.RecordAndSample},
		{"a child follows its unsampled parent", 1, unsampled, "gavel.bbs.v1.BBSService/ClaimActualLRP", sdktrace.Drop},
		{"our own spans start a trace", 1, context.Background(), "auctioneer.place", sdktrace.RecordAndSample},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Sampler(tc.ratio).ShouldSample(sdktrace.SamplingParameters{ParentContext: tc.parent, TraceID: trace.TraceID{9}, Name: tc.span})
			if got.Decision != tc.want {
				t.Fatalf("%s (ratio %g): decision %v, want %v", tc.span, tc.ratio, got.Decision, tc.want)
			}
		})
	}
}

// TestClientSpan checks that the rep's per-instance lifecycle writes are recorded by their
// server span alone and every other call by both of its ends.
func TestClientSpan(t *testing.T) {
	for method, want := range map[string]bool{
		"/gavel.bbs.v1.BBSService/ClaimActualLRP": false,
		"/gavel.bbs.v1.BBSService/StartActualLRP": false,
		"/gavel.bbs.v1.BBSService/DesireLRP":      true,
		"/gavel.bbs.v1.BBSService/FailActualLRP":  true,
		"/gavel.rep.v1.RepService/Perform":        true,
		"gavel.bbs.v1.BBSService/ClaimActualLRP":  true, // otelgrpc's span name, not gRPC's method
	} {
		if got := ClientSpan(method); got != want {
			t.Errorf("ClientSpan(%q) = %v, want %v", method, got, want)
		}
	}
}
