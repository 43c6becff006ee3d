package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// Least privilege over mutual TLS on the built BBS and CLI binaries: each identity does only
// its job, callers without a certificate of the cluster's CA are refused, refusals change
// nothing and mutating calls are audited with the identity.
func TestAuthorizationOverMutualTLS(t *testing.T) {
	bbsBin, gavelBin := binary(t, "bbs"), binary(t, "gavel")
	emb, cli := etcdtest.Start(t)
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "bbs", "admin", "read-only", "route-emitter", "rep/cell-1")
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ReservedAddr(t)
	bbs := startProc(t, "bbs", bbsBin, "-listen", addr,
		"-tls-cert", pki["bbs"].CertFile, "-tls-key", pki["bbs"].KeyFile, "-tls-ca", pki["bbs"].CAFile,
		"-etcd-endpoints", strings.Join(emb.Endpoints(), ","), "-etcd-insecure", "-log-format", "json")
	client := func(name string) bbsv1.BBSServiceClient {
		conn, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: pki[name]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return bbsv1.NewBBSServiceClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := client("admin")
	web := &modelsv1.DesiredLRP{ProcessGuid: "web", Domain: "apps", Rootfs: "preloaded:cflinuxfs4", Instances: 2, MemoryMb: 64, DiskMb: 64,
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/web"}}}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err = admin.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: web})
		if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("admin desires over mTLS: %v", err)
	}
	revision := func() int64 {
		resp, err := cli.Get(ctx, "/gavel-probe")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	before := revision()

	// A rep may claim on its own cell, never on another.
	rep := client("rep/cell-1")
	_, err = rep.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 1,
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-1", CellId: "cell-2"}})
	wantDenied(t, err, "identity spiffe://gavel/rep/cell-1 (role rep/cell-1) may not call /gavel.bbs.v1.BBSService/ClaimActualLRP")
	_, err = rep.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: "web", Index: 1,
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-1", CellId: "cell-2"},
		NetInfo:     &modelsv1.ActualLRPNetInfo{Address: "10.0.0.2"}})
	wantDenied(t, err, "rep of cell cell-1 may only change instances on its own cell")

	// The route-emitter reads and subscribes but cannot remove an LRP.
	emitter := client("route-emitter")
	_, err = emitter.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"})
	wantDenied(t, err, "identity spiffe://gavel/route-emitter (role route-emitter) may not call /gavel.bbs.v1.BBSService/RemoveDesiredLRP")
	if _, err := emitter.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{}); err != nil {
		t.Fatalf("route-emitter lists: %v", err)
	}

	// A read-only identity cannot desire: through the CLI binary, with its exit code.
	lrpFile := filepath.Join(t.TempDir(), "lrp.yaml")
	if err := os.WriteFile(lrpFile, []byte("processGuid: ro\ndomain: apps\nrootfs: preloaded:cflinuxfs4\ninstances: 1\naction: {run: {path: /bin/x}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ro := pki["read-only"]
	out, err := exec.Command(gavelBin, "--bbs", addr, "--tls-cert", ro.CertFile, "--tls-key", ro.KeyFile, "--tls-ca", ro.CAFile,
		"desire-lrp", lrpFile).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 ||
		!strings.Contains(string(out), "permission denied: identity spiffe://gavel/read-only (role read-only) may not call /gavel.bbs.v1.BBSService/DesireLRP") {
		t.Fatalf("gavel desire-lrp as read-only: %v\n%s", err, out)
	}
	if out, err := exec.Command(gavelBin, "--bbs", addr, "--tls-cert", ro.CertFile, "--tls-key", ro.KeyFile, "--tls-ca", ro.CAFile,
		"lrps").CombinedOutput(); err != nil || !strings.Contains(string(out), "web") {
		t.Fatalf("gavel lrps as read-only: %v\n%s", err, out)
	}

	// No certificate, or one from another CA: refused before any call.
	caPEM, err := os.ReadFile(pki["admin"].CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	other, err := tlsx.GenerateDevPKI(t.TempDir(), "admin")
	if err != nil {
		t.Fatal(err)
	}
	foreign := other["admin"]
	foreign.CAFile = pki["admin"].CAFile
	foreignCreds, err := foreign.ClientCredentials()
	if err != nil {
		t.Fatal(err)
	}
	for name, creds := range map[string]credentials.TransportCredentials{
		"no certificate": credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
		"another CA":     foreignCreds,
	} {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		short, c2 := context.WithTimeout(ctx, 5*time.Second)
		_, err = bbsv1.NewBBSServiceClient(conn).DesireLRP(short, &bbsv1.DesireLRPRequest{DesiredLrp: web})
		c2()
		conn.Close()
		if err == nil {
			t.Fatalf("%s: the call was accepted", name)
		}
		t.Logf("%s: refused with %v", name, err)
	}
	if got := revision(); got != before {
		t.Fatalf("refused calls changed the store: revision %d -> %d", before, got)
	}

	// The audit log names the identity of every mutating call, and of each refusal.
	waitOutput(t, bbs, `"identity":"spiffe://gavel/admin"`, `"call":"/gavel.bbs.v1.BBSService/DesireLRP"`, `"@message":"audit"`)
	waitOutput(t, bbs, `"identity":"spiffe://gavel/route-emitter"`, `"@message":"refused"`)
}

// wantDenied checks a PermissionDenied whose message contains want.
func wantDenied(t *testing.T, err error, want string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("got %v, want PermissionDenied containing %q", err, want)
	}
}

// waitOutput waits until one line of p's output holds every part.
func waitOutput(t *testing.T, p *proc, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, line := range strings.Split(p.Out.String(), "\n") {
			all := true
			for _, part := range parts {
				all = all && strings.Contains(line, part)
			}
			if all {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line of %s's output holds %q", p.Name, parts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
