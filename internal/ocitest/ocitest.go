// Package ocitest starts a private containerd for tests of the oci backend: the machine's
// /usr/bin/containerd (or $GAVEL_CONTAINERD) with a generated config.toml whose root, state and
// sockets are under a temporary directory, never the Docker engine's or the system's daemon.
package ocitest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
)

// InstallHint is the one line a test prints when it skips for want of containerd or runc.
const InstallHint = "SKIP oci backend tests: need root, containerd (>= 1.6) and runc: apt-get install containerd runc"

// ContainerdEnv names the environment variable that overrides the containerd binary.
const ContainerdEnv = "GAVEL_CONTAINERD"

// startTimeout bounds how long the daemon may take to open its socket.
const startTimeout = 30 * time.Second

// Containerd is a running private containerd.
type Containerd struct {
	// Socket is the daemon's gRPC socket.
	Socket string
	// Dir holds the config, root, state and log of the daemon.
	Dir string

	cmd  *exec.Cmd
	done chan struct{}
}

// Missing says what is missing to run containers on this machine ("" when nothing is):
// root, a containerd binary, the runc shim, or runc.
func Missing() string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if _, err := exec.LookPath(containerdBinary()); err != nil {
		missing = append(missing, "containerd")
	}
	if _, err := exec.LookPath("containerd-shim-runc-v2"); err != nil {
		missing = append(missing, "containerd-shim-runc-v2")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		missing = append(missing, "runc")
	}
	return strings.Join(missing, ", ")
}

func containerdBinary() string {
	if b := os.Getenv(ContainerdEnv); b != "" {
		return b
	}
	return "/usr/bin/containerd"
}

// New starts a private containerd for t and stops it when t ends; it skips t with
// InstallHint when containerd or runc is missing.
func New(t testing.TB) *Containerd {
	t.Helper()
	if m := Missing(); m != "" {
		testkit.SkipWithoutTool(t, fmt.Sprintf("%s (missing: %s)", InstallHint, m))
	}
	c, err := Start()
	if err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop containerd: %v", err)
		}
	})
	return c
}

// Start starts a private containerd in a new temporary directory and waits for its socket.
// Stop it with Stop. The directory is short (unix socket paths are limited to 108 bytes).
func Start() (_ *Containerd, err error) {
	dir, err := os.MkdirTemp("", "gavel-ctrd-")
	if err != nil {
		return nil, fmt.Errorf("containerd directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	c := &Containerd{Socket: filepath.Join(dir, "containerd.sock"), Dir: dir, done: make(chan struct{})}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %q

[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.Socket, c.Socket+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		return nil, fmt.Errorf("write containerd config: %w", err)
	}
	if err := c.start(); err != nil {
		return nil, err
	}
	return c, nil
}

// Restart stops the daemon (SIGTERM) and starts it again on the same config, root, state and
// socket; the containers' shims keep them running meanwhile, as on a machine whose containerd
// is restarted.
func (c *Containerd) Restart() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	c.done = make(chan struct{})
	return c.start()
}

// start runs the daemon on the config in c.Dir and waits for its socket.
func (c *Containerd) start() error {
	logFile, err := os.OpenFile(filepath.Join(c.Dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("containerd log: %w", err)
	}
	defer logFile.Close()
	c.cmd = exec.Command(containerdBinary(), "--config", filepath.Join(c.Dir, "config.toml"))
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	// Its own process group: a ^C to the test does not reach it before Stop does.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", containerdBinary(), err)
	}
	done := c.done
	go func() {
		_ = c.cmd.Wait()
		close(done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		conn, derr := (&net.Dialer{}).DialContext(ctx, "unix", c.Socket)
		if derr == nil {
			_ = conn.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("containerd exited at start: %s", c.logTail())
		case <-ctx.Done():
			_ = c.Stop()
			return fmt.Errorf("containerd socket %s not up within %s: %s", c.Socket, startTimeout, c.logTail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// logTail is the end of the daemon's log, for error messages.
func (c *Containerd) logTail() string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "containerd.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// Stop terminates the daemon (SIGTERM, then SIGKILL after 10s) and removes its directory.
// Shims of containers still running are not the daemon's children and outlive it; the
// tests clean up their containers before.
func (c *Containerd) Stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	// The root holds mounts only while snapshots are mounted; unmount what is left so the
	// directory can go.
	var errs []error
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove containerd directory: %w", err))
	}
	return errors.Join(errs...)
}
