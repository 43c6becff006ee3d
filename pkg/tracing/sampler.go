package tracing

import (
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Sampler is Gavel's sampling policy, in three rules:
//
//   - A span whose parent is in a trace follows its parent's decision (parent-based), so a
//     desire's trace is whole or absent, never partial.
//   - The cluster's own chatter never starts a trace: health checks, reflection, the event
//     stream and the route-table watch (one call that lives for hours), the log streams, the
//     auctioneer's cell-state fetches (every cell, every round), and the batched calls whose
//     pieces of work each carry their own desire's trace (the BBS's RequestLRPAuctions and
//     RequestTaskAuctions, the auctioneer's Perform, a rep's ClaimActualLRPs and
//     StartActualLRPs; see Inject). Such a call inside a trace
//     is still recorded in it.
//   - Any other call that starts a trace is recorded at ratio (TraceIDRatioBased).
//
// Without the second rule a cluster at 100% sampling records a trace of two spans per cell
// per auction round and per batch, which tells an operator nothing about any desire and
// costs as much as the desires' own spans (docs/decisions/0032-tracing-cost.md).
func Sampler(ratio float64) sdktrace.Sampler {
	return sdktrace.ParentBased(chatterSampler{next: sdktrace.TraceIDRatioBased(ratio)})
}

// chatterSampler drops the root spans of Chatter calls and asks next about the others.
type chatterSampler struct{ next sdktrace.Sampler }

func (s chatterSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if Chatter(p.Name) {
		return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	}
	return s.next.ShouldSample(p)
}

func (s chatterSampler) Description() string {
	return "GavelChatterless{" + s.next.Description() + "}"
}

// chatterServices start no trace in any of their methods; chatterMethods in the ones named.
var (
	chatterServices = []string{"grpc.health.v1.Health/", "grpc.reflection."}
	chatterMethods  = map[string]bool{
		"gavel.bbs.v1.BBSService/SubscribeToEvents":                 true,
		"gavel.bbs.v1.BBSService/StreamLogs":                        true,
		"gavel.routeemitter.v1.RouteEmitterService/WatchRoutes":     true,
		"gavel.rep.v1.RepService/State":                             true,
		"gavel.rep.v1.RepService/Perform":                           true,
		"gavel.rep.v1.RepService/StreamLogs":                        true,
		"gavel.auctioneer.v1.AuctioneerService/RequestLRPAuctions":  true,
		"gavel.auctioneer.v1.AuctioneerService/RequestTaskAuctions": true,
		"gavel.bbs.v1.BBSService/ClaimActualLRPs":                   true,
		"gavel.bbs.v1.BBSService/StartActualLRPs":                   true,
	}
)

// Chatter reports whether the gRPC method named like otelgrpc names its spans
// ("package.Service/Method") is one of the cluster's own background calls that start no trace
// (see Sampler).
func Chatter(method string) bool {
	if chatterMethods[method] {
		return true
	}
	for _, p := range chatterServices {
		if strings.HasPrefix(method, p) {
			return true
		}
	}
	return false
}

// serverSpanOnly are the calls recorded by their server span alone: the rep's per-instance
// lifecycle writes, each made inside the rep's own span for the instance (rep.start_lrp), two
// for every instance placed. Their client span would measure what the enclosing span and the
// server span already show (the claim is all rep.start_lrp does before rep.create_container
// starts) at a third of a traced placement's spans (docs/decisions/0035-tracing-hot-path.md).
var serverSpanOnly = map[string]bool{
	"/gavel.bbs.v1.BBSService/ClaimActualLRP": true,
	"/gavel.bbs.v1.BBSService/StartActualLRP": true,
}

// ClientSpan reports whether a gRPC client call of fullMethod ("/package.Service/Method", as
// gRPC names it) records a client span when tracing is on. It is false for the calls recorded
// by their server span alone (the rep's claim and start of an instance); their trace context
// still crosses the hop, so the server span is the child of the caller's span.
func ClientSpan(fullMethod string) bool {
	return !serverSpanOnly[fullMethod]
}
