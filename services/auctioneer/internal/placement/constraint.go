package placement

import "fmt"

// Constraint passes cells that satisfy the work's placement constraint: they carry every
// required tag and no disallowed tag, compared case-insensitively. A cell failing it gets one
// reason per missing tag and per disallowed tag it carries.
type Constraint struct{}

// Check implements Filter.
func (Constraint) Check(w *Work, c *Cell) []Reason {
	var out []Reason
	seen := map[string]bool{}
	for _, t := range w.Require {
		t = normTag(t)
		if t == "" || c.Tags[t] || seen["+"+t] {
			continue
		}
		seen["+"+t] = true
		obj := fmt.Sprintf("tag %q", t)
		out = append(out, Reason{One: "lacks " + obj, Many: "lack " + obj})
	}
	for _, t := range w.Disallow {
		t = normTag(t)
		if t == "" || !c.Tags[t] || seen["-"+t] {
			continue
		}
		seen["-"+t] = true
		obj := fmt.Sprintf("disallowed tag %q", t)
		out = append(out, Reason{One: "carries " + obj, Many: "carry " + obj})
	}
	return out
}
