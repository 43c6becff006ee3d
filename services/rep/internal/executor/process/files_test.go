package process

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// TestFilesDirAndSignal: the files directory exists with its files before the process starts,
// its path is in the named variable, the host path is FilesPath, and Signal reaches the process.
func TestFilesDirAndSignal(t *testing.T) {
	b := newTestBackend(t, nil)
	script := `cp "$LINKS/db.json" "$LINKS/seen-at-start"; trap 'echo hup >> "$LINKS/hups"' HUP; echo trapped > "$LINKS/ready"; while :; do sleep 0.05; done`
	c := start(t, b, executor.Spec{
		Guid:        "files-1",
		Kind:        executor.KindLRP,
		Action:      run("/bin/sh", "-c", script),
		Privileged:  true,
		FilesDir:    ".gavel/links/files-1",
		FilesDirEnv: "LINKS",
		Files:       map[string][]byte{"db.json": []byte(`{"nodes":[]}`)},
	})
	root, rel := c.FilesPath()
	dir := filepath.Join(root, rel)
	if !strings.HasSuffix(dir, filepath.Join(".gavel", "links", "files-1")) {
		t.Fatalf("FilesPath %q", dir)
	}
	waitFile(t, dir, "seen-at-start", `{"nodes":[]}`)
	waitFile(t, dir, "ready", "trapped")
	if err := c.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFile(t, dir, "hups", "hup")
	c.Stop(time.Second)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("files directory left after the container: %v", err)
	}
}

// TestContainersGetHangupUnderNohup: with SIGHUP ignored in the rep (as under nohup), a
// container's shell can still trap it: the backend catches SIGHUP instead of ignoring it, so
// its children start with the default disposition. The test failed before the change whenever
// the suite ran under nohup.
func TestContainersGetHangupUnderNohup(t *testing.T) {
	signal.Ignore(syscall.SIGHUP)
	t.Cleanup(func() { signal.Reset(syscall.SIGHUP) })
	catchHangupIfIgnored()
	if signal.Ignored(syscall.SIGHUP) {
		t.Fatal("SIGHUP is still ignored")
	}
	b := newTestBackend(t, nil)
	c := start(t, b, executor.Spec{
		Guid:        "hup-1",
		Kind:        executor.KindLRP,
		Action:      run("/bin/sh", "-c", `trap 'echo hup > "$LINKS/hups"' HUP; echo trapped > "$LINKS/ready"; while :; do sleep 0.05; done`),
		Privileged:  true,
		FilesDir:    ".gavel/links/hup-1",
		FilesDirEnv: "LINKS",
	})
	root, rel := c.FilesPath()
	dir := filepath.Join(root, rel)
	waitFile(t, dir, "ready", "trapped")
	if err := c.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFile(t, dir, "hups", "hup")
	c.Stop(time.Second)
}

// waitFile waits until the file name in dir holds want.
func waitFile(t *testing.T, dir, name, want string) {
	t.Helper()
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		return err == nil && strings.Contains(string(b), want), fmt.Sprintf("%q, %v", b, err)
	}, fmt.Sprintf("%s holds %q", name, want))
}
