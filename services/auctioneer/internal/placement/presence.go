package placement

// reasonPresenceLapsed is the reason of a cell whose rep cannot confirm its presence.
var reasonPresenceLapsed = Reason{One: "is losing its presence", Many: "are losing their presence"}

// PresenceHeld passes cells whose rep holds its presence. A rep cut off from etcd still
// answers the auctioneer until its lease expires and the BBS moves its work; work placed there
// meanwhile would have to move again. Such a cell counts as not answering
// (CELL_COMMUNICATION).
type PresenceHeld struct{}

// Passes implements FastFilter.
func (PresenceHeld) Passes(_ *Work, c *Cell) bool { return !c.PresenceLapsed }

// Check implements Filter.
func (PresenceHeld) Check(_ *Work, c *Cell) []Reason {
	if c.PresenceLapsed {
		return []Reason{reasonPresenceLapsed}
	}
	return nil
}
