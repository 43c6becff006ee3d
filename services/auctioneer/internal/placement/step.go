package placement

// Filter is one feasibility step of the pipeline. Check returns nil when cell c may take w, and
// otherwise every reason it may not. Filters must be cheap and must not change c.
type Filter interface {
	Check(w *Work, c *Cell) []Reason
}

// FastFilter is a Filter that Select asks for every item and every cell of a round. Passes
// answers without allocating; Check, which may allocate its reasons, is asked only when no cell
// can take the item, to explain why. Passes(w, c) must equal len(Check(w, c)) == 0.
type FastFilter interface {
	Filter
	Passes(w *Work, c *Cell) bool
}

// Scorer ranks a cell that can take w; the lowest score wins. same is how many instances of
// w's LRP cell c already holds (0 for a task), which Select knows from its round memo.
type Scorer interface {
	Score(w *Work, c *Cell, same int) float64
}

// Spreader ranks the availability zones for w: of the cells that can take w, Select keeps those
// whose zone has the lowest rank and scores them together. inZone is how many instances of w's
// LRP the zone's cells hold (counted over every cell of the round, with the LRP's spread peer's
// instances in the zone; 0 for a task).
type Spreader interface {
	Rank(w *Work, inZone int) int
}

// Reason is why a cell cannot take a piece of work, phrased to follow a count of cells:
// One after "1" ("lacks tag \"staging\""), Many after other counts ("lack tag \"staging\"").
type Reason struct {
	// One is the phrase used for a single cell.
	One string
	// Many is the phrase used for several cells.
	Many string
}

// For is the phrase agreeing with n cells.
func (r Reason) For(n int) string {
	if n == 1 {
		return r.One
	}
	return r.Many
}
