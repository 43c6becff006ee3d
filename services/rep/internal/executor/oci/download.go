package oci

import (
	"context"
	"time"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/download"
)

// DownloadTimeout bounds the download actions of one container's start, together.
const DownloadTimeout = 10 * time.Minute

// downloads runs spec's download actions (Downloads) in order into its root filesystem
// rootDir (its overlay mount, before the container's process starts), fetching into dir, owned
// by the user its process runs as. download.Into writes through an os.Root of rootDir, so no
// symbolic link or ".." leads a download outside the container's root filesystem.
func (b *Backend) downloads(ctx context.Context, spec executor.Spec, rootDir, dir string, users map[string]IDs) error {
	ds, err := Downloads(spec)
	if err != nil || len(ds) == 0 {
		return err
	}
	ra, err := MainProcess(spec)
	if err != nil {
		return err
	}
	ids, err := processUser(spec, ra, SpecConfig{Users: users, DefaultUser: b.cfg.User})
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DownloadTimeout)
	defer cancel()
	for _, d := range ds {
		if err := download.Into(dctx, d, rootDir, dir, int(ids.UID), int(ids.GID)); err != nil {
			return err
		}
	}
	return nil
}
