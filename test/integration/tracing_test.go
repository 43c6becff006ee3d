package integration

import (
	"bytes"
	"context"
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// otlpReceiver is an OTLP/gRPC trace collector on loopback that keeps every span it is sent
// (or, with discard, only counts them).
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	discard bool
	count   atomic.Int64
	mu      sync.Mutex
	spans   []*tracepb.Span
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			r.count.Add(int64(len(ss.GetSpans())))
			if !r.discard {
				r.spans = append(r.spans, ss.GetSpans()...)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// trace is the spans received of one trace.
func (r *otlpReceiver) trace(id string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if hex.EncodeToString(s.GetTraceId()) == id {
			out = append(out, s)
		}
	}
	return out
}

// syncBuffer is a log destination the test reads while the cluster writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestOneDesireIsOneTrace sends the spans of a cluster over mutual TLS to an OTLP receiver in
// the test: one DesireLRP yields one trace holding the BBS's DesireLRP, the auctioneer's
// placement, and the rep's start with its claim, container creation and RUNNING report,
// each span's parent in the same trace, the cell's spans under the placement and the
// placement under the desire; and the BBS's audit line for the call carries the trace id.
func TestOneDesireIsOneTrace(t *testing.T) {
	rcv := &otlpReceiver{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, rcv)
	l := testkit.Listen(t)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	shutdown, err := tracing.Start(t.Context(), "gavel", tracing.Config{OTLPEndpoint: l.Addr().String(), OTLPInsecure: true, SamplingRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { otel.SetTracerProvider(tracenoop.NewTracerProvider()) })
	logs := &syncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})

	cells := []devcluster.Cell{simCell("cell-0", "z1", nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)}
	cfg := devcluster.Config{Cells: cells, TLS: true}
	cfg.Dir, cfg.BBSAddress, cfg.AuctioneerAddress = t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	cfg.UnsafeNoFsync, cfg.Logger = true, logger
	c := devcluster.New(cfg)
	testkit.Start(t, "cluster", c)

	ctx, root := tracing.Tracer("test").Start(t.Context(), "desire web")
	id := root.SpanContext().TraceID().String()
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: desiredLRP("web", "preloaded:cflinuxfs4", 1, nil)}); err != nil {
		t.Fatal(err)
	}
	root.End()
	testkit.Eventually(t, 30*time.Second, func() bool {
		as := actualLRPs(t, c, "web")
		return len(as) == 1 && as[0].GetState() == modelsv1.ActualLRP_STATE_RUNNING
	}, "web running")
	flush, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// The BBS's RequestLRPAuctions and the auctioneer's Perform calls each carry a batch of
	// work from many traces, so they belong to no desire's trace: each piece of work carries
	// its own trace context across them instead (auctioneer.place, rep.start_lrp).
	want := []string{"desire web", "gavel.bbs.v1.BBSService/DesireLRP", "auctioneer.place", "rep.start_lrp",
		"gavel.bbs.v1.BBSService/ClaimActualLRP", "rep.create_container", "gavel.bbs.v1.BBSService/StartActualLRP"}
	var spans []*tracepb.Span
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		_ = flush
		spans = rcv.trace(id)
		have := map[string]bool{}
		for _, s := range spans {
			have[s.GetName()] = true
		}
		var missing []string
		for _, w := range want {
			if !have[w] {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0, "missing spans: " + strings.Join(missing, ", ")
	}, "the desire's spans received")
	if err := shutdown(flush); err != nil {
		t.Logf("shutdown: %v", err)
	}
	spans = rcv.trace(id)

	byID := map[string]*tracepb.Span{}
	for _, s := range spans {
		byID[hex.EncodeToString(s.GetSpanId())] = s
	}
	parentName := func(s *tracepb.Span) string {
		if p := byID[hex.EncodeToString(s.GetParentSpanId())]; p != nil {
			return p.GetName()
		}
		return ""
	}
	// ancestors is the chain of span names from s up to the root.
	ancestors := func(s *tracepb.Span) []string {
		var out []string
		for p := byID[hex.EncodeToString(s.GetParentSpanId())]; p != nil; p = byID[hex.EncodeToString(p.GetParentSpanId())] {
			out = append(out, p.GetName())
		}
		return out
	}
	for _, s := range spans {
		if s.GetName() != "desire web" && len(s.GetParentSpanId()) > 0 && byID[hex.EncodeToString(s.GetParentSpanId())] == nil {
			t.Errorf("span %s has a parent outside the trace", s.GetName())
		}
		switch s.GetName() {
		case "auctioneer.place", "rep.start_lrp", "rep.create_container":
			chain := strings.Join(ancestors(s), " < ")
			if !strings.Contains(chain, "gavel.bbs.v1.BBSService/DesireLRP") {
				t.Errorf("%s is not under the BBS's DesireLRP: %s", s.GetName(), chain)
			}
		}
		if s.GetName() == "rep.start_lrp" && parentName(s) != "auctioneer.place" {
			t.Errorf("rep.start_lrp's parent is %q, want auctioneer.place", parentName(s))
		}
	}
	for _, s := range spans {
		if strings.HasPrefix(s.GetName(), "gavel.bbs.v1.BBSService/ClaimActualLRP") && s.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
			if chain := ancestors(s); !strings.Contains(strings.Join(chain, " < "), "rep.start_lrp") {
				t.Errorf("the BBS's ClaimActualLRP is not under rep.start_lrp: %v", chain)
			}
		}
	}
	audit := ""
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "audit") && strings.Contains(line, "/DesireLRP") {
			audit = line
		}
	}
	if !strings.Contains(audit, "trace_id="+id) {
		t.Errorf("the BBS's audit line for DesireLRP does not carry trace id %s: %q", id, audit)
	}
}
