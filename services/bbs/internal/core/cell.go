package core

import (
	"sort"
	"strings"
)

// Cells answers questions about the registered cells. Cell presences are written by the reps
// under their own leases (see store.CellKey); the BBS only reads them.
type Cells struct{ *deps }

// Tags lists the distinct placement tags of registered cells, lower-cased and sorted.
func (c *Cells) Tags() []string {
	cells, _ := c.st.Cells()
	seen := map[string]struct{}{}
	for _, cell := range cells {
		for _, tag := range cell.GetPlacementTags() {
			seen[strings.ToLower(tag)] = struct{}{}
		}
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}
