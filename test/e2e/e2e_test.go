// Package e2e tests Gavel's built binaries end to end: real processes, real sockets, an
// embedded etcd started by the test.
package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// TestMain removes the built binaries after the run.
func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveBinaries()
	os.Exit(code)
}

// binary is the path of the project's binary name, built once per test run (testkit.Binary).
// Under -short (make test-fast) every e2e test is skipped here, before anything is built.
func binary(t testing.TB, name string) string {
	t.Helper()
	return testkit.Binary(t, name)
}

// syncBuffer collects a process's output for failure messages.
type syncBuffer = testkit.SyncBuffer

func TestBBSBinaryWithMutualTLS(t *testing.T) {
	bbsBin := binary(t, "bbs")
	emb, _ := etcdtest.Start(t)
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "bbs", "admin")
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ReservedAddr(t)
	out := &syncBuffer{}
	cmd := exec.Command(bbsBin,
		"-listen", addr,
		"-tls-cert", pki["bbs"].CertFile, "-tls-key", pki["bbs"].KeyFile, "-tls-ca", pki["bbs"].CAFile,
		"-etcd-endpoints", strings.Join(emb.Endpoints(), ","), "-etcd-insecure",
		"-log-format", "json")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("bbs output:\n%s", out.String())
		}
	})

	conn, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: pki["admin"]})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := bbsv1.NewBBSServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	desire := &bbsv1.DesireLRPRequest{DesiredLrp: &modelsv1.DesiredLRP{
		ProcessGuid: "web", Domain: "apps", Rootfs: "docker:///library/nginx#1", Instances: 2,
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/web"}}},
	}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err = client.DesireLRP(ctx, desire)
		if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("DesireLRP over mTLS: %v", err)
	}
	resp, err := client.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
	if err != nil || len(resp.GetActualLrps()) != 2 {
		t.Fatalf("ActualLRPs: %v %v", resp, err)
	}

	// A client with a certificate from another CA, and a plaintext client, are refused.
	other, err := tlsx.GenerateDevPKI(t.TempDir(), "intruder")
	if err != nil {
		t.Fatal(err)
	}
	intruder := other["intruder"]
	intruder.CAFile = pki["admin"].CAFile
	for name, cfg := range map[string]tlsx.Config{"foreign CA": intruder, "plaintext": {Insecure: true}} {
		bad, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		shortCtx, c2 := context.WithTimeout(ctx, 3*time.Second)
		_, err = bbsv1.NewBBSServiceClient(bad).Cells(shortCtx, &bbsv1.CellsRequest{})
		c2()
		bad.Close()
		if err == nil {
			t.Fatalf("%s client reached the mTLS BBS", name)
		}
	}

	// SIGTERM stops it cleanly.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("bbs exited with %v after SIGTERM", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("bbs did not stop within 15s of SIGTERM")
	}
}

func TestBBSBinaryRefusesBadConfig(t *testing.T) {
	out, err := exec.Command(binary(t, "bbs"), "-etcd-endpoints", "http://127.0.0.1:1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "CertFile is required unless Insecure") {
		t.Fatalf("want a refusal naming the TLS setting, got %v: %s", err, out)
	}
}
