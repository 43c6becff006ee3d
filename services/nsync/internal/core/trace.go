package core

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/nsync/internal/deploy"
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

// startDeploymentStep starts the span of one step the leader takes for deployment d (scaling
// its two versions), in the trace of the call that asked for d (its recorded trace context): the
// BBS calls of the step, and the placements and starts they cause, are spans of that trace.
// Without a recorded context the step is not traced.
func startDeploymentStep(ctx context.Context, name string, d *nsyncv1.Deployment, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	tc := d.GetTraceContext()
	if len(tc) == 0 {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op span
	}
	attrs = append(attrs, attribute.String("gavel.app_guid", d.GetAppGuid()), attribute.String("gavel.deployment", d.GetId()),
		attribute.Int64("gavel.deploy.from_version", d.GetFromVersion()), attribute.Int64("gavel.deploy.to_version", d.GetToVersion()))
	return tracing.Tracer("nsync").Start(tracing.Extract(ctx, tc), name, trace.WithAttributes(attrs...))
}

// recordOutcome records the end of deployment d (succeeded, failed, cancelled) as a span of its
// trace.
func recordOutcome(ctx context.Context, d *nsyncv1.Deployment, outcome deploy.Outcome) {
	_, span := startDeploymentStep(ctx, "nsync.deployment.end", d, attribute.String("gavel.deploy.state", d.GetState().String()),
		attribute.String("gavel.deploy.message", d.GetMessage()))
	if outcome != deploy.Succeeded {
		span.SetStatus(otelcodes.Error, d.GetMessage())
	}
	span.End()
}
