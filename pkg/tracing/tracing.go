// Package tracing is Gavel's OpenTelemetry setup, in one place: the tracer provider each
// service installs (off unless an OTLP endpoint is configured), W3C trace context across gRPC
// hops (pkg/grpcx installs otelgrpc's stats handlers on every server and client), and the
// carrier that takes a trace across the places no gRPC call spans: the BBS's batched auction
// requests and the auctioneer's rounds carry each piece of work's trace context in the work
// itself (a modelsv1.TraceContext: Carry and Join), so that one desire is one trace from the BBS
// through the auctioneer to the rep's claim and start.
package tracing

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Config says where a service sends its traces.
type Config struct {
	// OTLPEndpoint is the host:port of an OTLP/gRPC collector; empty turns tracing off (the
	// default): spans are then not recorded, though trace context still crosses the hops.
	OTLPEndpoint string `json:"otlp_endpoint,omitempty"`
	// OTLPInsecure sends to the collector in plaintext (a collector on the same host).
	OTLPInsecure bool `json:"otlp_insecure,omitempty"`
	// SamplingRatio is the share of new traces recorded, from 0 to 1 (default 1); a span whose
	// caller sampled it is always recorded (parent-based), and the cluster's own background
	// calls start no trace (Sampler).
	SamplingRatio float64 `json:"sampling_ratio"`
}

// Default is tracing off, recording every trace once an endpoint is set.
func Default() Config { return Config{SamplingRatio: 1} }

// Validate reports a sampling ratio outside [0, 1].
func (c Config) Validate() error {
	if c.SamplingRatio < 0 || c.SamplingRatio > 1 {
		return fmt.Errorf("tracing.sampling_ratio must be between 0 and 1, got %g", c.SamplingRatio)
	}
	return nil
}

// Flags binds the configuration to -otlp-endpoint, -otlp-insecure and -trace-sampling-ratio.
func Flags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", c.OTLPEndpoint, "send traces to this OTLP/gRPC collector (host:port); empty: tracing off")
	fs.BoolVar(&c.OTLPInsecure, "otlp-insecure", c.OTLPInsecure, "send traces to the collector in plaintext")
	fs.Float64Var(&c.SamplingRatio, "trace-sampling-ratio", c.SamplingRatio, "share of new traces recorded (0-1)")
}

func init() {
	// W3C trace context crosses every hop, whether or not this process records spans.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
}

// Start installs, when c names an endpoint, a tracer provider exporting service's spans over
// OTLP/gRPC, and returns the function that flushes and stops it. Without an endpoint it does
// nothing (tracing off) and returns a no-op.
func Start(ctx context.Context, service string, c Config) (func(context.Context) error, error) {
	if c.OTLPEndpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(c.OTLPEndpoint)}
	if c.OTLPInsecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter to %s: %w", c.OTLPEndpoint, err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(Sampler(c.SamplingRatio)),
	)
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// Tracer is the tracer of a Gavel component ("bbs", "auctioneer", "rep"...).
func Tracer(component string) trace.Tracer {
	return otel.Tracer("github.com/gavel-sched/gavel/" + component)
}

// Carry is ctx's trace context to carry in a piece of work or a record (W3C traceparent and
// tracestate, formatted as TraceContext would send them over a call); nil when ctx carries
// none. Baggage is not carried: Gavel sets none, and what a caller sent stays with the call.
func Carry(ctx context.Context) *modelsv1.TraceContext {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	tc := &modelsv1.TraceContext{}
	propagation.TraceContext{}.Inject(ctx, carrier{tc})
	return tc
}

// CarrySampled is Carry for a context whose span is sampled, and nil otherwise: for trace
// context kept in a record (tracing off, or a trace not sampled, stores nothing).
func CarrySampled(ctx context.Context) *modelsv1.TraceContext {
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return nil
	}
	return Carry(ctx)
}

// Join is ctx carrying the trace context tc (from Carry) as its remote parent; ctx itself when
// tc is nil or not a valid traceparent.
func Join(ctx context.Context, tc *modelsv1.TraceContext) context.Context {
	if tc.GetTraceparent() == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, carrier{tc})
}

// carrier is the propagation.TextMapCarrier of a TraceContext: its two headers, no others.
type carrier struct{ tc *modelsv1.TraceContext }

// Get is the value of header key ("" for any other than the two).
func (c carrier) Get(key string) string {
	switch key {
	case traceparent:
		return c.tc.GetTraceparent()
	case tracestate:
		return c.tc.GetTracestate()
	}
	return ""
}

// Set sets header key (traceparent or tracestate; others are dropped).
func (c carrier) Set(key, value string) {
	switch key {
	case traceparent:
		c.tc.Traceparent = value
	case tracestate:
		c.tc.Tracestate = value
	}
}

// Keys are the two headers a TraceContext holds.
func (carrier) Keys() []string { return []string{traceparent, tracestate} }

// The W3C trace context headers (propagation.TraceContext's keys).
const (
	traceparent = "traceparent"
	tracestate  = "tracestate"
)

// Inject is ctx's trace context as W3C headers (traceparent, tracestate, baggage), to carry in a
// piece of work that keeps a map of headers (nsync's deployment records; the placement path and
// the ActualLRP record use Carry); nil when ctx carries none.
func Inject(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	return carrier
}

// InjectSampled is Inject for a context whose span is sampled, and nil otherwise: for trace
// context kept in a record (tracing off, or a trace not sampled, stores nothing).
func InjectSampled(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return nil
	}
	return Inject(ctx)
}

// Extract is ctx carrying the trace context of headers (from Inject) as its remote parent.
func Extract(ctx context.Context, headers map[string]string) context.Context {
	if len(headers) == 0 {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(headers))
}

// TraceID is the id of ctx's trace, or "" when it has none: for log and audit lines.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
