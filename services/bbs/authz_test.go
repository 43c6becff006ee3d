package bbs_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// A rep's certificate (spiffe://gavel/rep/<cell_id>) lets it change only its own cell's work.
func TestRepCertificateScopesWritesToItsCell(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "bbs", "rep/cell-1", "operator")
	if err != nil {
		t.Fatal(err)
	}
	env := bbstest.Start(t, func(c *bbs.Config) { c.TLS = pki["bbs"] })
	client := func(name string) bbsv1.BBSServiceClient {
		conn, err := grpcx.Dial(env.Addr, grpcx.ClientConfig{TLS: pki[name]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return bbsv1.NewBBSServiceClient(conn)
	}
	operator, rep := client("operator"), client("rep/cell-1")
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
	// Anyone else may change any cell's instances (the auctioneer, operators).
	if _, err := operator.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 1, InstanceKey: theirs}); err != nil {
		t.Fatalf("operator claim: %v", err)
	}
}
