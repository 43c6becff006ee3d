package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
)

// TestBackupAndRestoreCommands: `gavel backup FILE` against an etcd writes a backup and names
// its layouts; `gavel restore FILE --data-dir DIR` writes DIR from it, refuses a file that is
// not a backup without creating DIR, and wants --data-dir.
func TestBackupAndRestoreCommands(t *testing.T) {
	e, cli := etcdtest.Start(t)
	if _, err := cli.Put(context.Background(), "/gavel/v1/desired/sched/web", "\x0a\x03web"); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := execute(context.Background(), args, strings.NewReader(""), &out, &errOut)
		return out.String(), err
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "gavel.backup")
	out, err := run("backup", "--etcd-endpoints", strings.Join(e.Endpoints(), ","), file)
	if err != nil || !strings.Contains(out, "layouts: bbs 1, nsync 1") || !strings.Contains(out, "encryption keys needed: none") {
		t.Fatalf("backup = %q, %v", out, err)
	}
	if out, err := run("restore", file, "--data-dir", filepath.Join(dir, "etcd")); err != nil || !strings.Contains(out, "restored into") {
		t.Fatalf("restore = %q, %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "etcd", "member")); err != nil {
		t.Fatalf("no member directory: %v", err)
	}
	notBackup := filepath.Join(dir, "not.backup")
	if err := os.WriteFile(notBackup, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run("restore", notBackup, "--data-dir", filepath.Join(dir, "etcd2")); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("restore of a non-backup = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "etcd2")); !os.IsNotExist(err) {
		t.Fatalf("a refused restore created its directory (%v)", err)
	}
	if _, err := run("restore", file); err == nil || exitCode(err) != 2 {
		t.Fatalf("restore without --data-dir = %v (exit %d), want a usage error", err, exitCode(err))
	}
}
