package process

import (
	"context"
	"path/filepath"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	fetch "github.com/gavel-sched/gavel/services/rep/internal/executor/download"
)

// download fetches d.From (http or https) and extracts it into d.To when it is a tar or a
// gzipped tar; anything else is saved as an executable file at d.To (or in it, when d.To is a
// directory). The checksum, when given, is verified before anything is written. What it
// writes is owned by the container's user.
//
// It writes through an os.Root of the directory confined gives, with fetch.Into (package
// download): a symbolic link of the rootfs or of the archive that leads outside it (such as
// /app -> /etc in a chrooted container's rootfs) is refused, so a download never writes
// outside. Without a rootfs, an absolute d.To is a host path (the container has no filesystem
// of its own).
func (c *container) download(ctx context.Context, d *modelsv1.DownloadAction) error {
	root, _ := c.confined(d.GetTo())
	uid, gid := -1, -1
	if c.cred != nil {
		uid, gid = int(c.cred.Uid), int(c.cred.Gid)
	}
	return fetch.Into(ctx, d, root, c.dir, uid, gid)
}

// confined is the directory the rep confines its reads and writes of container path p to
// (through an os.Root), and p inside it: the rootfs when chrooted; otherwise the container's
// directory for a relative p, and the host's / for an absolute one.
func (c *container) confined(p string) (root, rel string) {
	switch {
	case c.root != "":
		root = c.root
	case filepath.IsAbs(p):
		root = "/"
	default:
		root = c.dir
	}
	return root, fetch.InRoot(p)
}
