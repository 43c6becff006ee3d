package process

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/gavel-sched/gavel/pkg/atomicfile"
)

// makeFiles creates the spec's files directory with its initial files and returns its host
// path and its path as the processes see it ("" without a files directory).
func (c *container) makeFiles() (host, inside string, err error) {
	if c.spec.FilesDir == "" {
		return "", "", nil
	}
	rel := filepath.Clean("/" + c.spec.FilesDir)
	if c.root != "" {
		host, inside = filepath.Join(c.root, rel), rel
	} else {
		host = filepath.Join(c.dir, rel)
		inside = host
	}
	if err := os.MkdirAll(host, 0o755); err != nil {
		return "", "", fmt.Errorf("create files directory: %w", err)
	}
	for name, data := range c.spec.Files {
		if name != filepath.Base(name) || name == "." || name == ".." {
			return "", "", fmt.Errorf("file name %q is not a plain name", name)
		}
		if err := atomicfile.Write(filepath.Join(host, name), data, 0o644); err != nil {
			return "", "", err
		}
	}
	return host, inside, nil
}

// FilesPath implements executor.Container.
func (c *container) FilesPath() string { return c.filesHost }

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
