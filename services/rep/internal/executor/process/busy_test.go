package process

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestStartExecWaitsForABusyExecutable: an executable still open for writing (as one just
// extracted is, while a process forked meanwhile holds its descriptor) cannot be started, and
// startExec starts it once the writer closes it; a start that fails otherwise is not retried.
func TestStartExecWaitsForABusyExecutable(t *testing.T) {
	src, err := exec.LookPath("true")
	if err != nil {
		t.Fatalf("no `true` executable to copy: %v", err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	path := filepath.Join(t.TempDir(), "app")
	w, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(w, in); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command(path).Start(); !errors.Is(err, syscall.ETXTBSY) {
		t.Fatalf("starting an executable open for writing: %v, want ETXTBSY", err)
	}
	closed := time.AfterFunc(10*time.Millisecond, func() { _ = w.Close() })
	defer closed.Stop()
	cmd, err := startExec(exec.Command(path))
	if err != nil {
		t.Fatalf("startExec: %v, want the executable started once its writer closed it", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the started process: %v", err)
	}

	if _, err := startExec(exec.Command(filepath.Join(t.TempDir(), "missing"))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("startExec of a missing executable: %v, want not found at once", err)
	}
}
