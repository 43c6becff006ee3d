package backup_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/backup"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/sealing"
)

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var known = map[string]int{"bbs": 2, "nsync": 2}

// sealedStore writes a few records, one sealed under "k1", and the BBS's layout key.
func sealedStore(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "k1.key")
	if err := sealing.WriteKeyFile(path); err != nil {
		t.Fatal(err)
	}
	kr, err := sealing.Config{ActiveKeyLabel: "k1", Keys: []sealing.KeyFile{{Label: "k1", File: path}}}.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	v, err := kr.Seal("/gavel/v1/desired/run/web", []byte("\x0a\x03web"))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"/gavel/v1/desired/run/web": string(v), "/gavel/v1/desired/sched/web": "\x0a\x03web",
		layout.Key("bbs"): `{"version":2}`} {
		if _, err := cli.Put(ctxT(t), k, v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBackupRestoreRoundTrip: a backup names the layouts and key labels, restores into a new
// data directory whose etcd holds every key at a revision far past the backup's, and refuses
// to restore over an existing directory.
func TestBackupRestoreRoundTrip(t *testing.T) {
	_, cli := etcdtest.Start(t)
	sealedStore(t, cli)
	file := filepath.Join(t.TempDir(), "gavel.backup")
	m, err := backup.Save(ctxT(t), cli, file)
	if err != nil {
		t.Fatal(err)
	}
	if m.Layouts["bbs"] != 2 || m.Layouts["nsync"] != layout.Base || fmt.Sprint(m.KeyLabels) != "[k1]" || m.SnapshotBytes == 0 {
		t.Fatalf("manifest %+v", m)
	}
	if _, err := backup.Save(ctxT(t), cli, file); err == nil {
		t.Fatal("a second backup replaced the first")
	}

	dataDir := filepath.Join(t.TempDir(), "restored")
	peer := freeAddr(t)
	if _, err := backup.Restore(file, backup.RestoreConfig{DataDir: dataDir, PeerURLs: []string{"http://" + peer}, KnownLayouts: known}); err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Restore(file, backup.RestoreConfig{DataDir: dataDir, KnownLayouts: known}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("restore over an existing directory = %v", err)
	}
	restored := startOn(t, dataDir, peer)
	resp, err := restored.Get(ctxT(t), "/gavel/v1/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 3 || resp.Header.Revision < backup.RevisionBump {
		t.Fatalf("restored %d keys at revision %d, want 3 past %d", len(resp.Kvs), resp.Header.Revision, backup.RevisionBump)
	}
}

// TestRestoreRefusesBadBackups: a truncated file, a changed byte of the snapshot and a layout
// newer than the code are each refused before the data directory is created.
func TestRestoreRefusesBadBackups(t *testing.T) {
	_, cli := etcdtest.Start(t)
	sealedStore(t, cli)
	dir := t.TempDir()
	file := filepath.Join(dir, "gavel.backup")
	if _, err := backup.Save(ctxT(t), cli, file); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)/2] ^= 0xff // inside snapshot.db: the manifest comes first and is small
	for _, tc := range []struct {
		name  string
		data  []byte
		known map[string]int
		want  string
	}{
		{"truncated", good[:len(good)/2], known, "corrupt"},
		{"changed byte", flipped, known, "SHA-256"},
		{"empty", nil, known, "no manifest"},
		{"newer layout", good, map[string]int{"bbs": 1, "nsync": 2}, "unknown layout version: bbs layout 2 (this release knows 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".backup")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			dataDir := filepath.Join(dir, tc.name+".etcd")
			_, err := backup.Restore(path, backup.RestoreConfig{DataDir: dataDir, KnownLayouts: tc.known})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Restore = %v, want an error containing %q", err, tc.want)
			}
			if tc.name != "newer layout" && !errors.Is(err, backup.ErrCorrupt) {
				t.Errorf("%v is not ErrCorrupt", err)
			}
			if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
				t.Errorf("the data directory was created (%v)", err)
			}
		})
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "gavel-restore-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startOn starts an embedded etcd on a restored data directory and returns a client of it.
func startOn(t *testing.T, dataDir, peer string) *clientv3.Client {
	t.Helper()
	e, err := etcdembed.Start(ctxT(t), etcdembed.Config{Dir: dataDir, PeerAddr: peer, ClientAddr: "127.0.0.1:0", UnsafeNoFsync: true, Quiet: true, FastElection: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: e.Endpoints()}, logtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
