package layout_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/sealing"
)

const prefix = "/gavel/v1/test/rec/"

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func keyring(t *testing.T) *sealing.Keyring {
	t.Helper()
	path := filepath.Join(t.TempDir(), "k1.key")
	if err := sealing.WriteKeyFile(path); err != nil {
		t.Fatal(err)
	}
	kr, err := sealing.Config{ActiveKeyLabel: "k1", Keys: []sealing.KeyFile{{Label: "k1", File: path}}}.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// writeClear writes n clear records, as a release before versioning wrote them.
func writeClear(t *testing.T, cli *clientv3.Client, n int) {
	t.Helper()
	for i := range n {
		if _, err := cli.Put(ctxT(t), fmt.Sprintf("%s%04d", prefix, i), fmt.Sprintf("\x0a\x05clear-%04d", i)); err != nil {
			t.Fatal(err)
		}
	}
}

// records reads every record: its value and mod revision.
func records(t *testing.T, cli *clientv3.Client) map[string]*struct {
	value  []byte
	modRev int64
} {
	t.Helper()
	resp, err := cli.Get(ctxT(t), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*struct {
		value  []byte
		modRev int64
	}{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = &struct {
			value  []byte
			modRev int64
		}{kv.Value, kv.ModRevision}
	}
	return out
}

func options(kr *sealing.Keyring) layout.Options {
	return layout.Options{Service: "test", Current: 2, Migrations: []layout.Migration{layout.SealClear(2, kr, prefix)}}
}

// TestUpgradeSealsAnOldStore: a store of the layout before versioning (no layout key, clear
// records) is at version 1; Upgrade seals every record, 64 per transaction, and moves the
// version key to 2; a second Upgrade writes nothing.
func TestUpgradeSealsAnOldStore(t *testing.T) {
	_, cli := etcdtest.Start(t)
	kr := keyring(t)
	writeClear(t, cli, 150)
	if s, _, err := layout.Read(ctxT(t), cli, "test"); err != nil || s.Version != layout.Base {
		t.Fatalf("Read = %+v, %v; want version %d", s, err, layout.Base)
	}
	var batches int
	o := options(kr)
	o.Progress = func(layout.State) { batches++ }
	if err := layout.Upgrade(ctxT(t), cli, o); err != nil {
		t.Fatal(err)
	}
	if batches != 4 { // 64 + 64 + 22, then the step that finds nothing left
		t.Errorf("%d batches, want 4", batches)
	}
	for key, r := range records(t, cli) {
		plain, label, err := kr.Open(key, r.value)
		if err != nil || label != "k1" || !strings.HasPrefix(string(plain), "\x0a\x05clear-") {
			t.Errorf("%s: opened %q under %q (%v)", key, plain, label, err)
		}
	}
	if s, _, _ := layout.Read(ctxT(t), cli, "test"); s != (layout.State{Version: 2}) {
		t.Fatalf("state %+v, want version 2", s)
	}
	before, _ := cli.Get(ctxT(t), "/", clientv3.WithCountOnly())
	if err := layout.Upgrade(ctxT(t), cli, options(kr)); err != nil {
		t.Fatal(err)
	}
	if after, _ := cli.Get(ctxT(t), "/", clientv3.WithCountOnly()); after.Header.Revision != before.Header.Revision {
		t.Errorf("a current store was written: revision %d → %d", before.Header.Revision, after.Header.Revision)
	}
}

// TestUpgradeResumesAnInterruptedMigration: a migration stopped after two batches (its
// context cancelled, as a killed process would stop) leaves the layout key at "migrating to 2"
// with its resume point; the next Upgrade continues from there and never rewrites a record
// the first one committed.
func TestUpgradeResumesAnInterruptedMigration(t *testing.T) {
	_, cli := etcdtest.Start(t)
	kr := keyring(t)
	writeClear(t, cli, 200)
	ctx, cancel := context.WithCancel(ctxT(t))
	o := options(kr)
	n := 0
	o.Progress = func(layout.State) {
		if n++; n == 2 {
			cancel()
		}
	}
	if err := layout.Upgrade(ctx, cli, o); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted Upgrade = %v, want canceled", err)
	}
	s, _, err := layout.Read(ctxT(t), cli, "test")
	if err != nil || s.Version != 1 || s.Migrating != 2 || s.Resume != prefix+"0127" {
		t.Fatalf("state after interruption %+v (%v), want version 1 migrating to 2 resuming after %s0127", s, err, prefix)
	}
	first := records(t, cli)
	sealed := 0
	for _, r := range first {
		if _, ok, _ := sealing.LabelOf(r.value); ok {
			sealed++
		}
	}
	if sealed != 128 {
		t.Fatalf("%d records sealed after two batches, want 128", sealed)
	}

	if err := layout.Upgrade(ctxT(t), cli, options(kr)); err != nil {
		t.Fatal(err)
	}
	for key, r := range records(t, cli) {
		if _, label, err := kr.Open(key, r.value); err != nil || label != "k1" {
			t.Errorf("%s: label %q (%v)", key, label, err)
		}
		if _, ok, _ := sealing.LabelOf(first[key].value); ok && r.modRev != first[key].modRev {
			t.Errorf("%s was sealed again by the resumed migration", key)
		}
	}
	if s, _, _ := layout.Read(ctxT(t), cli, "test"); s != (layout.State{Version: 2}) {
		t.Fatalf("state %+v, want version 2", s)
	}
}

// TestUpgradeRefusesANewerStore: code of layout 2 refuses a store at 3, or being migrated to
// 3, naming both versions, and writes nothing.
func TestUpgradeRefusesANewerStore(t *testing.T) {
	_, cli := etcdtest.Start(t)
	for _, v := range []string{`{"version":3}`, `{"version":2,"migrating":3,"resume":"x"}`} {
		if _, err := cli.Put(ctxT(t), layout.Key("test"), v); err != nil {
			t.Fatal(err)
		}
		before, _ := cli.Get(ctxT(t), "/", clientv3.WithCountOnly())
		err := layout.Upgrade(ctxT(t), cli, options(nil))
		var tooNew *layout.TooNewError
		if !errors.As(err, &tooNew) || !strings.Contains(err.Error(), "version 3, newer than this test's version 2") {
			t.Fatalf("Upgrade over %s = %v, want a refusal naming versions 3 and 2", v, err)
		}
		if after, _ := cli.Get(ctxT(t), "/", clientv3.WithCountOnly()); after.Header.Revision != before.Header.Revision {
			t.Errorf("the refused store was written")
		}
	}
}

// TestUpgradeOneMigratesOthersWait: instances starting together over an old store each return
// from Upgrade only once the store is current, and every record is sealed exactly once.
func TestUpgradeOneMigratesOthersWait(t *testing.T) {
	_, cli := etcdtest.Start(t)
	kr := keyring(t)
	writeClear(t, cli, 300)
	start := records(t, cli)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	states := make([]layout.State, 3)
	for i := range errs {
		wg.Go(func() {
			if errs[i] = layout.Upgrade(ctxT(t), cli, options(kr)); errs[i] == nil {
				states[i], _, errs[i] = layout.Read(ctxT(t), cli, "test")
			}
		})
	}
	wg.Wait()
	for i := range errs {
		if errs[i] != nil || states[i] != (layout.State{Version: 2}) {
			t.Fatalf("instance %d: Upgrade returned %v with the store at %+v", i, errs[i], states[i])
		}
	}
	for key, r := range records(t, cli) {
		// Sealed once: one revision per batch, so each record's version is 2 (created, sealed).
		resp, _ := cli.Get(ctxT(t), key)
		if resp.Kvs[0].Version != 2 || r.modRev == start[key].modRev {
			t.Errorf("%s: written %d times", key, resp.Kvs[0].Version-1)
		}
	}
}

// TestWatchStopsAnOlderInstance: an instance serving layout 2 learns when a newer release
// starts migrating the store to 3.
func TestWatchStopsAnOlderInstance(t *testing.T) {
	_, cli := etcdtest.Start(t)
	if err := layout.Upgrade(ctxT(t), cli, options(nil)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- layout.Watch(ctxT(t), cli, "test", 2) }()
	if _, err := cli.Put(ctxT(t), layout.Key("test"), `{"version":2}`); err != nil { // no change of version
		t.Fatal(err)
	}
	if _, err := cli.Put(ctxT(t), layout.Key("test"), `{"version":2,"migrating":3}`); err != nil {
		t.Fatal(err)
	}
	var tooNew *layout.TooNewError
	if err := <-done; !errors.As(err, &tooNew) || tooNew.Stored != 3 {
		t.Fatalf("Watch = %v, want a refusal of layout 3", err)
	}
}

// BenchmarkSealClear measures the migration "encrypt the existing clear records": 5,000 clear
// records of 300 bytes sealed in batches of 64 (embedded etcd without fsync); it reports
// records per second.
func BenchmarkSealClear(b *testing.B) {
	const n = 5000
	for b.Loop() {
		b.StopTimer()
		_, cli := etcdtest.Start(b)
		path := filepath.Join(b.TempDir(), "k1.key")
		if err := sealing.WriteKeyFile(path); err != nil {
			b.Fatal(err)
		}
		kr, err := sealing.Config{ActiveKeyLabel: "k1", Keys: []sealing.KeyFile{{Label: "k1", File: path}}}.Keyring()
		if err != nil {
			b.Fatal(err)
		}
		value := "\x0a" + strings.Repeat("x", 299)
		for i := 0; i < n; i += 100 {
			ops := make([]clientv3.Op, 0, 100)
			for j := i; j < i+100; j++ {
				ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%05d", prefix, j), value))
			}
			if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		start := time.Now()
		if err := layout.Upgrade(context.Background(), cli, options(kr)); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(n/time.Since(start).Seconds(), "records/s")
	}
}
