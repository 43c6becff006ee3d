package nsync_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/nsync"
)

// TestSecretAppEnv: an app's env entry named in secret_env reaches its LRP as a secret env var
// (EnvironmentVariable.secret) with its value; nsync's answers redact it for read-only and show
// it to admin, in DesireApp's answer and in Apps; a secret_env naming no env entry is refused,
// naming the field.
func TestSecretAppEnv(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "nsync", "admin", "read-only")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *nsync.Config) { c.TLS = pki["nsync"] }, nil)
	e.clientTLS = pki["admin"]
	e.startNsync(t)
	ctx := ctxT(t)
	a := app("web", "space-a", 1)
	a.Env["DB_PASSWORD"] = "s3cret"
	a.SecretEnv = []string{"DB_PASSWORD"}
	resp, err := e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: a})
	if err != nil {
		t.Fatal(err)
	}
	if v := resp.GetApp().GetEnv()["DB_PASSWORD"]; v != "s3cret" {
		t.Errorf("admin's DesireApp answer: DB_PASSWORD=%q", v)
	}
	d, ok := e.desired(t, resp.GetProcessGuid())
	if !ok {
		t.Fatal("no LRP desired")
	}
	for _, ev := range d.GetEnv() {
		if secret := ev.GetName() == "DB_PASSWORD"; ev.GetSecret() != secret || (secret && ev.GetValue() != "s3cret") {
			t.Errorf("LRP env %s=%q secret=%v", ev.GetName(), ev.GetValue(), ev.GetSecret())
		}
	}

	conn, err := grpcx.Dial(e.svc.Addr().String(), grpcx.ClientConfig{TLS: pki["read-only"]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ro, err := nsyncv1.NewNsyncServiceClient(conn).Apps(ctx, &nsyncv1.AppsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if env := ro.GetApps()[0].GetApp().GetEnv(); env["DB_PASSWORD"] != models.Redacted || env["GREETING"] != "hi" {
		t.Errorf("read-only's Apps: env %v, want DB_PASSWORD redacted and GREETING clear", env)
	}
	if v := e.appInfo(t, "web").GetApp().GetEnv()["DB_PASSWORD"]; v != "s3cret" {
		t.Errorf("admin's Apps: DB_PASSWORD=%q", v)
	}
	// The version history carries each version's definition: redacted alike.
	vs, err := nsyncv1.NewNsyncServiceClient(conn).AppVersions(ctx, &nsyncv1.AppVersionsRequest{AppGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if len(vs.GetVersions()) == 0 {
		t.Fatal("read-only's AppVersions: no versions")
	}
	for _, v := range vs.GetVersions() {
		if env := v.GetApp().GetEnv(); env["DB_PASSWORD"] != models.Redacted || env["GREETING"] != "hi" {
			t.Errorf("read-only's AppVersions: version %d env %v, want DB_PASSWORD redacted", v.GetVersion(), env)
		}
	}
	if vs, err := e.nsync.AppVersions(ctx, &nsyncv1.AppVersionsRequest{AppGuid: "web"}); err != nil || vs.GetVersions()[0].GetApp().GetEnv()["DB_PASSWORD"] != "s3cret" {
		t.Errorf("admin's AppVersions: %v, %v", vs, err)
	}

	bad := app("bad", "space-a", 1)
	bad.SecretEnv = []string{"NOPE"}
	_, err = e.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: bad})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "app.secret_env[0]") {
		t.Fatalf("DesireApp with an unknown secret_env = %v, want InvalidArgument naming app.secret_env[0]", err)
	}
}
