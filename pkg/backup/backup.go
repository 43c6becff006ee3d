// Package backup saves Gavel's etcd store to one file and restores it into a fresh etcd data
// directory (see docs/operations.md, "Back up and restore", and
// docs/decisions/0027-backup-and-restore.md).
//
// A backup file is a tar archive of two entries:
//
//	manifest.json   Manifest: the format, the layout version of each service's records, the
//	                labels of the encryption keys the sealed records need, the etcd revision,
//	                the snapshot's size and SHA-256
//	snapshot.db     an etcd snapshot taken through the client's maintenance API (what
//	                `etcdctl snapshot save` writes; `etcdutl snapshot restore` takes it as is)
//
// Restore checks the whole file — the archive, the checksum, the snapshot's own hash, the
// layout versions against the ones the code knows — before it creates anything, then writes a
// member's data directory with etcdutl's restore, bumping the revision and marking the old
// ones compacted so that no watcher resumes into the restored history as if it were new.
package backup

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/sealing"
)

// Format names the backup file format in its manifest.
const Format = "gavel-backup/1"

const (
	manifestName = "manifest.json"
	snapshotName = "snapshot.db"
)

// Manifest describes a backup.
type Manifest struct {
	// Format is Format.
	Format string `json:"format"`
	// Created is when the backup was taken (UTC).
	Created time.Time `json:"created"`
	// Revision is the etcd revision the manifest's reads were made at (the snapshot is taken
	// just after: it holds this revision or a later one).
	Revision int64 `json:"revision"`
	// Layouts is the layout version of each service's records (layout.Base for a service
	// without a layout key).
	Layouts map[string]int `json:"layouts"`
	// KeyLabels are the labels of the encryption keys the sealed records need: restore the
	// backup only where these keys are configured.
	KeyLabels []string `json:"key_labels"`
	// SnapshotBytes is snapshot.db's size.
	SnapshotBytes int64 `json:"snapshot_bytes"`
	// SnapshotSHA256 is snapshot.db's SHA-256, hex.
	SnapshotSHA256 string `json:"snapshot_sha256"`
}

// Services are the services whose layout a backup records.
var Services = []string{"bbs", "nsync"}

// Save writes a backup of the etcd client's cluster to path (which must not exist) and returns
// its manifest. The file is written beside path and renamed into place once complete.
func Save(ctx context.Context, client *clientv3.Client, path string) (Manifest, error) {
	m := Manifest{Format: Format, Created: time.Now().UTC().Truncate(time.Second), Layouts: map[string]int{}}
	for _, svc := range Services {
		s, _, err := layout.Read(ctx, client, svc)
		if err != nil {
			return m, err
		}
		m.Layouts[svc] = s.Version
	}
	labels, rev, err := keyLabels(ctx, client)
	if err != nil {
		return m, err
	}
	m.KeyLabels, m.Revision = labels, rev

	if _, err := os.Stat(path); err == nil {
		return m, fmt.Errorf("%s exists: a backup never replaces a file", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".snapshot-*")
	if err != nil {
		return m, err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	rc, err := client.Snapshot(ctx)
	if err != nil {
		_ = tmp.Close()
		return m, fmt.Errorf("etcd snapshot: %w", err)
	}
	h := sha256.New()
	m.SnapshotBytes, err = io.Copy(io.MultiWriter(tmp, h), rc)
	_ = rc.Close()
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return m, fmt.Errorf("etcd snapshot: %w", err)
	}
	m.SnapshotSHA256 = hex.EncodeToString(h.Sum(nil))
	if err := writeArchive(path, m, tmp.Name()); err != nil {
		return m, err
	}
	return m, nil
}

// keyLabels lists the key labels the sealed records are sealed under, reading every value under
// etcdx.Root page by page at one revision: a sealed envelope starts with a zero byte, which no
// clear record does (protobuf, JSON, names), so the envelope headers say it without knowing
// which services seal what.
func keyLabels(ctx context.Context, client *clientv3.Client) ([]string, int64, error) {
	seen := map[string]bool{}
	var rev int64
	key, end := etcdx.Root, clientv3.GetPrefixRangeEnd(etcdx.Root)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(1000)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := client.Get(ctx, key, opts...)
		if err != nil {
			return nil, 0, fmt.Errorf("read %s: %w", etcdx.Root, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if label, sealed, err := sealing.LabelOf(kv.Value); err == nil && sealed {
				seen[label] = true
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	labels := make([]string, 0, len(seen))
	for l := range seen {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	return labels, rev, nil
}

// writeArchive writes the manifest and the snapshot at snap into a new file at path.
func writeArchive(path string, m Manifest, snap string) (err error) {
	js, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".partial"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Name: manifestName, Mode: 0o600, Size: int64(len(js)), ModTime: m.Created}); err != nil {
		return err
	}
	if _, err := tw.Write(js); err != nil {
		return err
	}
	sf, err := os.Open(snap)
	if err != nil {
		return err
	}
	defer sf.Close()
	if err := tw.WriteHeader(&tar.Header{Name: snapshotName, Mode: 0o600, Size: m.SnapshotBytes, ModTime: m.Created}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, sf); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%s exists: a backup never replaces a file", path)
	}
	return os.Rename(tmp, path)
}

// ErrCorrupt is a backup file that is not a complete, intact backup.
var ErrCorrupt = errors.New("backup file is corrupt")

// Open checks the backup at path — a manifest of this format, a snapshot of the size and
// SHA-256 it names, layout versions no newer than known (by service) — and extracts the
// snapshot to a temporary file in dir. The caller removes the file. Nothing else is written.
func Open(path string, known map[string]int, dir string) (Manifest, string, error) {
	var m Manifest
	f, err := os.Open(path)
	if err != nil {
		return m, "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != manifestName || hdr.Size > 1<<20 {
		return m, "", fmt.Errorf("%w: %s: no manifest first (%v)", ErrCorrupt, path, err)
	}
	js, err := io.ReadAll(tr)
	if err != nil {
		return m, "", fmt.Errorf("%w: %s: manifest: %v", ErrCorrupt, path, err)
	}
	if err := json.Unmarshal(js, &m); err != nil {
		return m, "", fmt.Errorf("%w: %s: manifest: %v", ErrCorrupt, path, err)
	}
	if m.Format != Format {
		return m, "", fmt.Errorf("%s: backup format %q, this release reads %q", path, m.Format, Format)
	}
	var unknown []string
	for svc, v := range m.Layouts {
		if k, ok := known[svc]; !ok || v > k || v < layout.Base {
			unknown = append(unknown, fmt.Sprintf("%s layout %d (this release knows %d)", svc, v, k))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return m, "", fmt.Errorf("%s: unknown layout version: %s; restore it with the release that took it", path, strings.Join(unknown, ", "))
	}
	hdr, err = tr.Next()
	if err != nil || hdr.Name != snapshotName || hdr.Size != m.SnapshotBytes {
		return m, "", fmt.Errorf("%w: %s: no snapshot of %d bytes after the manifest (%v)", ErrCorrupt, path, m.SnapshotBytes, err)
	}
	out, err := os.CreateTemp(dir, "gavel-restore-*.db")
	if err != nil {
		return m, "", err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), tr)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && (n != m.SnapshotBytes || hex.EncodeToString(h.Sum(nil)) != m.SnapshotSHA256) {
		err = fmt.Errorf("%w: %s: the snapshot's SHA-256 is not the manifest's", ErrCorrupt, path)
	}
	if err != nil {
		_ = os.Remove(out.Name())
		if !errors.Is(err, ErrCorrupt) {
			err = fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
		}
		return m, "", err
	}
	return m, out.Name(), nil
}

// RestoreConfig says where and as which member a backup is restored.
type RestoreConfig struct {
	// DataDir is the member's new data directory; it must not exist.
	DataDir string
	// Name is the member's name (default "default", a lone member's).
	Name string
	// PeerURLs are the member's peer URLs (default http://localhost:2380).
	PeerURLs []string
	// InitialCluster is "name=peer-url,..." of every member of the restored cluster (default
	// this member alone); restore each member's directory with the same value.
	InitialCluster string
	// InitialClusterToken is the restored cluster's token (default "gavel-etcd").
	InitialClusterToken string
	// KnownLayouts are the layout versions this release knows, by service: a backup of a newer
	// layout is refused.
	KnownLayouts map[string]int
}

// RevisionBump is how far Restore moves the restored store's revision past the backup's, marking
// everything before compacted: a client resuming a watch from a revision it saw before the
// restore gets a compaction error and lists again, instead of missing changes.
const RevisionBump = 1_000_000_000

// Restore checks the backup at path (Open) and only then writes a new etcd data directory from
// it for one member. It returns the backup's manifest.
func Restore(path string, cfg RestoreConfig) (Manifest, error) {
	if cfg.DataDir == "" {
		return Manifest{}, errors.New("restore: a data directory is required")
	}
	if _, err := os.Stat(cfg.DataDir); err == nil {
		return Manifest{}, fmt.Errorf("restore: %s exists: restore into a new data directory", cfg.DataDir)
	}
	parent := filepath.Dir(filepath.Clean(cfg.DataDir))
	m, snap, err := Open(path, cfg.KnownLayouts, parent)
	if err != nil {
		return m, err
	}
	defer func() { _ = os.Remove(snap) }()
	if cfg.Name == "" {
		cfg.Name = "default"
	}
	if len(cfg.PeerURLs) == 0 {
		cfg.PeerURLs = []string{"http://localhost:2380"}
	}
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = cfg.Name + "=" + strings.Join(cfg.PeerURLs, ","+cfg.Name+"=")
	}
	if cfg.InitialClusterToken == "" {
		cfg.InitialClusterToken = "gavel-etcd"
	}
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        snap,
		Name:                cfg.Name,
		OutputDataDir:       cfg.DataDir,
		PeerURLs:            cfg.PeerURLs,
		InitialCluster:      cfg.InitialCluster,
		InitialClusterToken: cfg.InitialClusterToken,
		RevisionBump:        RevisionBump,
		MarkCompacted:       true,
	})
	if err != nil {
		return m, fmt.Errorf("restore %s into %s: %w", path, cfg.DataDir, err)
	}
	return m, nil
}
