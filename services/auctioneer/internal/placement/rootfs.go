package placement

import (
	"fmt"
	"strings"
)

// PreloadedScheme is the rootfs scheme of root filesystems preloaded on cells.
const PreloadedScheme = "preloaded"

// ParseRootfs splits a rootfs URI into its scheme (lower-cased) and, for preloaded root
// filesystems, the name: "preloaded:cflinuxfs4" and "preloaded://cflinuxfs4" both give
// ("preloaded", "cflinuxfs4"); "docker:///library/redis#7" gives ("docker", "/library/redis").
// A string without a scheme gives ("", s).
func ParseRootfs(s string) (scheme, name string) {
	i := strings.IndexByte(s, ':')
	if i <= 0 {
		return "", s
	}
	scheme, rest := strings.ToLower(s[:i]), s[i+1:]
	rest = strings.TrimPrefix(rest, "//")
	if j := strings.IndexAny(rest, "?#"); j >= 0 {
		rest = rest[:j]
	}
	if scheme == PreloadedScheme {
		rest = strings.Trim(rest, "/")
	}
	return scheme, rest
}

// Rootfs passes cells that can provide the work's root filesystem: a preloaded rootfs by its
// name ("preloaded:NAME" or "preloaded://NAME"), any other by its scheme naming a provider the
// cell supports ("docker:///library/redis#7" needs the "docker" provider).
type Rootfs struct{}

// Check implements Filter.
func (Rootfs) Check(w *Work, c *Cell) []Reason {
	scheme, name := ParseRootfs(w.Rootfs)
	if scheme == PreloadedScheme {
		if c.PreloadedRootfses[name] {
			return nil
		}
		obj := fmt.Sprintf("rootfs %q", w.Rootfs)
		return []Reason{{One: "lacks " + obj, Many: "lack " + obj}}
	}
	if scheme != "" && c.RootfsProviders[scheme] {
		return nil
	}
	obj := fmt.Sprintf("rootfs provider %q", scheme)
	if scheme == "" {
		obj = fmt.Sprintf("rootfs %q", w.Rootfs)
	}
	return []Reason{{One: "lacks " + obj, Many: "lack " + obj}}
}
