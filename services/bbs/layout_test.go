package bbs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// previousReleaseStore writes, over cli, a store as the release before layout versioning left
// it: a BBS without encryption desires LRPs (secretLRP) and a task, a cell claims and starts
// every instance (work running), and the layout key, which that release did not write, is
// removed. It returns the mod revision of every actual LRP record.
func previousReleaseStore(t *testing.T, cli *clientv3.Client, guids ...string) map[string]int64 {
	t.Helper()
	env := bbstest.StartOn(t, cli)
	lrpRegisterCell(t, env, "cell-1", "z1")
	for _, g := range guids {
		if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: secretLRP(g)}); err != nil {
			t.Fatal(err)
		}
		ik := lrpInstKey("ig-"+g, "cell-1")
		lrpClaim(t, env, g, 0, ik)
		lrpStart(t, env, g, 0, ik, lrpNetInfo(61000))
	}
	def := taskDefinition()
	def.Env = []*modelsv1.EnvironmentVariable{{Name: "API_KEY", Value: "s3cret-env-task"}}
	taskDesire(t, env, "job", "tasks", def)
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctxT(t), layout.Key(store.LayoutService)); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctxT(t), "/gavel/v1/actual/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.ModRevision
	}
	if len(out) != len(guids) {
		t.Fatalf("%d actual LRPs, want %d", len(out), len(guids))
	}
	return out
}

// TestLayoutUpgradeFromThePreviousRelease is the acceptance test "Upgrade": a store written by
// the previous release's layout (no layout key, run infos and tasks clear; made by
// previousReleaseStore) is migrated when a BBS of this release starts with encryption on,
// before it serves: every run info and task is sealed, the layout key says 2, and the running
// instances are untouched (their records are not rewritten: nothing restarts). A BBS whose code
// is older than the store then refuses to start, naming both versions, and writes nothing.
func TestLayoutUpgradeFromThePreviousRelease(t *testing.T) {
	_, cli := etcdtest.Start(t)
	guids := make([]string, 70) // more than one migration batch
	for i := range guids {
		guids[i] = fmt.Sprintf("web-%02d", i)
	}
	actualRevs := previousReleaseStore(t, cli, guids...)
	if s, _, err := layout.Read(ctxT(t), cli, store.LayoutService); err != nil || s.Version != layout.Base {
		t.Fatalf("fixture layout %+v (%v), want version %d", s, err, layout.Base)
	}

	keys := keyDir(t, "k1")
	env := bbstest.StartOn(t, cli, encryption(keys, "k1", "k1"))
	// Migrated before serving: no background re-encryption runs in this BBS (no leader loop),
	// so what is sealed was sealed by the migration.
	if s, _, err := layout.Read(ctxT(t), cli, store.LayoutService); err != nil || s != (layout.State{Version: store.LayoutVersion}) {
		t.Fatalf("layout after start %+v (%v), want version %d", s, err, store.LayoutVersion)
	}
	values := etcdValues(t, cli)
	for _, g := range guids {
		if label, sealed, err := sealing.LabelOf(values[store.DesiredRunKey(g)]); !sealed || label != "k1" || err != nil {
			t.Errorf("run info of %s: sealed %v under %q (%v)", g, sealed, label, err)
		}
	}
	if label, sealed, _ := sealing.LabelOf(values[store.TaskKey("job")]); !sealed || label != "k1" {
		t.Errorf("task: sealed %v under %q", sealed, label)
	}
	for key, v := range values {
		if strings.Contains(string(v), "s3cret") {
			t.Errorf("%s is still clear", key)
		}
	}
	if n := env.Service.RecordsToReencrypt(); n != 0 {
		t.Errorf("%d records left to re-encrypt after the migration", n)
	}
	resp, err := cli.Get(ctxT(t), "/gavel/v1/actual/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if actualRevs[string(kv.Key)] != kv.ModRevision {
			t.Errorf("%s was rewritten by the migration", kv.Key)
		}
	}
	for _, g := range guids[:3] {
		a := actuals(t, env, g)
		if len(a) != 1 || a[0].GetState() != modelsv1.ActualLRP_STATE_RUNNING || a[0].GetInstanceKey().GetInstanceGuid() != "ig-"+g {
			t.Errorf("%s after the upgrade: %v", g, a)
		}
		d, err := env.Client.DesiredLRPByProcessGuid(ctxT(t), &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: g})
		if err != nil || d.GetDesiredLrp().GetEnv()[0].GetValue() != "s3cret-env-"+g {
			t.Errorf("%s read back: %v (%v)", g, d.GetDesiredLrp().GetEnv(), err)
		}
	}
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}

	// A store newer than the code: a later release migrated it (or is migrating it).
	if _, err := cli.Put(ctxT(t), layout.Key(store.LayoutService), fmt.Sprintf(`{"version":%d}`, store.LayoutVersion+1)); err != nil {
		t.Fatal(err)
	}
	before := revisionOf(t, cli)
	cfg := bbs.Default()
	cfg.ListenAddress = "127.0.0.1:0"
	cfg.TLS, cfg.EtcdTLS = tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}
	encryption(keys, "k1", "k1")(&cfg)
	svc, err := bbs.New(cfg, logtest.New(t), cli)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.ReadyTimeout)
	defer cancel()
	err = svc.Run(ctx, func() { t.Error("a BBS older than the store served") })
	want := fmt.Sprintf("layout is version %d, newer than this bbs's version %d", store.LayoutVersion+1, store.LayoutVersion)
	var tooNew *layout.TooNewError
	if !errors.As(err, &tooNew) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Run = %v, want a refusal containing %q", err, want)
	}
	if after := revisionOf(t, cli); after != before {
		t.Fatalf("the refused BBS changed etcd: revision %d → %d", before, after)
	}
}
