package placement

// Refused passes cells other than those that already refused the work in this round (their
// Perform failed or returned it), so a retry goes to the next best cell.
type Refused map[string]bool

// Passes implements FastFilter.
func (r Refused) Passes(_ *Work, c *Cell) bool { return !r[c.ID] }

// Check implements Filter.
func (r Refused) Check(_ *Work, c *Cell) []Reason {
	if r[c.ID] {
		return []Reason{{One: "already refused it", Many: "already refused it"}}
	}
	return nil
}
