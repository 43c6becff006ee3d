package core

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gavel-sched/gavel/pkg/tracing"
)

// startStep starts the span of one step of an app's restart ("nsync.restart", and within it
// "nsync.restart.desire", "nsync.restart.wait_running", "nsync.restart.drain"), in the trace of
// the call that asked for it: the new version's DesireLRP, its placement and its instances'
// starts are spans of the same trace.
func startStep(ctx context.Context, name, guid string) (context.Context, trace.Span) {
	return tracing.Tracer("nsync").Start(ctx, name, trace.WithAttributes(attribute.String("gavel.app_guid", guid)))
}

// endStep ends a step's span, marking it failed with err.
func endStep(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(otelcodes.Error, err.Error())
	}
	span.End()
}
