package cell

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/gavel-sched/gavel/pkg/models"
)

// Rootfs is a resolved root filesystem for one container.
type Rootfs struct {
	// Path is the root filesystem directory; empty runs on the host's.
	Path string
	// Chroot runs the container's processes chrooted into Path.
	Chroot bool
	// Release frees what resolving took (e.g. a per-container unpacked image); may be nil.
	Release func()
}

// Resolver turns a work's rootfs URI into a directory for one container. The rep's real
// resolver is services/rep/internal/rootfs; StaticResolver serves the sim backend.
type Resolver interface {
	// Supports reports whether the cell can provide uri (a preloaded name it has, or a
	// provider scheme it supports).
	Supports(uri string) bool
	// Resolve makes uri available to the container containerGuid, fetching an image with
	// auth (the work's image credentials).
	Resolve(ctx context.Context, uri, containerGuid string, auth ImageAuth) (Rootfs, error)
}

// ImageAuth is the registry credentials of a work's docker:// rootfs (image_username,
// image_password); the zero ImageAuth fetches without.
type ImageAuth struct {
	// Username is the registry user name; empty means none.
	Username string
	// Password is Username's password or token.
	Password string
}

// StaticResolver supports the preloaded names and provider schemes it was given and resolves
// without fetching anything: a preloaded name to its path, a provider URI to no directory.
// It serves the sim backend, where nothing runs inside the rootfs.
type StaticResolver struct {
	preloaded map[string]string
	providers map[string]bool
}

var _ Resolver = (*StaticResolver)(nil)

// NewStaticResolver builds a StaticResolver.
func NewStaticResolver(preloaded map[string]string, providers []string) *StaticResolver {
	r := &StaticResolver{preloaded: map[string]string{}, providers: map[string]bool{}}
	for k, v := range preloaded {
		r.preloaded[k] = v
	}
	for _, p := range providers {
		r.providers[strings.ToLower(p)] = true
	}
	return r
}

// Supports reports whether uri names a preloaded rootfs or a supported provider.
func (r *StaticResolver) Supports(uri string) bool {
	rfs, err := models.ParseRootfs(uri)
	if err != nil {
		return false
	}
	if rfs.Preloaded() {
		_, ok := r.preloaded[rfs.Name]
		return ok
	}
	return r.providers[rfs.Scheme]
}

// Resolve returns the preloaded path of uri, or no directory for a provider URI.
func (r *StaticResolver) Resolve(_ context.Context, uri, _ string, _ ImageAuth) (Rootfs, error) {
	if !r.Supports(uri) {
		return Rootfs{}, fmt.Errorf("rootfs %q is not supported by this cell", uri)
	}
	rfs, _ := models.ParseRootfs(uri)
	return Rootfs{Path: r.preloaded[rfs.Name]}, nil
}

// sortedKeys lists a map's keys in order.
func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
