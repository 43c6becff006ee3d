package oci

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// pushProbeImage pushes an image of the tests' rootfs (bin/probe, etc/passwd, tmp/) plus
// /marker holding marker to an in-process registry on 127.0.0.1 and returns its URI.
func pushProbeImage(t *testing.T, marker string) string {
	t.Helper()
	return pushProbeImageTo(t, marker, "", "")
}

// pushProbeImageTo is pushProbeImage to a registry that requires user and password (none when
// user is empty).
func pushProbeImageTo(t *testing.T, marker, user, password string) string {
	t.Helper()
	return pushProbeImageWith(t, marker, user, password, rootfstest.NewAuthRegistry)
}

// pushProbeImageWith is pushProbeImageTo a registry newRegistry starts (NewAuthRegistry,
// NewTokenRegistry).
func pushProbeImageWith(t *testing.T, marker, user, password string, newRegistry func(testing.TB, string, string) string) string {
	t.Helper()
	probe, err := os.ReadFile(filepath.Join(rootfsDir, "bin", "probe"))
	if err != nil {
		t.Fatal(err)
	}
	passwd, err := os.ReadFile(filepath.Join(rootfsDir, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	host := ""
	if user == "" {
		host = rootfstest.NewRegistry(t)
	} else {
		host = newRegistry(t, user, password)
	}
	base := rootfstest.Layer(t,
		rootfstest.File{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		rootfstest.File{Name: "bin/probe", Mode: 0o755, Body: probe},
		rootfstest.File{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		rootfstest.File{Name: "etc/passwd", Mode: 0o644, Body: passwd},
		rootfstest.File{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	)
	top := rootfstest.Layer(t, rootfstest.File{Name: "marker", Mode: 0o644, Body: []byte(marker)})
	if user != "" {
		uri, _ := rootfstest.PushAuth(t, host, "gavel/probe", "v1", user, password, base, top)
		return uri
	}
	uri, _ := rootfstest.Push(t, host, "gavel/probe", "v1", base, top)
	return uri
}

// fromImage is spec with the image at uri as its rootfs, as the cell hands it to the oci
// backend: the URI and no resolved directory.
func fromImage(spec executor.Spec, uri string) executor.Spec {
	spec.Rootfs, spec.RootfsPath = uri, ""
	return spec
}

// assertNoSnapshot checks that container guid's snapshot is gone.
func assertNoSnapshot(t *testing.T, b *Backend, guid string) {
	t.Helper()
	if _, err := b.client.SnapshotService(b.cfg.Snapshotter).Stat(b.ctx(context.Background()), guid); !errdefs.IsNotFound(err) {
		t.Errorf("snapshot %s still there (err %v)", guid, err)
	}
}

// TestImageLayersShared: two containers of one docker:// image (pulled from a registry on
// 127.0.0.1, over plain HTTP) run the image's binary on snapshots of the same image layers:
// one image in containerd's store, two active snapshots with the same parent, the image's
// top layer. A task of the image reads the image's file. Stopping removes each container's
// snapshot; the image stays.
func TestImageLayersShared(t *testing.T) {
	b := newTestBackend(t)
	uri := pushProbeImage(t, "from the image")
	ctx := b.ctx(context.Background())

	var cs []executor.Container
	var specs []executor.Spec
	for range 2 {
		spec := fromImage(probeLRP(t, "sleep"), uri)
		c, err := b.Start(context.Background(), spec)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		t.Cleanup(func() { c.Stop(0) })
		select {
		case <-c.Healthy():
		case <-c.Done():
			t.Fatalf("container of the image ended: %+v", c.Result())
		case <-time.After(time.Minute):
			t.Fatal("container of the image not running within a minute")
		}
		cs, specs = append(cs, c), append(specs, spec)
	}

	ref, plain, err := imageRef(uri, false)
	if err != nil || !plain {
		t.Fatalf("imageRef(%s) = %s, plain HTTP %v, %v; want plain HTTP to a loopback registry", uri, ref, plain, err)
	}
	imgs, err := b.client.ImageService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, img := range imgs {
		if strings.Contains(img.Name, "gavel/probe") {
			names = append(names, img.Name)
		}
	}
	if len(names) != 1 || names[0] != ref {
		t.Errorf("images in containerd's store: %v, want one: %s", names, ref)
	}
	img, err := b.client.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil || len(diffIDs) != 2 {
		t.Fatalf("image layers: %v, %v; want 2", diffIDs, err)
	}
	top := identity.ChainID(diffIDs).String()
	sn := b.client.SnapshotService(b.cfg.Snapshotter)
	for i, spec := range specs {
		info, err := sn.Stat(ctx, spec.Guid)
		if err != nil {
			t.Fatalf("snapshot of container %d: %v", i, err)
		}
		if info.Parent != top {
			t.Errorf("snapshot of container %d has parent %s, want the image's top layer %s", i, info.Parent, top)
		}
		if up := cs[i].(*container).ov.upper; !strings.HasPrefix(up, daemon.Dir) {
			t.Errorf("writable layer of container %d is %s, not in the test containerd's directory %s", i, up, daemon.Dir)
		}
	}

	res := run(t, b, fromImage(probeTask(t, "cat", "/marker"), uri))
	if res.Failed || res.Output != "from the image" {
		t.Errorf("task of the image: %+v, want the image's /marker", res)
	}

	for i, c := range cs {
		c.Stop(time.Second)
		assertGone(t, b, specs[i].Guid)
		assertNoSnapshot(t, b, specs[i].Guid)
	}
	if _, err := b.client.GetImage(ctx, ref); err != nil {
		t.Errorf("the image left the store with its containers: %v", err)
	}
}

// TestImagePullFailures: an image that cannot be pulled (an unreachable registry, a tag the
// registry does not have, an invalid reference) fails the start with the reason, and leaves
// no container, mount, directory or snapshot.
func TestImagePullFailures(t *testing.T) {
	b := newTestBackend(t)
	uri := pushProbeImage(t, "x")
	host := strings.TrimSuffix(strings.TrimPrefix(uri, "docker://"), "/gavel/probe#v1")
	for _, tc := range []struct{ uri, want string }{
		{"docker://127.0.0.1:1/gavel/probe#v1", "pull image 127.0.0.1:1/gavel/probe:v1: "},
		{"docker://" + host + "/gavel/probe#missing", "pull image " + host + "/gavel/probe:missing: "},
		{"docker://" + host + "/gavel/probe#bad:tag:", "pull image: "},
	} {
		spec := fromImage(probeLRP(t, "sleep"), tc.uri)
		c, err := b.Start(context.Background(), spec)
		if err == nil {
			c.Stop(0)
			t.Errorf("Start of %s succeeded", tc.uri)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start of %s: %v, want %q", tc.uri, err, tc.want)
		}
		t.Logf("%s: %v", tc.uri, err)
		assertGone(t, b, spec.Guid)
		assertNoSnapshot(t, b, spec.Guid)
	}
}

// TestImagePullCredentials: an image of a registry that requires basic authentication, or a
// bearer token from its realm (as Docker Hub), is pulled with the spec's image credentials; without them, or with wrong ones, the start fails
// with a reason naming the image and the registry's refusal (and never the password), leaving
// nothing. An image already in the store is no way around the registry's authentication.
func TestImagePullCredentials(t *testing.T) {
	b := newTestBackend(t)
	t.Run("basic", func(t *testing.T) { testPullCredentials(t, b, rootfstest.NewAuthRegistry) })
	t.Run("token", func(t *testing.T) { testPullCredentials(t, b, rootfstest.NewTokenRegistry) })
}

func testPullCredentials(t *testing.T, b *Backend, newRegistry func(testing.TB, string, string) string) {
	uri := pushProbeImageWith(t, "behind a password", "alice", "s3cret", newRegistry)
	ref, _, err := imageRef(uri, false)
	if err != nil {
		t.Fatal(err)
	}
	task := func(user, password string) executor.Spec {
		s := fromImage(probeTask(t, "cat", "/marker"), uri)
		s.ImageUsername, s.ImagePassword = user, password
		return s
	}
	res := run(t, b, task("alice", "s3cret"))
	if res.Failed || res.Output != "behind a password" {
		t.Fatalf("with the right credentials: %+v, want the image's /marker", res)
	}
	for _, tc := range []struct{ name, user, password string }{
		{"none", "", ""},
		{"wrong password", "alice", "wrong-secret"},
		{"wrong user", "mallory", "s3cret"},
	} {
		spec := task(tc.user, tc.password)
		c, err := b.Start(context.Background(), spec)
		if err == nil {
			c.Stop(0)
			t.Errorf("%s: Start succeeded", tc.name)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "pull image "+ref+": ") || !strings.Contains(msg, "401 Unauthorized") {
			t.Errorf("%s: Start: %v, want the image %s refused with 401 Unauthorized", tc.name, err, ref)
		}
		if tc.password != "" && strings.Contains(msg, tc.password) {
			t.Errorf("%s: the reason shows the password: %v", tc.name, err)
		}
		t.Logf("%s: %v", tc.name, err)
		assertGone(t, b, spec.Guid)
		assertNoSnapshot(t, b, spec.Guid)
	}
}

// TestImageDiskLimit: disk_mb holds for a container of an image: its writable layer is its
// snapshot's upper directory.
func TestImageDiskLimit(t *testing.T) {
	b := newTestBackend(t)
	b.cfg.DiskInterval = 50 * time.Millisecond
	spec := fromImage(probeLRP(t, "fill", "3"), pushProbeImage(t, "x"))
	assertStoppedForDisk(t, b, spec)
	assertNoSnapshot(t, b, spec.Guid)
}

// TestImageAdoption: a restarted rep adopts a container of an image with its snapshot, and
// measures the right writable layer: the first backend never measures (its interval is an
// hour), the second stops the container for its disk_mb, then its snapshot is gone.
func TestImageAdoption(t *testing.T) {
	newTestBackend(t) // skips without containerd
	cfg := adoptionConfig(t)
	cfg.DiskInterval = time.Hour
	first := adoptionBackend(t, daemon.Socket, cfg)
	spec := fromImage(probeLRP(t, "fill", "3"), pushProbeImage(t, "x"))
	spec.DiskMB = 1
	c, err := first.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	<-c.Healthy()
	upper := c.(*container).ov.upper
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	cfg.DiskInterval = 50 * time.Millisecond
	second := adoptionBackend(t, daemon.Socket, cfg)
	adopted, err := second.Adopt(context.Background(), nil)
	if err != nil || len(adopted) != 1 || adopted[0].Spec.Guid != spec.Guid {
		t.Fatalf("Adopt = %+v, %v; want %s", adopted, err, spec.Guid)
	}
	ac := adopted[0].Container
	if got := ac.(*container).ov.upper; got != upper {
		t.Errorf("adopted writable layer %s, want %s", got, upper)
	}
	select {
	case <-ac.Done():
	case <-time.After(time.Minute):
		ac.Stop(0)
		t.Fatal("an adopted container of an image writing 3 MiB with disk_mb 1 was not stopped")
	}
	if res := ac.Result(); !res.Failed || !strings.HasPrefix(res.Reason, ReasonDiskLimit) {
		t.Errorf("Result = %+v, want %q", res, ReasonDiskLimit)
	}
	assertGone(t, second, spec.Guid)
	assertNoSnapshot(t, second, spec.Guid)
}

// TestImageLeftoverRemoved: what a container of an image leaves when its containerd container
// is gone while the rep is down (its directory, mount and snapshot) is removed by the next
// rep's adoption sweep.
func TestImageLeftoverRemoved(t *testing.T) {
	newTestBackend(t) // skips without containerd
	cfg := adoptionConfig(t)
	first := adoptionBackend(t, daemon.Socket, cfg)
	spec := fromImage(probeLRP(t, "sleep"), pushProbeImage(t, "x"))
	c, err := first.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	<-c.Healthy()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := adoptionBackend(t, daemon.Socket, cfg)
	ctx := second.ctx(context.Background())
	ctr, err := second.client.LoadContainer(ctx, spec.Guid)
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil {
		t.Fatal(err)
	}
	if err := ctr.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := second.client.SnapshotService(second.cfg.Snapshotter).Stat(ctx, spec.Guid); err != nil {
		t.Fatalf("the snapshot is gone with the containerd container (%v): nothing left to sweep", err)
	}
	adopted, err := second.Adopt(context.Background(), nil)
	if err != nil || len(adopted) != 0 {
		t.Fatalf("Adopt = %+v, %v; want nothing adopted", adopted, err)
	}
	assertGone(t, second, spec.Guid)
	assertNoSnapshot(t, second, spec.Guid)
}

// TestImageConcurrentStarts: instances of a new image starting at once (a deploy) pull and
// unpack it together and all run, on one image and its layers.
func TestImageConcurrentStarts(t *testing.T) {
	b := newTestBackend(t)
	uri := pushProbeImage(t, "x")
	const n = 4
	errs := make(chan error, n)
	specs := make([]executor.Spec, n)
	for i := range specs {
		specs[i] = fromImage(probeLRP(t, "sleep"), uri)
	}
	for _, spec := range specs {
		go func() {
			c, err := b.Start(context.Background(), spec)
			if err == nil {
				t.Cleanup(func() {
					c.Stop(time.Second)
					assertGone(t, b, spec.Guid)
					assertNoSnapshot(t, b, spec.Guid)
				})
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Start: %v", err)
		}
	}
	ctx := b.ctx(context.Background())
	parents := map[string]bool{}
	for _, spec := range specs {
		if info, err := b.client.SnapshotService(b.cfg.Snapshotter).Stat(ctx, spec.Guid); err == nil {
			parents[info.Parent] = true
		}
	}
	if len(parents) != 1 {
		t.Errorf("the containers' snapshots have parents %v, want one", parents)
	}
}
