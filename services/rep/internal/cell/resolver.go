package cell

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
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
	// Resolve makes uri available to the container containerGuid.
	Resolve(ctx context.Context, uri, containerGuid string) (Rootfs, error)
}

// PreloadedScheme is the rootfs URI scheme of preloaded root filesystems.
const PreloadedScheme = "preloaded"

// ParseRootfs splits a rootfs URI into its scheme and, for preloaded:NAME and
// preloaded://NAME, the name.
func ParseRootfs(uri string) (scheme, name string, err error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", "", fmt.Errorf("rootfs %q: %w", uri, err)
	}
	if u.Scheme == "" {
		return "", "", fmt.Errorf("rootfs %q: missing scheme", uri)
	}
	scheme = strings.ToLower(u.Scheme)
	if scheme == PreloadedScheme {
		rest := uri[len(u.Scheme)+1:]
		if i := strings.IndexAny(rest, "?#"); i >= 0 {
			rest = rest[:i]
		}
		name = strings.Trim(rest, "/")
		if name == "" {
			return "", "", fmt.Errorf("rootfs %q: missing preloaded name", uri)
		}
	}
	return scheme, name, nil
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
	scheme, name, err := ParseRootfs(uri)
	if err != nil {
		return false
	}
	if scheme == PreloadedScheme {
		_, ok := r.preloaded[name]
		return ok
	}
	return r.providers[scheme]
}

// Resolve returns the preloaded path of uri, or no directory for a provider URI.
func (r *StaticResolver) Resolve(_ context.Context, uri, _ string) (Rootfs, error) {
	if !r.Supports(uri) {
		return Rootfs{}, fmt.Errorf("rootfs %q is not supported by this cell", uri)
	}
	_, name, _ := ParseRootfs(uri)
	return Rootfs{Path: r.preloaded[name]}, nil
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
