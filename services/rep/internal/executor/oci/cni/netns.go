package cni

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// NetnsDir is where `ip netns` (and containerd's CRI) pin network namespaces.
const NetnsDir = "/run/netns"

// NewNetns creates a network namespace and pins it with a bind mount at dir/name, the way
// `ip netns add` does, and returns that path. The oci backend gives the path to the
// container's OCI spec as its network namespace and to Attach, and removes it with
// RemoveNetns after Detach: a pinned namespace outlives the container's processes, so Detach
// still finds the interface and its addresses after a crash (the bridge plugin removes its
// masquerade rules only when it can read the address in the namespace).
func NewNetns(dir, name string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create network namespace %s: %w", name, err)
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return "", fmt.Errorf("create network namespace %s: %w", path, err)
	}
	_ = f.Close()
	errc := make(chan error, 1)
	go func() {
		// unshare moves only this thread into the new namespace. If it cannot come back, the
		// thread stays locked and the runtime ends it with this goroutine.
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		err = unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("bind mount: %w", err)
		}
		if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("return to the original namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
		return "", fmt.Errorf("create network namespace %s: %w", path, err)
	}
	return path, nil
}

// RemoveNetns unpins and removes a namespace NewNetns (or `ip netns add`) created; the
// namespace itself goes when nothing else holds it. Removing one that is gone is not an error.
func RemoveNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove network namespace %s: unmount: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove network namespace %s: %w", path, err)
	}
	return nil
}
