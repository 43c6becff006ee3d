package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep"
)

// TestSecretEnvEndToEnd runs a cluster over mutual TLS with every service logging at trace
// level into one buffer and an on_create hook capturing each container's spec. Admin desires an
// LRP and a task, each with a secret and a plain env var: the rep starts both with the secret
// values in their specs, `gavel lrp web -o json` prints the value as admin and "<redacted>"
// (the plain var intact) as read-only, and no service log line, audit line included, carries
// either secret value.
func TestSecretEnvEndToEnd(t *testing.T) {
	const lrpSecret, taskSecret = "e2e-lrp-s3cr3t", "e2e-task-s3cr3t"
	logs := &testkit.SyncBuffer{}
	specs := t.TempDir()
	hook := filepath.Join(t.TempDir(), "capture.sh")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\ncat > \""+specs+"/$GAVEL_CONTAINER_GUID.json\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := rep.Default()
	cfg.CellID, cfg.Zone = "cell-1", "z1"
	cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": "/var/gavel/rootfs/cflinuxfs4"} // the sim backend never reads it
	cfg.Backend = rep.BackendSim
	cfg.Capacity = rep.Capacity{MemoryMB: 1024, DiskMB: 4096, Containers: 10}
	cfg.Sim.StartLatency = rep.Duration(50 * time.Millisecond)
	cfg.Hooks.OnCreate = []string{hook}
	c := devcluster.New(devcluster.Config{
		Dir:               t.TempDir(),
		BBSAddress:        "127.0.0.1:0",
		AuctioneerAddress: "127.0.0.1:0",
		UnsafeNoFsync:     true,
		Cells:             []devcluster.Cell{{Config: cfg}},
		TLS:               true,
		Logger:            hclog.New(&hclog.LoggerOptions{Name: "cluster", Level: hclog.Trace, Output: logs}),
	})
	testkit.Start(t, "cluster", c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		resp, err := c.BBS.Cells(ctx, &bbsv1.CellsRequest{})
		return err == nil && len(resp.GetCells()) == 1, fmt.Sprint(resp, err)
	}, "the cell registered")

	lrpEnv := []*modelsv1.EnvironmentVariable{{Name: "GREETING", Value: "hello"}, {Name: "DB_PASSWORD", Value: lrpSecret, Secret: true}}
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: &modelsv1.DesiredLRP{
		ProcessGuid: "web", Domain: "apps", Rootfs: "preloaded:cflinuxfs4", Instances: 1, MemoryMb: 64, DiskMb: 64,
		Env: lrpEnv, Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
	}}); err != nil {
		t.Fatalf("desire: %v", err)
	}
	if _, err := c.BBS.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: "job", Domain: "apps", Definition: &modelsv1.TaskDefinition{
		Rootfs: "preloaded:cflinuxfs4", MemoryMb: 64, DiskMb: 64,
		Env:    []*modelsv1.EnvironmentVariable{{Name: "TOKEN", Value: taskSecret, Secret: true}},
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/job"}}},
	}}); err != nil {
		t.Fatalf("desire task: %v", err)
	}

	// The rep got the values: the container specs its hook captured carry them.
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		files, _ := filepath.Glob(filepath.Join(specs, "*.json"))
		var all strings.Builder
		for _, f := range files {
			b, _ := os.ReadFile(f)
			all.Write(b)
		}
		s := all.String()
		return strings.Contains(s, lrpSecret) && strings.Contains(s, taskSecret), fmt.Sprintf("%d specs: %s", len(files), s)
	}, "both containers started with their secrets")

	cli := func(identity string) *env {
		id := c.PKI[identity]
		return &env{c: c, args: []string{"--bbs", c.BBSAddress, "--tls-cert", id.CertFile, "--tls-key", id.KeyFile, "--tls-ca", id.CAFile}}
	}
	r := cli("admin").ok(t, "lrp", "web", "-o", "json")
	if !strings.Contains(r.stdout, lrpSecret) {
		t.Errorf("admin's gavel lrp web -o json lacks the secret:\n%s", r.stdout)
	}
	r = cli("read-only").ok(t, "lrp", "web", "-o", "json")
	if strings.Contains(r.stdout, lrpSecret) || !strings.Contains(r.stdout, `"<redacted>"`) || !strings.Contains(r.stdout, `"hello"`) {
		t.Errorf("read-only's gavel lrp web -o json: want DB_PASSWORD redacted and GREETING intact:\n%s", r.stdout)
	}

	// Stop everything that logs before reading the logs.
	if _, err := c.BBS.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"}); err != nil {
		t.Fatalf("remove: %v", err)
	}
	text := logs.String()
	if !strings.Contains(text, "audit") || !strings.Contains(text, "DesireLRP") {
		t.Fatalf("the captured logs lack the audit of DesireLRP; is the capture working?\n%s", text)
	}
	for _, secret := range []string{lrpSecret, taskSecret} {
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(line, secret) {
				t.Errorf("a log line carries the secret %q: %s", secret, line)
			}
		}
	}
}
