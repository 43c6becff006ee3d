package placement

// reasonUnreachable is the reason of a cell that did not answer this round.
var reasonUnreachable = Reason{One: "did not answer", Many: "did not answer"}

// Reachable passes cells that answered this round: their State arrived and no Perform to them
// has failed.
type Reachable struct{}

// Passes implements FastFilter.
func (Reachable) Passes(_ *Work, c *Cell) bool { return !c.Unreachable }

// Check implements Filter.
func (Reachable) Check(_ *Work, c *Cell) []Reason {
	if c.Unreachable {
		return []Reason{reasonUnreachable}
	}
	return nil
}
