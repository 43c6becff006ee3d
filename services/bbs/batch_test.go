package bbs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// TestBatchedClaimsAndStarts makes claims and RUNNING reports in batches, as a loaded rep does:
// each item is answered on its own (one failing leaves the others made), a desired LRP asked
// for goes out once per process guid, and a batch with an invalid item is refused whole,
// naming the item's field, with nothing stored.
func TestBatchedClaimsAndStarts(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	lrpRegisterCell(t, env, "cell-a", "z1")
	lrpDesire(t, env, "web", 3)
	lrpDesire(t, env, "api", 1)
	ik := func(i int) *modelsv1.ActualLRPInstanceKey { return lrpInstKey("inst-"+string(rune('a'+i)), "cell-a") }
	lrpClaim(t, env, "api", 0, lrpInstKey("other", "cell-b")) // claimed by another container

	claims := []*bbsv1.ClaimActualLRPRequest{
		{ProcessGuid: "web", Index: 0, InstanceKey: ik(0), IncludeDesiredLrp: true},
		{ProcessGuid: "web", Index: 1, InstanceKey: ik(1), IncludeDesiredLrp: true},
		{ProcessGuid: "nobody", Index: 0, InstanceKey: ik(2), IncludeDesiredLrp: true},
		{ProcessGuid: "api", Index: 0, InstanceKey: ik(3), IncludeDesiredLrp: true},
		{ProcessGuid: "web", Index: 2, InstanceKey: ik(4)},
	}
	resp, err := env.Client.ClaimActualLRPs(ctx, &bbsv1.ClaimActualLRPsRequest{Claims: claims})
	if err != nil {
		t.Fatalf("ClaimActualLRPs: %v", err)
	}
	res := resp.GetResults()
	if len(res) != len(claims) {
		t.Fatalf("%d results for %d claims", len(res), len(claims))
	}
	for _, i := range []int{0, 1, 4} {
		a := res[i].GetResponse().GetActualLrp()
		if res[i].GetError() != nil || a.GetState() != lrpClaimed || a.GetInstanceKey().GetInstanceGuid() != claims[i].GetInstanceKey().GetInstanceGuid() {
			t.Errorf("claim %d: %v", i, res[i])
		}
		if stored := lrpStored(t, env, "web", claims[i].GetIndex(), lrpOrdinary); stored.GetState() != lrpClaimed {
			t.Errorf("claim %d not stored: %v", i, stored)
		}
	}
	if codes.Code(res[2].GetError().GetCode()) != codes.NotFound || codes.Code(res[3].GetError().GetCode()) != codes.FailedPrecondition {
		t.Errorf("failed claims answered %v and %v, want NotFound and FailedPrecondition", res[2].GetError(), res[3].GetError())
	}
	if res[0].GetResponse().GetDesiredLrp().GetProcessGuid() != "web" || res[1].GetResponse().GetDesiredLrp() != nil {
		t.Errorf("the desired LRP went out %v then %v, want on the first claim of web only",
			res[0].GetResponse().GetDesiredLrp() != nil, res[1].GetResponse().GetDesiredLrp() != nil)
	}

	starts := []*bbsv1.StartActualLRPsRequest{{Starts: []*bbsv1.StartActualLRPRequest{
		{ProcessGuid: "web", Index: 0, InstanceKey: ik(0), NetInfo: lrpNetInfo(61000), Routable: true},
		{ProcessGuid: "web", Index: 1, InstanceKey: ik(4), NetInfo: lrpNetInfo(61001), Routable: true}, // not its claimer
		{ProcessGuid: "web", Index: 2, InstanceKey: ik(4), NetInfo: lrpNetInfo(61002), Routable: true},
	}}}
	sresp, err := env.Client.StartActualLRPs(ctx, starts[0])
	if err != nil {
		t.Fatalf("StartActualLRPs: %v", err)
	}
	sres := sresp.GetResults()
	if len(sres) != 3 || sres[0].GetResponse().GetActualLrp().GetState() != lrpRunning ||
		codes.Code(sres[1].GetError().GetCode()) != codes.FailedPrecondition || sres[2].GetResponse().GetActualLrp().GetState() != lrpRunning {
		t.Fatalf("start results: %v", sres)
	}
	if a := lrpStored(t, env, "web", 1, lrpOrdinary); a.GetState() != lrpClaimed {
		t.Errorf("a refused start changed its record: %v", a)
	}

	rev := lrpRevision(t, env)
	_, err = env.Client.StartActualLRPs(ctx, &bbsv1.StartActualLRPsRequest{Starts: []*bbsv1.StartActualLRPRequest{
		{ProcessGuid: "web", Index: 1, InstanceKey: ik(1), NetInfo: lrpNetInfo(61001)},
		{ProcessGuid: "web", Index: -1, InstanceKey: ik(1), NetInfo: lrpNetInfo(61001)},
	}})
	wantBadRequestField(t, err, "starts[1].index")
	lrpWantRevision(t, env, rev, "a batch with an invalid item")
}

// TestBatchedItemsJoinTheirTraces: a batch call belongs to no one instance's trace, so each
// item names its own; the BBS records each item as a server span of that trace, named as the
// call it stands for, and a RUNNING record keeps its item's trace (for the route publication).
func TestBatchedItemsJoinTheirTraces(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(tracenoop.NewTracerProvider()) })
	env := bbstest.Start(t)
	ctx := ctxT(t)
	lrpRegisterCell(t, env, "cell-a", "z1")
	lrpDesire(t, env, "web", 2)

	tracer := tracing.Tracer("test")
	var parents [2]trace.SpanContext
	var claims []*bbsv1.ClaimActualLRPRequest
	var starts []*bbsv1.StartActualLRPRequest
	for i := range parents {
		sctx, span := tracer.Start(context.Background(), "rep.start_lrp")
		span.End()
		parents[i] = span.SpanContext()
		ik := lrpInstKey(fmt.Sprintf("inst-%d", i), "cell-a")
		claims = append(claims, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: int32(i), InstanceKey: ik, Trace: tracing.Carry(sctx)})
		starts = append(starts, &bbsv1.StartActualLRPRequest{ProcessGuid: "web", Index: int32(i), InstanceKey: ik, NetInfo: lrpNetInfo(61000 + uint32(i)), Trace: tracing.Carry(sctx)})
	}
	if _, err := env.Client.ClaimActualLRPs(ctx, &bbsv1.ClaimActualLRPsRequest{Claims: claims}); err != nil {
		t.Fatal(err)
	}
	sresp, err := env.Client.StartActualLRPs(ctx, &bbsv1.StartActualLRPsRequest{Starts: starts})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range parents {
		for _, name := range []string{"gavel.bbs.v1.BBSService/ClaimActualLRP", "gavel.bbs.v1.BBSService/StartActualLRP"} {
			found := false
			for _, s := range rec.Ended() {
				if s.Name() == name && s.Parent().SpanID() == p.SpanID() && s.SpanContext().TraceID() == p.TraceID() && s.SpanKind() == trace.SpanKindServer {
					found = true
				}
			}
			if !found {
				t.Errorf("no server span %s under item %d's span", name, i)
			}
		}
		got := sresp.GetResults()[i].GetResponse().GetActualLrp().GetTrace().GetTraceparent()
		if !strings.Contains(got, p.TraceID().String()) {
			t.Errorf("item %d's RUNNING record keeps trace %q, want its own trace %s", i, got, p.TraceID())
		}
	}
}
