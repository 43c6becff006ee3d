package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ReasonDiskLimit starts the reason of a container stopped for writing more than disk_mb.
const ReasonDiskLimit = "disk limit exceeded"

// DefaultDiskInterval is how often a container's writable layer is measured.
const DefaultDiskInterval = 5 * time.Second

// watchDisk measures the container's writable layer (the overlay's upper directory) every
// DiskInterval and stops the container, with a ReasonDiskLimit reason, once it holds more than
// disk_mb. It returns when ctx ends or it stopped the container; a spec without disk_mb is not
// watched.
func (c *container) watchDisk(ctx context.Context) {
	if c.spec.DiskMB <= 0 {
		return
	}
	limit := int64(c.spec.DiskMB) << 20
	t := time.NewTicker(c.b.cfg.DiskInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		used, err := diskUsage(c.ov.upper)
		if err != nil {
			c.log.Debug("measure the writable layer", "error", err)
			continue
		}
		if used > limit {
			// Rounded up: a layer caught mid-write at 1.2 MiB over a 1 MiB limit reads "2 MiB",
			// never "1 MiB, disk_mb is 1".
			mib := (used + 1<<20 - 1) >> 20
			c.beginStop(fmt.Sprintf("%s: the container wrote %d MiB, disk_mb is %d", ReasonDiskLimit, mib, c.spec.DiskMB), c.b.cfg.KillGrace)
			return
		}
	}
}

// diskUsage is the space the files under dir take on disk (allocated blocks, each inode
// counted once). Files that go while it walks are skipped.
func diskUsage(dir string) (int64, error) {
	seen := map[uint64]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || seen[st.Ino] {
			return nil
		}
		seen[st.Ino] = true
		total += st.Blocks * 512
		return nil
	})
	return total, err
}
