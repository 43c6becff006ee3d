package oci

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
)

// TestImageGC: an image a running container uses is kept however old; once no container uses
// it, it is kept for ImageUnusedFor and then removed from containerd's store with its content
// and the layer snapshots no other image shares; the next container of the image pulls it again. An image this backend
// never saw used (an earlier rep's) counts as unused from the first sweep that found it.
func TestImageGC(t *testing.T) {
	// Set before New: the backend's sweeper reads it from its own goroutine.
	unusedForAnHour := func(c *Config) { c.ImageUnusedFor = time.Hour }
	b := newTestBackend(t, unusedForAnHour)
	uri := pushProbeImage(t, "collected")
	ref, _, err := imageRef(uri, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx := b.ctx(context.Background())

	start := func() {
		t.Helper()
		spec := fromImage(probeLRP(t, "sleep"), uri)
		c := startHealthy(t, b, spec)
		if removed := b.sweepImages(time.Now().Add(24 * time.Hour)); slices.Contains(removed, ref) {
			t.Errorf("an image in use was removed")
		}
		c.Stop(time.Second)
		assertGone(t, b, spec.Guid)
	}
	start()
	img, err := b.client.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chain := identity.ChainIDs(diffIDs)
	manifest := img.Target().Digest

	if removed := b.sweepImages(time.Now().Add(30 * time.Minute)); slices.Contains(removed, ref) {
		t.Fatalf("image removed after 30m unused, ImageUnusedFor is 1h")
	}
	if removed := b.sweepImages(time.Now().Add(2 * time.Hour)); !slices.Contains(removed, ref) {
		t.Fatalf("image not removed after 2h unused (removed %v)", removed)
	}
	if _, err := b.client.GetImage(ctx, ref); !errdefs.IsNotFound(err) {
		t.Errorf("image still in the store: %v", err)
	}
	if _, err := b.client.ContentStore().Info(ctx, manifest); !errdefs.IsNotFound(err) {
		t.Errorf("manifest content still in the store: %v", err)
	}
	// The image's own top layer snapshot goes; its base layer is the same as other tests'
	// images' (the same files), which keep it.
	top := chain[len(chain)-1].String()
	if _, err := b.client.SnapshotService(b.cfg.Snapshotter).Stat(ctx, top); !errdefs.IsNotFound(err) {
		t.Errorf("top layer snapshot %s still there: %v", top, err)
	}

	// Pulled again by the next container.
	start()

	// A fresh backend (a restarted rep) has not seen the image used: its first sweep starts
	// its unused time, a sweep an hour later removes it.
	b2 := newTestBackend(t, unusedForAnHour)
	now := time.Now()
	if removed := b2.sweepImages(now); slices.Contains(removed, ref) {
		t.Fatalf("first sweep removed an image it had never seen")
	}
	if removed := b2.sweepImages(now.Add(61 * time.Minute)); !slices.Contains(removed, ref) {
		t.Errorf("image not removed an hour after the first sweep saw it (removed %v)", removed)
	}
}
