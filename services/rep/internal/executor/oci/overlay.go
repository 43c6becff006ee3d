package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// overlay is a container's root filesystem: lower (read-only) under upper (writable), mounted
// at root. All three directories are in the container's directory.
type overlay struct {
	lower, upper, work, root string
}

// newOverlay lays out the overlay of lower in dir (upper/, work/, rootfs/).
func newOverlay(dir, lower string) overlay {
	return overlay{
		lower: lower,
		upper: filepath.Join(dir, "upper"),
		work:  filepath.Join(dir, "work"),
		root:  filepath.Join(dir, "rootfs"),
	}
}

// mount creates the directories and mounts the overlay.
func (o overlay) mount() error {
	st, err := os.Stat(o.lower)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("rootfs %s is not a directory", o.lower)
	}
	for _, d := range []string{o.upper, o.work, o.root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
	}
	for _, p := range []string{o.lower, o.upper, o.work} {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("rootfs: overlay cannot take a path with ',' or ':': %s", p)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", o.lower, o.upper, o.work)
	if err := unix.Mount("overlay", o.root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay rootfs on %s (%s): %w", o.root, opts, err)
	}
	return nil
}

// unmount unmounts the overlay; it is not an error when it is not mounted. A busy mount is
// detached (lazily unmounted).
func (o overlay) unmount() error {
	err := unix.Unmount(o.root, 0)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EBUSY):
		if err := unix.Unmount(o.root, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach overlay rootfs %s: %w", o.root, err)
		}
		return nil
	default:
		return fmt.Errorf("unmount overlay rootfs %s: %w", o.root, err)
	}
}
