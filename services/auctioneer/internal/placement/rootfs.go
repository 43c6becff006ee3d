package placement

import (
	"fmt"

	"github.com/gavel-sched/gavel/pkg/models"
)

// Rootfs passes cells that can provide the work's root filesystem: a preloaded rootfs by its
// name ("preloaded:NAME", "preloaded://NAME", any spelling models.ParseRootfs canonicalises),
// any other by its scheme naming a provider the cell supports ("docker:///library/redis#7"
// needs the "docker" provider).
type Rootfs struct{}

// Check implements Filter.
func (Rootfs) Check(w *Work, c *Cell) []Reason {
	r, err := models.ParseRootfs(w.Rootfs)
	if err != nil {
		obj := fmt.Sprintf("rootfs %q", w.Rootfs)
		return []Reason{{One: "lacks " + obj, Many: "lack " + obj}}
	}
	if r.Preloaded() {
		if c.PreloadedRootfses[r.Name] {
			return nil
		}
		obj := fmt.Sprintf("rootfs %q", r.String())
		return []Reason{{One: "lacks " + obj, Many: "lack " + obj}}
	}
	if c.RootfsProviders[r.Scheme] {
		return nil
	}
	obj := fmt.Sprintf("rootfs provider %q", r.Scheme)
	return []Reason{{One: "lacks " + obj, Many: "lack " + obj}}
}
