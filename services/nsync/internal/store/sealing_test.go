package store

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/sealing"
)

// testKeyring is a keyring sealing under active over fresh key files of labels.
func testKeyring(t *testing.T, dir, active string, labels ...string) *sealing.Keyring {
	t.Helper()
	cfg := sealing.Config{ActiveKeyLabel: active}
	for _, l := range labels {
		path := filepath.Join(dir, l+".key")
		if err := sealing.WriteKeyFile(path); err != nil && !strings.Contains(err.Error(), "exists") {
			t.Fatal(err)
		}
		cfg.Keys = append(cfg.Keys, sealing.KeyFile{Label: l, File: path})
	}
	kr, err := cfg.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func secretApp(guid string) *nsyncv1.AppRecord {
	return &nsyncv1.AppRecord{App: &nsyncv1.App{Guid: guid, Name: "app-" + guid, Command: "./s3cret-command-" + guid,
		Env: map[string]string{"DB_PASSWORD": "s3cret-env-" + guid}}}
}

// labels returns the key label of every app record in etcd ("" for a clear one); with sealed,
// it checks that no secret is stored clear.
func labels(t *testing.T, cli *clientv3.Client, sealed bool) map[string]string {
	t.Helper()
	resp, err := cli.Get(context.Background(), appPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		if sealed && bytes.Contains(kv.Value, []byte("s3cret")) {
			t.Errorf("%s is stored with its secrets in the clear", kv.Key)
		}
		label, _, err := sealing.LabelOf(kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		out[string(kv.Key)] = label
	}
	return out
}

// TestAppRecordsSealedAndRotated: app records are sealed (no env value or command in etcd) and
// read back whole; with a new active key, ResealApps rewrites them in bounded batches under it,
// leaving a record changed meanwhile to a later call; a store that lacks a key in use cannot
// read the apps and names the label.
func TestAppRecordsSealedAndRotated(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx := context.Background()
	dir := t.TempDir()
	clear := New(cli, nil)
	old := New(cli, testKeyring(t, dir, "k1", "k1"))
	const n = 150
	for i := range n {
		s := old
		if i%3 == 0 {
			s = clear // a store from before encryption
		}
		if _, err := s.CreateApp(ctx, secretApp(fmt.Sprintf("a%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	count := map[string]int{}
	for _, label := range labels(t, cli, false) {
		count[label]++
	}
	if count[""] != n/3 || count["k1"] != n-n/3 {
		t.Fatalf("labels before rotation %v, want %d clear and %d under k1", count, n/3, n-n/3)
	}

	rotated := New(cli, testKeyring(t, dir, "k2", "k1", "k2"))
	apps, _, err := rotated.Apps(ctx)
	if err != nil || len(apps) != n {
		t.Fatalf("Apps = %d, %v", len(apps), err)
	}
	// A concurrent writer updates one record between the rotation's read and its write: that
	// record is not overwritten, and is left for the next call.
	raced := apps[1] // sealed under k1
	stale, err := cli.Get(ctx, appPrefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	rec := secretApp(raced.Record.GetApp().GetGuid())
	rec.App.Instances = 7
	if _, err := rotated.PutApp(ctx, rec, raced.ModRevision); err != nil {
		t.Fatal(err)
	}
	staleStore := New(&staleKV{KV: cli, stale: stale}, rotated.keyring) // lists the records as read before the write
	done, left, err := staleStore.ResealApps(ctx, n)
	if err != nil || done != n-1 || left != 1 {
		t.Fatalf("ResealApps over a stale listing = %d, %d, %v; want %d rewritten, the raced one skipped", done, left, err, n-1)
	}
	got, err := rotated.GetApp(ctx, raced.Record.GetApp().GetGuid())
	if err != nil || got.Record.GetApp().GetInstances() != 7 {
		t.Fatalf("the concurrent update was overwritten: %v, %v", got.Record, err)
	}
	for key, label := range labels(t, cli, true) {
		if label != "k2" {
			t.Errorf("%s under %q after rotation, want k2", key, label)
		}
	}
	if done, left, err := rotated.ResealApps(ctx, 10); done != 0 || left != 0 || err != nil {
		t.Fatalf("second rotation = %d, %d, %v; want nothing to do", done, left, err)
	}

	// Bounded: a batch rewrites at most its size and reports the rest.
	back := New(cli, testKeyring(t, dir, "k1", "k1", "k2"))
	if done, left, err := back.ResealApps(ctx, 10); done != 10 || left != n-10 || err != nil {
		t.Fatalf("ResealApps(10) = %d, %d, %v; want 10 and %d left", done, left, err, n-10)
	}

	lacking := New(cli, testKeyring(t, dir, "k1", "k1"))
	if _, _, err := lacking.Apps(ctx); err == nil || !strings.Contains(err.Error(), `key label "k2"`) {
		t.Fatalf("Apps without k2 = %v, want an error naming k2", err)
	}
	for i := range n {
		a, err := back.GetApp(ctx, fmt.Sprintf("a%03d", i))
		if err != nil || a.Record.GetApp().GetEnv()["DB_PASSWORD"] != fmt.Sprintf("s3cret-env-a%03d", i) {
			t.Fatalf("app a%03d: %v, %v", i, a.Record, err)
		}
	}
}

// staleKV answers a listing of the apps with an earlier listing: a rotation that read the
// records before a concurrent write.
type staleKV struct {
	clientv3.KV
	stale *clientv3.GetResponse
}

func (k *staleKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if key == appPrefix {
		return k.stale, nil
	}
	return k.KV.Get(ctx, key, opts...)
}
