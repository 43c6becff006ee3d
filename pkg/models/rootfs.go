package models

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Rootfs URI schemes Gavel itself knows.
const (
	// RootfsPreloaded names a root filesystem preloaded on the cell: preloaded:NAME.
	RootfsPreloaded = "preloaded"
	// RootfsDocker names an image in a registry: docker:///REPO#TAG (Docker Hub) or
	// docker://REGISTRY/REPO#TAG.
	RootfsDocker = "docker"
)

// Rootfs is a parsed rootfs URI. It is the one parser of rootfs URIs: the BBS stores the
// canonical form (String) at desire, the auctioneer filters cells with it and the rep's
// backends resolve with it, so all of them agree on what a URI names.
type Rootfs struct {
	// Scheme names the provider, lower-cased ("preloaded", "docker", ...).
	Scheme string
	// Name is the preloaded root filesystem's name (Scheme "preloaded" only).
	Name string
	// Host is the registry of a hierarchical provider URI, lower-cased; empty for the
	// provider's default (docker:///library/redis is on Docker Hub).
	Host string
	// Path is the rest of a provider URI: for hierarchical URIs the path without trailing
	// slashes ("/library/redis"), for opaque ones ("scheme:rest") the rest.
	Path string
	// Opaque is true for a provider URI written "scheme:rest" without "//".
	Opaque bool
	// Query is the URI's query, without "?" (rarely used).
	Query string
	// Fragment is the tag or digest of an image ("7" in docker:///library/redis#7).
	Fragment string
}

// ParseRootfs parses and canonicalises a rootfs URI. It accepts "preloaded:NAME",
// "preloaded://NAME" and "preloaded:///NAME/" (any case of the scheme), and provider URIs such
// as "docker:///library/redis#7" and "DOCKER://Registry.example.com/repo/#tag". Its errors
// say what is wrong, without the field name.
func ParseRootfs(s string) (Rootfs, error) {
	if s == "" {
		return Rootfs{}, errors.New("is required")
	}
	if hasSpace(s) {
		return Rootfs{}, errors.New("must not contain whitespace")
	}
	u, err := url.Parse(s)
	if err != nil {
		return Rootfs{}, fmt.Errorf("is not a valid URI: %v", err)
	}
	if u.Scheme == "" {
		return Rootfs{}, errors.New(`must be a URI whose scheme names its provider, e.g. "preloaded:cflinuxfs4" or "docker:///library/redis#7"`)
	}
	r := Rootfs{Scheme: strings.ToLower(u.Scheme)}
	if r.Scheme == RootfsPreloaded {
		if u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(s, "?#") {
			return Rootfs{}, errors.New(`a preloaded rootfs is "preloaded:NAME", without query or fragment`)
		}
		name := strings.Trim(s[len(u.Scheme)+1:], "/")
		if name == "" {
			return Rootfs{}, fmt.Errorf("must name a root filesystem after the scheme %q", r.Scheme+":")
		}
		if strings.Contains(name, "/") {
			return Rootfs{}, fmt.Errorf("preloaded rootfs name %q must not contain '/'", name)
		}
		r.Name = name
		return r, nil
	}
	r.Query, r.Fragment = u.RawQuery, u.Fragment
	if u.Opaque != "" {
		if r.Scheme == RootfsDocker {
			return Rootfs{}, errors.New(`a docker rootfs is "docker:///REPO#TAG" or "docker://REGISTRY/REPO#TAG"`)
		}
		r.Opaque, r.Path = true, u.Opaque
		return r, nil
	}
	if u.User != nil {
		return Rootfs{}, errors.New("must not carry user information")
	}
	r.Host = strings.ToLower(u.Host)
	r.Path = strings.TrimRight(u.EscapedPath(), "/")
	if strings.Trim(r.Path, "/") == "" {
		return Rootfs{}, fmt.Errorf("must name a root filesystem after the scheme %q", r.Scheme+":")
	}
	return r, nil
}

// String is the canonical form: "preloaded:NAME", "scheme://host/path[?query][#fragment]"
// (an empty host gives "scheme:///path") or "scheme:rest" for opaque URIs.
func (r Rootfs) String() string {
	if r.Scheme == RootfsPreloaded {
		return RootfsPreloaded + ":" + r.Name
	}
	var b strings.Builder
	b.WriteString(r.Scheme)
	b.WriteByte(':')
	if r.Opaque {
		b.WriteString(r.Path)
	} else {
		b.WriteString("//")
		b.WriteString(r.Host)
		if !strings.HasPrefix(r.Path, "/") {
			b.WriteByte('/')
		}
		b.WriteString(r.Path)
	}
	if r.Query != "" {
		b.WriteByte('?')
		b.WriteString(r.Query)
	}
	if r.Fragment != "" {
		b.WriteByte('#')
		b.WriteString(r.Fragment)
	}
	return b.String()
}

// Preloaded reports whether r names a preloaded root filesystem.
func (r Rootfs) Preloaded() bool { return r.Scheme == RootfsPreloaded }

// CanonicalRootfs returns the canonical form of a rootfs URI (see ParseRootfs).
func CanonicalRootfs(s string) (string, error) {
	r, err := ParseRootfs(s)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}
