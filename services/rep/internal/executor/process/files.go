package process

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	fetch "github.com/gavel-sched/gavel/services/rep/internal/executor/download"
)

// makeFiles creates the spec's files directory with its initial files and returns the
// directory it lives in (the rootfs, or the container's directory without one), its path
// relative to that, and its path as the processes see it ("" without a files directory). It
// writes through an os.Root of that directory, so a link of the rootfs cannot send the
// directory or its files outside it.
func (c *container) makeFiles() (dir, rel, inside string, err error) {
	if c.spec.FilesDir == "" {
		return "", "", "", nil
	}
	abs := filepath.Clean("/" + c.spec.FilesDir)
	dir = c.dir
	if c.root != "" {
		dir = c.root
	}
	inside = abs
	if c.root == "" {
		inside = filepath.Join(dir, abs)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", "", "", fmt.Errorf("create files directory: %w", err)
	}
	defer root.Close()
	rel = fetch.InRoot(abs)
	if err := root.MkdirAll(rel, 0o755); err != nil {
		return "", "", "", fmt.Errorf("create files directory: %w", err)
	}
	for name, data := range c.spec.Files {
		if name != filepath.Base(name) || name == "." || name == ".." {
			return "", "", "", fmt.Errorf("file name %q is not a plain name", name)
		}
		if err := root.WriteFile(filepath.Join(rel, name), data, 0o644); err != nil {
			return "", "", "", fmt.Errorf("write file %s: %w", name, err)
		}
	}
	return dir, rel, inside, nil
}

// removeFiles removes the files directory of a container in a shared rootfs, through an
// os.Root of the rootfs (a link the container made cannot redirect the removal).
func (c *container) removeFiles() error {
	root, err := os.OpenRoot(c.filesRoot)
	if err != nil {
		return err
	}
	defer root.Close()
	return root.RemoveAll(c.filesDir)
}

// FilesPath implements executor.Container.
func (c *container) FilesPath() (root, dir string) { return c.filesRoot, c.filesDir }

// Signal implements executor.Container: it signals every running process group.
func (c *container) Signal(sig syscall.Signal) error {
	for _, pg := range c.groups() {
		if err := syscall.Kill(-pg, sig); err != nil && err != syscall.ESRCH {
			return fmt.Errorf("signal %s: %w", c.spec.Guid, err)
		}
	}
	return nil
}

// unignoreHangup makes the processes the backend starts receive SIGHUP, the signal that tells
// them their files changed, even when the rep itself was started with SIGHUP ignored (under
// nohup, or a supervisor that ignores it). An ignored signal stays ignored across exec, and a
// shell can never trap a signal that was ignored when it started (POSIX), so every container
// would silently miss it. Catching SIGHUP in the rep instead, and dropping it, keeps the rep deaf
// to hangups while its children start with the default disposition (exec resets caught
// signals). It does nothing when SIGHUP was not ignored.
var unignoreHangup = sync.OnceFunc(catchHangupIfIgnored)

// catchHangupIfIgnored catches (and drops) SIGHUP when it is ignored.
func catchHangupIfIgnored() {
	if signal.Ignored(syscall.SIGHUP) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	}
}
