package oci

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/image-spec/identity"

	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs"
)

// DefaultSnapshotter is the containerd snapshotter docker:// images are unpacked by.
const DefaultSnapshotter = "overlayfs"

// gcRootLabel keeps a container's snapshot from containerd's garbage collector until the
// backend removes it: the containerd container does not name it (see imageRootfs).
const gcRootLabel = "containerd.io/gc.root"

// isImage reports whether the spec's rootfs is a docker:// image the backend pulls itself:
// its URI is docker://… and the cell resolved no directory for it.
func isImage(spec executor.Spec) bool {
	if spec.RootfsPath != "" {
		return false
	}
	r, err := models.ParseRootfs(spec.Rootfs)
	return err == nil && r.Scheme == rootfs.SchemeDocker
}

// imageRef is docker:// URI uri as a containerd reference ("host/repo:tag" or
// "host/repo@digest"; Docker Hub is docker.io), and whether its registry is spoken to over
// plain HTTP: the decision of go-containerregistry, the process backend's registry client
// (a loopback, localhost or private address, or any registry when insecure).
func imageRef(uri string, insecure bool) (ref string, plainHTTP bool, err error) {
	r, err := rootfs.NewResolver(rootfs.Config{InsecureRegistries: insecure})
	if err != nil {
		return "", false, err
	}
	nref, err := r.DockerReference(uri)
	if err != nil {
		return "", false, err
	}
	repo := nref.Context()
	host := repo.RegistryStr()
	if host == name.DefaultRegistry {
		host = "docker.io"
	}
	ref = host + "/" + repo.RepositoryStr()
	if d, ok := nref.(name.Digest); ok {
		ref += "@" + d.DigestStr()
	} else {
		ref += ":" + nref.Identifier()
	}
	return ref, repo.Registry.Scheme() == "http", nil
}

// pull pulls the image of docker:// URI uri into containerd's content store and unpacks it
// with the backend's snapshotter (layers already there are not fetched or unpacked again).
// With a user name, the registry's challenges (basic, or a bearer token from its realm) are
// answered with user and password (containerd's docker authorizer); the manifest is resolved
// at the registry on every pull, so an image in the store is no way around the registry's
// authentication.
func (b *Backend) pull(ctx context.Context, uri, user, password string) (containerd.Image, error) {
	ref, plain, err := imageRef(uri, b.cfg.InsecureRegistries)
	if err != nil {
		return nil, fmt.Errorf("pull image: %w", err)
	}
	// One pull of a reference at a time: concurrent pulls of the same new image contend for
	// the same blobs in the content store and back off (4 starts of one image took 4.5 s each,
	// against 0.2 s for one); the next pull finds the content there.
	unlock, err := b.lockPull(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("pull image %s: %w", ref, err)
	}
	defer unlock()
	hostOpts := []docker.RegistryOpt{docker.WithPlainHTTP(func(string) (bool, error) { return plain, nil })}
	if user != "" {
		hostOpts = append(hostOpts, docker.WithAuthorizer(docker.NewDockerAuthorizer(
			docker.WithAuthCreds(func(string) (string, string, error) { return user, password, nil }))))
	}
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(hostOpts...)})
	img, err := b.client.Pull(ctx, ref,
		containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(b.cfg.Snapshotter),
		containerd.WithResolver(resolver))
	if err != nil {
		return nil, fmt.Errorf("pull image %s: %w", ref, err)
	}
	return img, nil
}

// pullLock serializes the pulls of one reference; n counts its holders and waiters.
type pullLock struct {
	ch chan struct{}
	n  int
}

// lockPull waits, as long as ctx lets it, until no other pull of ref runs, and returns the
// function that lets the next one go.
func (b *Backend) lockPull(ctx context.Context, ref string) (func(), error) {
	b.mu.Lock()
	if b.pulls == nil {
		b.pulls = map[string]*pullLock{}
	}
	l := b.pulls[ref]
	if l == nil {
		l = &pullLock{ch: make(chan struct{}, 1)}
		b.pulls[ref] = l
	}
	l.n++
	b.mu.Unlock()
	release := func() {
		b.mu.Lock()
		if l.n--; l.n == 0 {
			delete(b.pulls, ref)
		}
		b.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, fmt.Errorf("wait for another pull of the image: %w", context.Cause(ctx))
	}
}

// imageRootfs is a container's root filesystem from an image: an active snapshot of the
// backend's snapshotter, keyed by the container's guid, whose parent is the image's top
// layer (shared by every container of the image). The backend mounts it at the container's
// rootfs itself, as it mounts a preloaded rootfs's overlay, rather than handing it to the
// containerd container (containerd.WithNewSnapshot): the shim would mount it a second time,
// in the bundle, on the same upper directory, and the rep needs it mounted before the task
// exists (downloads, /etc/passwd, the files directory) and after it ended (the result file).
// The snapshot carries gcRootLabel; removeSnapshot removes it.
func (b *Backend) imageRootfs(ctx context.Context, guid string, img containerd.Image, ov *overlay) error {
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return fmt.Errorf("image %s: layers: %w", img.Name(), err)
	}
	parent := identity.ChainID(diffIDs).String()
	sn := b.client.SnapshotService(b.cfg.Snapshotter)
	mounts, err := sn.Prepare(ctx, guid, parent,
		snapshots.WithLabels(map[string]string{gcRootLabel: time.Now().UTC().Format(time.RFC3339)}))
	if err != nil {
		return fmt.Errorf("image %s: snapshot: %w", img.Name(), err)
	}
	ov.upper = writableLayer(mounts)
	if ov.upper == "" {
		_ = b.removeSnapshot(ctx, guid)
		return fmt.Errorf("image %s: snapshotter %s gave no writable directory in %+v", img.Name(), b.cfg.Snapshotter, mounts)
	}
	if err := os.MkdirAll(ov.root, 0o755); err != nil {
		_ = b.removeSnapshot(ctx, guid)
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := mount.All(mounts, ov.root); err != nil {
		_ = b.removeSnapshot(ctx, guid)
		return fmt.Errorf("image %s: mount snapshot on %s: %w", img.Name(), ov.root, err)
	}
	return nil
}

// writableLayer is the directory of mounts a container writes to: an overlay's upperdir, or
// the source of a bind mount (an active snapshot without parents). "" when there is none.
func writableLayer(mounts []mount.Mount) string {
	if len(mounts) != 1 {
		return ""
	}
	m := mounts[0]
	switch m.Type {
	case "overlay":
		for _, o := range m.Options {
			if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
				return dir
			}
		}
	case "bind":
		return m.Source
	}
	return ""
}

// removeSnapshot removes the snapshot of container guid; a missing one is not an error.
func (b *Backend) removeSnapshot(ctx context.Context, guid string) error {
	err := b.client.SnapshotService(b.cfg.Snapshotter).Remove(ctx, guid)
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove snapshot %s: %w", guid, err)
	}
	return nil
}
