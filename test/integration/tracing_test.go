package integration

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// otlpReceiver is an OTLP/gRPC trace collector on loopback that keeps every span it is sent
// (or, with discard, only counts them, in all and by name and kind).
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	discard bool
	count   atomic.Int64
	mu      sync.Mutex
	spans   []*tracepb.Span
	byName  map[string]*[8]int // span kind → count
}

// countingServer is a gRPC server for a discarding receiver that counts the spans of each
// export request on the wire instead of decoding them (countingCodec): a collector's decoding
// is the collector's cost, in a process of its own in a deployment, while here it would share
// the benchmark's CPUs with the cluster whose tracing is measured.
func countingServer(r *otlpReceiver) *grpc.Server {
	r.discard = true
	return grpc.NewServer(grpc.ForceServerCodec(countingCodec{r}))
}

// countingCodec is gRPC's proto codec, except that an ExportTraceServiceRequest is not decoded:
// its spans are counted into r (by name and kind) and the handler sees an empty request.
type countingCodec struct{ r *otlpReceiver }

func (countingCodec) Name() string { return "proto" }

func (countingCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (c countingCodec) Unmarshal(data []byte, v any) error {
	if _, ok := v.(*coltracepb.ExportTraceServiceRequest); !ok {
		return proto.Unmarshal(data, v.(proto.Message))
	}
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	// ExportTraceServiceRequest.resource_spans (1) → ResourceSpans.scope_spans (2) →
	// ScopeSpans.spans (2) → Span.name (5) and .kind (6).
	return eachField(data, 1, func(rs []byte) error {
		return eachField(rs, 2, func(ss []byte) error {
			return eachField(ss, 2, func(span []byte) error {
				var name []byte
				var kind uint64
				for b := span; len(b) > 0; {
					num, typ, n := protowire.ConsumeTag(b)
					if n < 0 {
						return protowire.ParseError(n)
					}
					b = b[n:]
					switch {
					case num == 5 && typ == protowire.BytesType:
						name, n = protowire.ConsumeBytes(b)
					case num == 6 && typ == protowire.VarintType:
						kind, n = protowire.ConsumeVarint(b)
					default:
						n = protowire.ConsumeFieldValue(num, typ, b)
					}
					if n < 0 {
						return protowire.ParseError(n)
					}
					b = b[n:]
				}
				c.r.addLocked(string(name), tracepb.Span_SpanKind(kind))
				return nil
			})
		})
	})
}

// eachField calls f with the value of each length-delimited field num of the message b.
func eachField(b []byte, num protowire.Number, f func([]byte) error) error {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return protowire.ParseError(l)
			}
			if err := f(v); err != nil {
				return err
			}
			b = b[l:]
			continue
		}
		if l = protowire.ConsumeFieldValue(n, typ, b); l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
	}
	return nil
}

// addLocked counts a discarded span; r.mu is held.
func (r *otlpReceiver) addLocked(name string, kind tracepb.Span_SpanKind) {
	r.count.Add(1)
	if r.byName == nil {
		r.byName = map[string]*[8]int{}
	}
	c := r.byName[name]
	if c == nil {
		c = new([8]int)
		r.byName[name] = c
	}
	if kind >= 0 && int(kind) < len(c) {
		c[kind]++
	}
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			if !r.discard {
				r.count.Add(int64(len(ss.GetSpans())))
				r.spans = append(r.spans, ss.GetSpans()...)
				continue
			}
			for _, s := range ss.GetSpans() {
				r.addLocked(s.GetName(), s.GetKind())
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// counts is how many spans of each name and kind a discarding receiver was sent, most first.
func (r *otlpReceiver) counts() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	type count struct {
		what string
		n    int
	}
	var counts []count
	for name, byKind := range r.byName {
		for k, n := range byKind {
			if n > 0 {
				kind := strings.ToLower(strings.TrimPrefix(tracepb.Span_SpanKind(k).String(), "SPAN_KIND_"))
				counts = append(counts, count{name + " (" + kind + ")", n})
			}
		}
	}
	sort.Slice(counts, func(i, j int) bool { return counts[i].n > counts[j].n })
	var b strings.Builder
	for i, c := range counts {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", c.what, c.n)
	}
	return b.String()
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
	// The rep's claim and RUNNING report are recorded by the BBS's server spans alone, children
	// of rep.start_lrp (tracing.ClientSpan).
	for _, s := range spans {
		switch s.GetName() {
		case "gavel.bbs.v1.BBSService/ClaimActualLRP", "gavel.bbs.v1.BBSService/StartActualLRP":
			if s.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("%s has a %s span, want the server's alone", s.GetName(), s.GetKind())
			} else if parentName(s) != "rep.start_lrp" {
				t.Errorf("the BBS's %s is under %q, want rep.start_lrp", s.GetName(), parentName(s))
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

// TestCountingCodecCountsSpans checks the benchmark's receiver: the spans of an export request
// counted on the wire, by name and kind, as decoding it would count them.
func TestCountingCodecCountsSpans(t *testing.T) {
	span := func(name string, kind tracepb.Span_SpanKind) *tracepb.Span {
		return &tracepb.Span{TraceId: make([]byte, 16), SpanId: make([]byte, 8), Name: name, Kind: kind, StartTimeUnixNano: 1,
			Attributes: []*commonpb.KeyValue{{Key: "k", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "v"}}}}}
	}
	req := &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
		{ScopeSpans: []*tracepb.ScopeSpans{
			{Scope: &commonpb.InstrumentationScope{Name: "a"}, Spans: []*tracepb.Span{span("x", tracepb.Span_SPAN_KIND_SERVER), span("x", tracepb.Span_SPAN_KIND_CLIENT)}},
			{Spans: []*tracepb.Span{span("y", tracepb.Span_SPAN_KIND_INTERNAL)}},
		}},
		{ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{span("x", tracepb.Span_SPAN_KIND_SERVER)}}}},
	}}
	data, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{discard: true}
	var got coltracepb.ExportTraceServiceRequest
	if err := (countingCodec{r}).Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if n := r.count.Load(); n != 4 {
		t.Errorf("counted %d spans, want 4", n)
	}
	if c, want := r.counts(), "x (server) 2, "; !strings.HasPrefix(c, want) || !strings.Contains(c, "x (client) 1") || !strings.Contains(c, "y (internal) 1") {
		t.Errorf("counts %q, want x (server) 2 first, x (client) 1 and y (internal) 1", c)
	}
	if err := (countingCodec{r}).Unmarshal(data[:len(data)-3], &got); err == nil {
		t.Error("a truncated request was counted without an error")
	}
}
