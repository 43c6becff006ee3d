package api

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// Batch calls (ClaimActualLRPs, StartActualLRPs) carry many reps' worth of one call in one
// round trip: a loaded rep sends the claims and RUNNING reports that queued while its last call
// was out. Each item is made as the call it stands for, concurrently, so the store's group
// commit puts them in the same etcd transactions, and each is answered on its own.

// ClaimActualLRPs implements bbsv1.BBSServiceServer.
func (s *Server) ClaimActualLRPs(ctx context.Context, r *bbsv1.ClaimActualLRPsRequest) (*bbsv1.ClaimActualLRPsResponse, error) {
	claims := r.GetClaims()
	out := &bbsv1.ClaimActualLRPsResponse{Results: make([]*bbsv1.ClaimActualLRPResult, len(claims))}
	eachItem(ctx, bbsv1.BBSService_ClaimActualLRP_FullMethodName, claims, func(ctx context.Context, i int, c *bbsv1.ClaimActualLRPRequest) error {
		a, err := s.actual.ClaimActualLRP(ctx, c.GetProcessGuid(), c.GetIndex(), c.GetInstanceKey())
		if err != nil {
			out.Results[i] = &bbsv1.ClaimActualLRPResult{Error: itemError(err)}
			return err
		}
		out.Results[i] = &bbsv1.ClaimActualLRPResult{Response: &bbsv1.ClaimActualLRPResponse{ActualLrp: a}}
		return nil
	})
	// A desired LRP goes out once per process guid, on its first successful claim that asked
	// for it: a cell's batch often holds several instances of one LRP, and the definition is
	// the largest part of the answer.
	sent := map[string]bool{}
	for i, res := range out.Results {
		guid := claims[i].GetProcessGuid()
		if res.GetResponse() == nil || !claims[i].GetIncludeDesiredLrp() || sent[guid] {
			continue
		}
		sent[guid] = true
		res.Response.DesiredLrp = s.claimedDesired(ctx, guid)
	}
	return out, nil
}

// StartActualLRPs implements bbsv1.BBSServiceServer.
func (s *Server) StartActualLRPs(ctx context.Context, r *bbsv1.StartActualLRPsRequest) (*bbsv1.StartActualLRPsResponse, error) {
	starts := r.GetStarts()
	out := &bbsv1.StartActualLRPsResponse{Results: make([]*bbsv1.StartActualLRPResult, len(starts))}
	eachItem(ctx, bbsv1.BBSService_StartActualLRP_FullMethodName, starts, func(ctx context.Context, i int, st *bbsv1.StartActualLRPRequest) error {
		resp, err := s.StartActualLRP(ctx, st)
		if err != nil {
			out.Results[i] = &bbsv1.StartActualLRPResult{Error: itemError(err)}
			return err
		}
		out.Results[i] = &bbsv1.StartActualLRPResult{Response: resp}
		return nil
	})
	return out, nil
}

// traced is a batch item that names the trace it belongs to.
type traced interface {
	GetTrace() *modelsv1.TraceContext
}

// eachItem runs one on every item concurrently and waits for all. An item that names its
// trace is made in a server span of that trace named as the call it stands for (fullMethod,
// as otelgrpc names the span of a single call), so a trace reads the same whether the rep
// batched or not. An item without one runs outside any trace: the batch's own call belongs to
// no one instance.
func eachItem[T traced](ctx context.Context, fullMethod string, items []T, one func(ctx context.Context, i int, item T) error) {
	untraced := trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	tracer := tracing.Tracer("bbs")
	name := fullMethod[1:] // "/pkg.Service/Method" → "pkg.Service/Method"
	var wg sync.WaitGroup
	for i, item := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ictx := untraced
			if tc := item.GetTrace(); tc.GetTraceparent() != "" {
				var span trace.Span
				ictx, span = tracer.Start(tracing.Join(untraced, tc), name, trace.WithSpanKind(trace.SpanKindServer),
					trace.WithAttributes(attribute.Int("gavel.batch_size", len(items))))
				defer span.End()
				if err := one(ictx, i, item); err != nil {
					span.SetStatus(otelcodes.Error, err.Error())
				}
				return
			}
			_ = one(ictx, i, item)
		}()
	}
	wg.Wait()
}

// itemError is err as one batch item's status, mapped as a single call's error would be.
func itemError(err error) *bbsv1.BatchItemError {
	st := status.Convert(rpcerr.ToStatus(err))
	return &bbsv1.BatchItemError{Code: uint32(st.Code()), Message: st.Message()}
}
