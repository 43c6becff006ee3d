package bbs_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// A rep's certificate (spiffe://gavel/rep/<cell_id>) lets it change only its own cell's work.
func TestRepCertificateScopesWritesToItsCell(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "bbs", "rep/cell-1", "admin")
	if err != nil {
		t.Fatal(err)
	}
	env := bbstest.Start(t, func(c *bbs.Config) { c.TLS = pki["bbs"] })
	client := func(name string) bbsv1.BBSServiceClient { return tlsClient(t, env.Addr, pki[name]) }
	operator, rep := client("admin"), client("rep/cell-1")
	ctx := ctxT(t)

	if _, err := operator.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 2)}); err != nil {
		t.Fatalf("operator desire: %v", err)
	}
	_, err = rep.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("rogue", 1)})
	wantCode(t, err, codes.PermissionDenied)
	_, err = rep.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"})
	wantCode(t, err, codes.PermissionDenied)

	mine := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-0", CellId: "cell-1"}
	theirs := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-1", CellId: "cell-2"}
	if _, err := rep.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0, InstanceKey: mine}); err != nil {
		t.Fatalf("claim on its own cell: %v", err)
	}
	rev := storeRevision(t, env)
	_, err = rep.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 1, InstanceKey: theirs})
	wantCode(t, err, codes.PermissionDenied)
	// A batch with one item on another cell is refused whole: no item of it is made.
	_, err = rep.ClaimActualLRPs(ctx, &bbsv1.ClaimActualLRPsRequest{Claims: []*bbsv1.ClaimActualLRPRequest{
		{ProcessGuid: "web", Index: 0, InstanceKey: mine}, {ProcessGuid: "web", Index: 1, InstanceKey: theirs}}})
	wantCode(t, err, codes.PermissionDenied)
	_, err = rep.StartActualLRPs(ctx, &bbsv1.StartActualLRPsRequest{Starts: []*bbsv1.StartActualLRPRequest{
		{ProcessGuid: "web", Index: 1, InstanceKey: theirs, NetInfo: &modelsv1.ActualLRPNetInfo{Address: "10.0.0.1"}}}})
	wantCode(t, err, codes.PermissionDenied)
	_, err = rep.RemoveActualLRP(ctx, &bbsv1.RemoveActualLRPRequest{ProcessGuid: "web", Index: 0})
	wantCode(t, err, codes.PermissionDenied) // without an instance key it could remove anyone's
	_, err = rep.CompleteTask(ctx, &bbsv1.CompleteTaskRequest{TaskGuid: "t", CellId: "cell-2"})
	wantCode(t, err, codes.PermissionDenied)
	if got := storeRevision(t, env); got != rev {
		t.Fatalf("refused calls changed the store: revision %d -> %d", rev, got)
	}
	if resp, err := rep.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{}); err != nil || len(resp.GetActualLrps()) != 2 {
		t.Fatalf("a rep may read: %v %v", resp, err)
	}
	// An admin may change any cell's instances.
	if _, err := operator.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 1, InstanceKey: theirs}); err != nil {
		t.Fatalf("operator claim: %v", err)
	}
}

// Each identity can do only its job: read-only and the route-emitter read, nsync works only in
// its domains, the auctioneer only reports placement failures, an unknown identity is refused;
// refusals name the identity and the call and change nothing.
func TestRolesByCertificateIdentity(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "bbs", "admin", "read-only", "route-emitter", "nsync", "auctioneer", "stranger")
	if err != nil {
		t.Fatal(err)
	}
	env := bbstest.Start(t, func(c *bbs.Config) { c.TLS = pki["bbs"] })
	client := func(name string) bbsv1.BBSServiceClient { return tlsClient(t, env.Addr, pki[name]) }
	ctx := ctxT(t)
	admin := client("admin")
	if _, err := admin.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 1)}); err != nil {
		t.Fatalf("admin desire: %v", err)
	}
	cfApp := lrp("cf-web", 1)
	cfApp.Domain = "cf-apps"
	rev := storeRevision(t, env)

	denied := []struct {
		name string
		call func() error
		want string
	}{
		{"read-only desires", func() error {
			_, err := client("read-only").DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("ro", 1)})
			return err
		}, "identity spiffe://gavel/read-only (role read-only) may not call /gavel.bbs.v1.BBSService/DesireLRP"},
		{"route-emitter removes", func() error {
			_, err := client("route-emitter").RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"})
			return err
		}, "identity spiffe://gavel/route-emitter (role route-emitter) may not call /gavel.bbs.v1.BBSService/RemoveDesiredLRP"},
		{"nsync outside its domains", func() error {
			_, err := client("nsync").RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"})
			return err
		}, `domain "` + lrp("x", 1).GetDomain() + `" is not one of nsync's`},
		{"auctioneer desires", func() error {
			_, err := client("auctioneer").DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("au", 1)})
			return err
		}, "role auctioneer does not grant DesireLRP"},
		{"unknown identity reads", func() error {
			_, err := client("stranger").Cells(ctx, &bbsv1.CellsRequest{})
			return err
		}, "identity spiffe://gavel/stranger has no role here and may not call /gavel.bbs.v1.BBSService/Cells"},
	}
	for _, tt := range denied {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			wantCode(t, err, codes.PermissionDenied)
			if !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Fatalf("message %q does not contain %q", status.Convert(err).Message(), tt.want)
			}
		})
	}
	if got := storeRevision(t, env); got != rev {
		t.Fatalf("refused calls changed the store: revision %d -> %d", rev, got)
	}

	// What each role is for works.
	if _, err := client("read-only").DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{}); err != nil {
		t.Fatalf("read-only lists: %v", err)
	}
	stream, err := client("route-emitter").SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil && status.Code(err) == codes.PermissionDenied {
		t.Fatalf("route-emitter subscribes: %v", err)
	}
	nsync := client("nsync")
	if _, err := nsync.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: cfApp}); err != nil {
		t.Fatalf("nsync desires in cf-apps: %v", err)
	}
	if _, err := nsync.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "cf-web"}); err != nil {
		t.Fatalf("nsync removes in cf-apps: %v", err)
	}
	if _, err := client("auctioneer").FailActualLRP(ctx, &bbsv1.FailActualLRPRequest{ProcessGuid: "web", Index: 0,
		PlacementError: &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_CELL_MISMATCH, Message: "no cell"}}); err != nil {
		t.Fatalf("auctioneer reports a placement failure: %v", err)
	}
}

// tlsClient is a BBS client presenting cfg's certificate.
func tlsClient(t *testing.T, addr string, cfg tlsx.Config) bbsv1.BBSServiceClient {
	t.Helper()
	conn, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return bbsv1.NewBBSServiceClient(conn)
}
