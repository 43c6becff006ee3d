package oci

import (
	"context"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
)

// Defaults of the image garbage collection (docs/decisions/0046-oci-image-gc-and-credentials.md).
const (
	// DefaultImageUnusedFor is how long a pulled image no container of the cell uses is kept.
	DefaultImageUnusedFor = 10 * time.Minute
	// maxImageGCInterval bounds the time between two sweeps.
	maxImageGCInterval = time.Minute
)

// useImage counts one more container of image ref (from before its pull until the container
// is cleaned up): the garbage collection keeps the image while it has one.
func (b *Backend) useImage(ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.imageUsers[ref]++
}

// releaseImage counts one container of image ref less; the image's unused time starts when it
// has none.
func (b *Backend) releaseImage(ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.imageUsers[ref]--; b.imageUsers[ref] <= 0 {
		delete(b.imageUsers, ref)
		b.imageUnused[ref] = time.Now()
	}
}

// imageGCInterval is the time between two sweeps: a fifth of the unused time, at most a minute.
func (b *Backend) imageGCInterval() time.Duration {
	if b.cfg.ImageGCInterval > 0 {
		return b.cfg.ImageGCInterval
	}
	return min(max(b.cfg.ImageUnusedFor/5, time.Second), maxImageGCInterval)
}

// collectImages sweeps the images until the backend is closed (not with ImageUnusedFor < 0).
func (b *Backend) collectImages() {
	if b.cfg.ImageUnusedFor < 0 {
		return
	}
	t := time.NewTicker(b.imageGCInterval())
	defer t.Stop()
	for {
		select {
		case <-b.closed:
			return
		case <-t.C:
			b.sweepImages(time.Now())
		}
	}
}

// sweepImages removes the images of the backend's namespace that no container of the cell has
// used for ImageUnusedFor (an image this rep has not seen used counts from the first sweep
// that found it), synchronously, so containerd's garbage collector drops at once their content
// and the layer snapshots no other image or container shares. A removed image is pulled again
// by the next container that names it. It returns the names of the images removed.
func (b *Backend) sweepImages(now time.Time) []string {
	ctx, cancel := context.WithTimeout(b.ctx(context.Background()), cleanupTimeout)
	defer cancel()
	is := b.client.ImageService()
	list, err := is.List(ctx)
	if err != nil {
		b.log.Warn("image garbage collection: list images", "error", err)
		return nil
	}
	var removed []string
	for _, img := range list {
		ref := img.Name
		b.mu.Lock()
		since, seen := b.imageUnused[ref]
		if !seen && b.imageUsers[ref] == 0 {
			b.imageUnused[ref] = now
		}
		due := seen && b.imageUsers[ref] == 0 && now.Sub(since) >= b.cfg.ImageUnusedFor
		b.mu.Unlock()
		if !due {
			continue
		}
		// Under the image's pull lock, and with no user counted then: a start that counts
		// itself afterwards waits for the lock and pulls the image again.
		unlock, err := b.lockPull(ctx, ref)
		if err != nil {
			continue
		}
		b.mu.Lock()
		due = b.imageUsers[ref] == 0
		b.mu.Unlock()
		if due {
			err = is.Delete(ctx, ref, images.SynchronousDelete())
			if err == nil || errdefs.IsNotFound(err) {
				b.mu.Lock()
				delete(b.imageUnused, ref)
				b.mu.Unlock()
				removed = append(removed, ref)
				b.log.Info("removed an unused image", "image", ref, "unused_for", now.Sub(since).Round(time.Second))
			} else {
				b.log.Warn("image garbage collection: remove image", "image", ref, "error", err)
			}
		}
		unlock()
	}
	return removed
}
