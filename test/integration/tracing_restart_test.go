package integration

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/nsync"
)

// spanTree is one trace's spans, by id.
type spanTree map[string]*tracepb.Span

func newSpanTree(spans []*tracepb.Span) spanTree {
	t := spanTree{}
	for _, s := range spans {
		t[hex.EncodeToString(s.GetSpanId())] = s
	}
	return t
}

// chain is the names from s's parent up to the root, joined with " < ".
func (t spanTree) chain(s *tracepb.Span) string {
	var out []string
	for p := t[hex.EncodeToString(s.GetParentSpanId())]; p != nil; p = t[hex.EncodeToString(p.GetParentSpanId())] {
		out = append(out, p.GetName())
	}
	return strings.Join(out, " < ")
}

// named is the trace's spans called name whose attribute key has value (any, with key "").
func (t spanTree) named(name, key, value string) []*tracepb.Span {
	var out []*tracepb.Span
	for _, s := range t {
		if s.GetName() != name {
			continue
		}
		if key == "" {
			out = append(out, s)
			continue
		}
		for _, a := range s.GetAttributes() {
			if a.GetKey() == key && a.GetValue().GetStringValue() == value {
				out = append(out, s)
			}
		}
	}
	return out
}

// TestRoutesAndRestartJoinTheTrace follows an app pushed and restarted through nsync: the
// route-emitter's publication of each instance's routes is a span of the push's trace, under
// the BBS's StartActualLRP that made the instance RUNNING (the record carries that call's
// trace context); and a restart is one trace of nsync's steps (desire the next version, wait
// for it to run, drain the old one), with the new version's DesireLRP at the BBS, its
// placement and its start on the cell inside them.
func TestRoutesAndRestartJoinTheTrace(t *testing.T) {
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
	t.Cleanup(func() {
		_ = shutdown(context.Background())
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
	})

	cfg := devcluster.Config{
		Cells:   []devcluster.Cell{simCell("cell-0", "z1", nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)},
		Routing: true, RouteEmitterAddress: "127.0.0.1:0", RouterHTTPAddress: "127.0.0.1:0", RouterAdminAddress: "127.0.0.1:0",
		Nsync: true, NsyncAddress: "127.0.0.1:0",
		ConfigureNsync: func(c *nsync.Config) { c.RouteDrain = nsync.Duration(100 * time.Millisecond) },
	}
	cfg.Dir, cfg.BBSAddress, cfg.AuctioneerAddress = t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	cfg.UnsafeNoFsync, cfg.Logger = true, logtest.New(t)
	c := devcluster.New(cfg)
	testkit.Start(t, "cluster", c)
	tracer := tracing.Tracer("test")
	app := &nsyncv1.App{Guid: "web", Name: "web", SpaceGuid: "space-a", Stack: "cflinuxfs4", Command: "/bin/web",
		Instances: 2, MemoryMb: 64, DiskMb: 64, Ports: []uint32{8080}}

	// wait collects the spans of trace id until every one of want is there.
	wait := func(t *testing.T, id string, want ...string) spanTree {
		t.Helper()
		var tree spanTree
		testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
			tree = newSpanTree(rcv.trace(id))
			var missing []string
			for _, w := range want {
				name, attr, _ := strings.Cut(w, "@")
				if len(tree.named(name, "gavel.process_guid", attr)) == 0 && (attr != "" || len(tree.named(name, "", "")) == 0) {
					missing = append(missing, w)
				}
			}
			return len(missing) == 0, "missing spans: " + strings.Join(missing, ", ")
		}, "the trace's spans received")
		for _, s := range tree {
			if len(s.GetParentSpanId()) > 0 && tree[hex.EncodeToString(s.GetParentSpanId())] == nil {
				t.Errorf("span %s has a parent outside the trace", s.GetName())
			}
		}
		return tree
	}

	t.Run("route publication", func(t *testing.T) {
		ctx, root := tracer.Start(t.Context(), "push web")
		if _, err := c.Nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app}); err != nil {
			t.Fatal(err)
		}
		root.End()
		tree := wait(t, root.SpanContext().TraceID().String(), "routeemitter.publish_routes@web-v1", "rep.start_lrp")
		pubs := tree.named("routeemitter.publish_routes", "gavel.process_guid", "web-v1")
		if len(pubs) != 2 {
			t.Errorf("%d route publications of web-v1 in the push's trace, want one per instance (2)", len(pubs))
		}
		for _, p := range pubs {
			if ch := tree.chain(p); !strings.HasPrefix(ch, "gavel.bbs.v1.BBSService/StartActualLRP") || !strings.Contains(ch, "rep.start_lrp") || !strings.HasSuffix(ch, "push web") {
				t.Errorf("route publication under %q, want the BBS's StartActualLRP < … rep.start_lrp < … push web", ch)
			}
		}
	})

	t.Run("restart", func(t *testing.T) {
		ctx, root := tracer.Start(t.Context(), "restart web")
		rr, err := c.Nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "web"})
		if err != nil || rr.GetProcessGuid() != "web-v2" {
			t.Fatalf("RestartApp: %v %v", rr, err)
		}
		root.End()
		tree := wait(t, root.SpanContext().TraceID().String(), "nsync.restart", "nsync.restart.desire", "nsync.restart.wait_running",
			"nsync.restart.drain", "gavel.bbs.v1.BBSService/DesireLRP", "auctioneer.place", "rep.start_lrp", "routeemitter.publish_routes@web-v2")
		want := map[string]string{
			"nsync.restart.desire":       "nsync.restart",
			"nsync.restart.wait_running": "nsync.restart",
			"nsync.restart.drain":        "nsync.restart",
		}
		for name, parent := range want {
			for _, s := range tree.named(name, "", "") {
				if ch := tree.chain(s); !strings.HasPrefix(ch, parent) {
					t.Errorf("%s under %q, want %s", name, ch, parent)
				}
			}
		}
		for _, s := range tree.named("gavel.bbs.v1.BBSService/DesireLRP", "", "") {
			if s.GetKind() == tracepb.Span_SPAN_KIND_SERVER && !strings.Contains(tree.chain(s), "nsync.restart.desire") {
				t.Errorf("the BBS's DesireLRP of the new version is under %q, want nsync.restart.desire", tree.chain(s))
			}
		}
		for _, s := range tree.named("rep.start_lrp", "", "") {
			if ch := tree.chain(s); !strings.Contains(ch, "nsync.restart.desire") || !strings.HasSuffix(ch, "restart web") {
				t.Errorf("rep.start_lrp under %q, want the restart's desire step", ch)
			}
		}
	})

	// A deployment is one trace too: the DeployApp call, then each step the leader takes later
	// (scaling the two versions, in the trace recorded with the deployment), with the BBS's
	// UpdateDesiredLRP, the placement and the start of the new version's instances inside them,
	// and the deployment's end.
	t.Run("deployment", func(t *testing.T) {
		ctx, root := tracer.Start(t.Context(), "deploy web")
		next := proto.Clone(app).(*nsyncv1.App)
		next.Command = "/bin/web --v3"
		resp, err := c.Nsync.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: next})
		if err != nil || resp.GetDeployment() == nil {
			t.Fatalf("DeployApp: %v %v", resp, err)
		}
		root.End()
		tree := wait(t, root.SpanContext().TraceID().String(), "nsync.deploy", "nsync.deployment.scale",
			"gavel.bbs.v1.BBSService/UpdateDesiredLRP", "rep.start_lrp", "nsync.deployment.end")
		for _, s := range tree.named("nsync.deployment.scale", "", "") {
			if ch := tree.chain(s); !strings.HasSuffix(ch, "deploy web") {
				t.Errorf("nsync.deployment.scale under %q, want the deploy call's trace", ch)
			}
		}
		for _, s := range tree.named("rep.start_lrp", "", "") {
			if ch := tree.chain(s); !strings.Contains(ch, "nsync.deployment.scale") && !strings.Contains(ch, "nsync.deploy") {
				t.Errorf("rep.start_lrp under %q, want a deployment step", ch)
			}
		}
	})
}
