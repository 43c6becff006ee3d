package nsync_test

import (
	"maps"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/nsync"
)

// Over mutual TLS, admin may make every call, read-only may only list apps and pools, and every
// other identity (a known Gavel service or a stranger) is refused with PermissionDenied naming
// the identity and the call, changing nothing; mutating calls are audited with the identity.
func TestRolesByCertificateIdentity(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "nsync", "admin", "read-only", "route-emitter", "stranger")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *nsync.Config) { c.TLS = pki["nsync"] }, nil)
	audit := &testkit.SyncBuffer{}
	e.logger = hclog.New(&hclog.LoggerOptions{Name: "nsync", Level: hclog.Info, Output: audit})
	e.clientTLS = pki["admin"]
	e.startNsync(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nsync's log:\n%s", audit.String())
		}
	})
	client := func(name string) nsyncv1.NsyncServiceClient {
		conn, err := grpcx.Dial(e.svc.Addr().String(), grpcx.ClientConfig{TLS: pki[name]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return nsyncv1.NewNsyncServiceClient(conn)
	}
	ctx := ctxT(t)
	admin := e.nsync
	if _, err := admin.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("web", "space-a", 1)}); err != nil {
		t.Fatalf("admin desires an app: %v", err)
	}
	if _, err := admin.CreatePlacementPool(ctx, &nsyncv1.CreatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{Name: "prod", Require: []string{"production"}}}); err != nil {
		t.Fatalf("admin creates a pool: %v", err)
	}
	// Once its instance runs nothing changes by itself, so what the refused calls do shows.
	e.waitRunning(t, "web-v1", 1)
	_, before := etcdState(t, e.cluster.Etcd)

	readOnly, emitter, stranger := client("read-only"), client("route-emitter"), client("stranger")
	denied := []struct {
		name string
		call func() error
		want string
	}{
		{"read-only desires", func() error {
			_, err := readOnly.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app("ro", "space-a", 1)})
			return err
		}, "identity spiffe://gavel/read-only (role read-only) may not call /gavel.nsync.v1.NsyncService/DesireApp"},
		{"read-only stops", func() error {
			_, err := readOnly.StopApp(ctx, &nsyncv1.StopAppRequest{Guid: "web", Delete: true})
			return err
		}, "identity spiffe://gavel/read-only (role read-only) may not call /gavel.nsync.v1.NsyncService/StopApp"},
		{"read-only deletes a pool", func() error {
			_, err := readOnly.DeletePlacementPool(ctx, &nsyncv1.DeletePlacementPoolRequest{Name: "prod"})
			return err
		}, "identity spiffe://gavel/read-only (role read-only) may not call /gavel.nsync.v1.NsyncService/DeletePlacementPool"},
		{"route-emitter lists apps", func() error {
			_, err := emitter.Apps(ctx, &nsyncv1.AppsRequest{})
			return err
		}, "identity spiffe://gavel/route-emitter (role route-emitter) may not call /gavel.nsync.v1.NsyncService/Apps: role route-emitter has no calls on nsync"},
		{"route-emitter binds a pool", func() error {
			_, err := emitter.BindPlacementPool(ctx, &nsyncv1.BindPlacementPoolRequest{Pool: "prod", SpaceGuid: "space-a"})
			return err
		}, "identity spiffe://gavel/route-emitter (role route-emitter) may not call /gavel.nsync.v1.NsyncService/BindPlacementPool"},
		{"unknown identity lists pools", func() error {
			_, err := stranger.PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
			return err
		}, "identity spiffe://gavel/stranger has no role here and may not call /gavel.nsync.v1.NsyncService/PlacementPools"},
	}
	for _, tt := range denied {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("got %v, want PermissionDenied", err)
			}
			if !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Fatalf("message %q does not contain %q", status.Convert(err).Message(), tt.want)
			}
		})
	}
	if _, after := etcdState(t, e.cluster.Etcd); !maps.Equal(before, after) {
		t.Fatalf("refused calls changed what is stored:\nbefore %v\nafter  %v", before, after)
	}

	// read-only lists apps and pools.
	apps, err := readOnly.Apps(ctx, &nsyncv1.AppsRequest{})
	if err != nil || len(apps.GetApps()) != 1 {
		t.Fatalf("read-only lists apps: %v %v", apps, err)
	}
	pools, err := readOnly.PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
	if err != nil || len(pools.GetPools()) != 1 {
		t.Fatalf("read-only lists pools: %v %v", pools, err)
	}

	// The audit log has admin's mutating calls and the refusals, never the reads.
	log := audit.String()
	for _, want := range []string{
		"identity=spiffe://gavel/admin role=admin call=/gavel.nsync.v1.NsyncService/DesireApp code=OK",
		"identity=spiffe://gavel/admin role=admin call=/gavel.nsync.v1.NsyncService/CreatePlacementPool code=OK",
		"refused: identity=spiffe://gavel/read-only role=read-only call=/gavel.nsync.v1.NsyncService/StopApp",
		"refused: identity=spiffe://gavel/stranger call=/gavel.nsync.v1.NsyncService/PlacementPools",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the audit log lacks %q", want)
		}
	}
	if strings.Contains(log, "call=/gavel.nsync.v1.NsyncService/Apps code=") {
		t.Errorf("a read was audited:\n%s", log)
	}
}
