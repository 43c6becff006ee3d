package placement

// Filter is one feasibility step of the pipeline. Check returns nil when cell c may take w, and
// otherwise every reason it may not. Filters must be cheap and must not change c.
type Filter interface {
	Check(w *Work, c *Cell) []Reason
}

// Scorer ranks a cell that can take w; the lowest score wins.
type Scorer interface {
	Score(w *Work, c *Cell) float64
}

// Spreader narrows the cells that can take w to those it should be tried on first. all is
// every cell of the round, for counting what already runs where.
type Spreader interface {
	Narrow(w *Work, candidates, all []*Cell) []*Cell
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
