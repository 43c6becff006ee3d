package placement

// reasonEvacuating is the reason of a draining cell.
var reasonEvacuating = Reason{One: "is evacuating", Many: "are evacuating"}

// NotEvacuating passes cells that are not draining; an evacuating cell takes no new work.
type NotEvacuating struct{}

// Passes implements FastFilter.
func (NotEvacuating) Passes(_ *Work, c *Cell) bool { return !c.Evacuating }

// Check implements Filter.
func (NotEvacuating) Check(_ *Work, c *Cell) []Reason {
	if c.Evacuating {
		return []Reason{reasonEvacuating}
	}
	return nil
}
