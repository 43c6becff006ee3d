package syncer

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// publishSpans starts a "routeemitter.publish_routes" span for each instance that one of a
// revision's events shows newly RUNNING with a trace context: the BBS keeps, in the record,
// the trace of the StartActualLRP call that made it RUNNING (the desire's trace), so the
// publication of the instance's routes is a span of that same trace. endPublishSpans ends them
// once the revision's delta went to the watchers.
func publishSpans(resp *bbsv1.SubscribeToEventsResponse) []trace.Span {
	var spans []trace.Span
	for _, e := range resp.GetEvents() {
		var before, after *modelsv1.ActualLRP
		switch k := e.GetKind().(type) {
		case *bbsv1.Event_ActualLrpCreated:
			after = k.ActualLrpCreated.GetActualLrp()
		case *bbsv1.Event_ActualLrpChanged:
			before, after = k.ActualLrpChanged.GetBefore(), k.ActualLrpChanged.GetAfter()
		default:
			continue
		}
		tc := after.GetTrace()
		if tc == nil || after.GetState() != modelsv1.ActualLRP_STATE_RUNNING || tc.GetTraceparent() == before.GetTrace().GetTraceparent() {
			continue
		}
		_, span := tracing.Tracer("routeemitter").Start(tracing.Join(context.Background(), tc), "routeemitter.publish_routes",
			trace.WithAttributes(
				attribute.String("gavel.process_guid", after.GetKey().GetProcessGuid()),
				attribute.Int("gavel.index", int(after.GetKey().GetIndex())),
				attribute.Bool("gavel.routable", after.GetRoutable()),
				attribute.Int64("gavel.revision", resp.GetRevision()),
			))
		spans = append(spans, span)
	}
	return spans
}

// endPublishSpans ends publishSpans' spans; held says the delta waits for a listing to catch
// up (it goes out with a later revision).
func endPublishSpans(spans []trace.Span, held bool) {
	for _, span := range spans {
		span.SetAttributes(attribute.Bool("gavel.held_for_listing", held))
		span.End()
	}
}
