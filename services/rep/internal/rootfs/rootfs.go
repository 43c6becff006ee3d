// Package rootfs resolves a work's root filesystem URI to a directory on the cell.
//
// Two kinds of URI are understood (docs/architecture.md §7):
//
//   - preloaded:NAME (or preloaded://NAME) is the directory the rep was configured with for
//     NAME. It is shared by every container and never copied.
//   - docker://[registry[:port]]/repo[#tag] is fetched over the registry v2 protocol with
//     go-containerregistry. The image's layers are flattened and unpacked once per image
//     digest into CacheDir/images/<digest>; every container then gets its own hard-linked
//     copy under CacheDir/containers/<guid>, removed by Rootfs.Release. An empty registry
//     ("docker:///library/redis#7") means Docker Hub.
//
// Hard-linked copies share file contents with the cached image: a process that rewrites a
// file in place (rather than replacing it) changes the cache too. Cached images are never
// garbage-collected.
package rootfs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gavel-sched/gavel/pkg/models"
)

// Schemes of the root filesystem URIs this package understands.
const (
	// SchemePreloaded names a directory configured on the rep.
	SchemePreloaded = "preloaded"
	// SchemeDocker names an image in a registry.
	SchemeDocker = "docker"
)

// ErrUnsupported is returned by Resolve for a URI this resolver cannot serve.
var ErrUnsupported = errors.New("unsupported rootfs")

// Config configures a Resolver.
type Config struct {
	// Preloaded maps a preloaded rootfs name to its directory.
	Preloaded map[string]string
	// Providers lists the dynamic rootfs schemes supported, e.g. ["docker"].
	Providers []string
	// CacheDir holds unpacked images and per-container copies; required for "docker".
	CacheDir string
	// ChrootPreloaded runs processes of preloaded rootfses chrooted into their directory.
	ChrootPreloaded bool
	// InsecureRegistries allows plain http to registries (for tests and local registries).
	InsecureRegistries bool
}

// Rootfs is a resolved root filesystem.
type Rootfs struct {
	// Path is the directory of the root filesystem.
	Path string
	// Chroot says whether processes should run chrooted into Path.
	Chroot bool
	// Release frees the container's copy; it is never nil and is safe to call twice.
	Release func()
}

// Resolver turns rootfs URIs into directories.
type Resolver struct {
	cfg Config

	mu       sync.Mutex
	inflight map[string]*unpackCall // image dir → unpack in progress

	unpacks atomic.Int64 // images unpacked, for tests
}

type unpackCall struct {
	done chan struct{}
	err  error
}

// NewResolver validates cfg and prepares the cache directories.
func NewResolver(cfg Config) (*Resolver, error) {
	for n, dir := range cfg.Preloaded {
		if n == "" || dir == "" {
			return nil, fmt.Errorf("rootfs: preloaded %q → %q: name and directory are required", n, dir)
		}
	}
	for _, p := range cfg.Providers {
		switch p {
		case SchemeDocker:
			if cfg.CacheDir == "" {
				return nil, fmt.Errorf("rootfs: provider %q needs a cache directory", p)
			}
		default:
			return nil, fmt.Errorf("rootfs: unknown provider %q (have %q)", p, SchemeDocker)
		}
	}
	if cfg.CacheDir != "" {
		for _, sub := range []string{"images", "containers"} {
			if err := os.MkdirAll(filepath.Join(cfg.CacheDir, sub), 0o755); err != nil {
				return nil, fmt.Errorf("rootfs: create cache directory: %w", err)
			}
		}
	}
	return &Resolver{cfg: cfg, inflight: map[string]*unpackCall{}}, nil
}

// preloadedName returns NAME for any spelling of "preloaded:NAME" (models.ParseRootfs).
func preloadedName(uri string) (string, bool) {
	r, err := models.ParseRootfs(uri)
	if err != nil || !r.Preloaded() {
		return "", false
	}
	return r.Name, true
}

// Supports reports whether uri can be resolved here: a known preloaded name, or a scheme
// among the configured providers.
func (r *Resolver) Supports(uri string) bool {
	if n, ok := preloadedName(uri); ok {
		_, known := r.cfg.Preloaded[n]
		return known
	}
	u, err := models.ParseRootfs(uri)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(r.cfg.Providers, func(p string) bool { return strings.EqualFold(p, u.Scheme) })
}

// Auth is the registry credentials a docker image is fetched with (the zero Auth: the
// machine's docker keychain, else anonymous).
type Auth struct {
	// Username is the registry user name; empty means no credentials.
	Username string
	// Password is Username's password or token.
	Password string
}

// Resolve returns the root filesystem for uri, for container containerGuid. For a docker
// image it fetches and unpacks the image when not cached and makes the container's copy; its
// manifest is fetched from the registry every time, with auth when it has a user name, so a
// cached image is no way around the registry's authentication.
func (r *Resolver) Resolve(ctx context.Context, uri, containerGuid string, auth Auth) (Rootfs, error) {
	if !r.Supports(uri) {
		return Rootfs{}, fmt.Errorf("resolve rootfs %q: %w", uri, ErrUnsupported)
	}
	if n, ok := preloadedName(uri); ok {
		return Rootfs{Path: r.cfg.Preloaded[n], Chroot: r.cfg.ChrootPreloaded, Release: func() {}}, nil
	}
	if !validGuid(containerGuid) {
		return Rootfs{}, fmt.Errorf("resolve rootfs %q: invalid container guid %q", uri, containerGuid)
	}
	ref, err := r.DockerReference(uri)
	if err != nil {
		return Rootfs{}, fmt.Errorf("resolve rootfs %q: %w", uri, err)
	}
	imageDir, err := r.image(ctx, ref, auth)
	if err != nil {
		return Rootfs{}, fmt.Errorf("resolve rootfs %q: %w", uri, err)
	}
	dst := filepath.Join(r.cfg.CacheDir, "containers", containerGuid)
	if err := os.RemoveAll(dst); err != nil {
		return Rootfs{}, fmt.Errorf("resolve rootfs %q: clear old copy: %w", uri, err)
	}
	if err := linkTree(imageDir, dst); err != nil {
		_ = os.RemoveAll(dst)
		return Rootfs{}, fmt.Errorf("resolve rootfs %q: copy for container %s: %w", uri, containerGuid, err)
	}
	var once sync.Once
	release := func() { once.Do(func() { _ = os.RemoveAll(dst) }) }
	return Rootfs{Path: dst, Chroot: true, Release: release}, nil
}

// DockerReference turns docker://[registry[:port]]/repo[#tag|#sha256:...] into an image
// reference. An empty registry means Docker Hub, a missing tag "latest".
func (r *Resolver) DockerReference(uri string) (name.Reference, error) {
	parsed, err := models.ParseRootfs(uri)
	if err != nil {
		return nil, fmt.Errorf("rootfs %q %v", uri, err)
	}
	u, err := url.Parse(parsed.String())
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", uri, err)
	}
	if u.Scheme != SchemeDocker {
		return nil, fmt.Errorf("%q is not a docker URI", uri)
	}
	repoPath := strings.Trim(u.Path, "/")
	if repoPath == "" {
		return nil, fmt.Errorf("%q names no repository", uri)
	}
	var opts []name.Option
	if r.cfg.InsecureRegistries {
		opts = append(opts, name.Insecure)
	}
	host := u.Host
	if host == "" {
		host = name.DefaultRegistry
		if !strings.Contains(repoPath, "/") {
			repoPath = "library/" + repoPath
		}
	}
	reg, err := name.NewRegistry(host, opts...)
	if err != nil {
		return nil, fmt.Errorf("registry of %q: %w", uri, err)
	}
	// The registry is taken from the URI's host even when it has no dot or port, so the
	// reference is built from parts; the repository and tag are validated on their own.
	repo := reg.Repo(repoPath)
	const probe = "registry.invalid/"
	switch tag := u.Fragment; {
	case tag == "":
		if _, err := name.NewRepository(probe+repoPath, opts...); err != nil {
			return nil, fmt.Errorf("repository of %q: %w", uri, err)
		}
		return repo.Tag(name.DefaultTag), nil
	case strings.Contains(tag, ":"):
		if _, err := name.NewDigest(probe+repoPath+"@"+tag, opts...); err != nil {
			return nil, fmt.Errorf("digest of %q: %w", uri, err)
		}
		return repo.Digest(tag), nil
	default:
		if _, err := name.NewTag(probe+repoPath+":"+tag, opts...); err != nil {
			return nil, fmt.Errorf("tag of %q: %w", uri, err)
		}
		return repo.Tag(tag), nil
	}
}

// image fetches ref's manifest and returns the directory it is unpacked in, unpacking it
// once per digest (concurrent callers for the same image wait for one unpack).
func (r *Resolver) image(ctx context.Context, ref name.Reference, auth Auth) (string, error) {
	authOpt := remote.WithAuthFromKeychain(authn.DefaultKeychain)
	if auth.Username != "" {
		authOpt = remote.WithAuth(&authn.Basic{Username: auth.Username, Password: auth.Password})
	}
	img, err := remote.Image(ref,
		remote.WithContext(ctx),
		authOpt,
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
	)
	if err != nil {
		return "", fmt.Errorf("fetch image %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("digest of image %s: %w", ref, err)
	}
	dir := filepath.Join(r.cfg.CacheDir, "images", digest.Algorithm+"-"+digest.Hex)

	for attempt := 0; attempt < 3; attempt++ {
		if _, err := os.Stat(dir); err == nil {
			return dir, nil
		}
		r.mu.Lock()
		call, running := r.inflight[dir]
		if !running {
			call = &unpackCall{done: make(chan struct{})}
			r.inflight[dir] = call
		}
		r.mu.Unlock()
		if running {
			select {
			case <-call.done:
			case <-ctx.Done():
				return "", fmt.Errorf("wait for unpack of %s: %w", ref, context.Cause(ctx))
			}
			if call.err != nil {
				// The unpack failed for that caller (maybe its context ended): try again.
				continue
			}
			return dir, nil
		}
		call.err = r.unpack(img, dir)
		r.mu.Lock()
		delete(r.inflight, dir)
		r.mu.Unlock()
		close(call.done)
		if call.err != nil {
			return "", fmt.Errorf("unpack image %s: %w", ref, call.err)
		}
		return dir, nil
	}
	return "", fmt.Errorf("unpack image %s: gave up after concurrent unpacks failed", ref)
}

// unpack flattens img into a temporary directory and renames it to dir.
func (r *Resolver) unpack(img v1.Image, dir string) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".unpack-")
	if err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	rc := mutate.Extract(img)
	err = Untar(rc, tmp, UntarOptions{KeepOwners: os.Geteuid() == 0})
	_ = rc.Close()
	if err == nil {
		// The unpacked tree is the rootfs "/": make it traversable.
		err = os.Chmod(tmp, 0o755)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		_ = os.RemoveAll(tmp)
		if _, statErr := os.Stat(dir); statErr == nil {
			return nil // another process unpacked it first
		}
		return fmt.Errorf("move into the cache: %w", err)
	}
	r.unpacks.Add(1)
	return nil
}

// validGuid reports whether guid can name a directory.
func validGuid(guid string) bool {
	return guid != "" && guid != "." && guid != ".." && !strings.ContainsAny(guid, "/\\\x00")
}
