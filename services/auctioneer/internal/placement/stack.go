package placement

// Stack is the placement pipeline: compatibility filters, capacity filters, a spreader and a
// scorer, applied to every cell for one item at a time (the style of Nomad's
// feasible/rank/stack).
type Stack struct {
	compatible []Filter
	capacity   []Filter
	spread     Spreader
	score      Scorer
}

// NewStack assembles the placement pipeline. This function is the one place that says which
// steps run and in what order.
func NewStack() *Stack {
	return &Stack{
		// 1. Compatibility: may the cell run this work at all? Cheapest first; a cell failing
		//    one filter is not asked the next, and its reasons are counted for the
		//    CELL_MISMATCH message ("0/9 cells eligible (5 lack tag ...)").
		compatible: []Filter{
			Reachable{},     // answered State this round, and no Perform to it has failed
			NotEvacuating{}, // draining cells take no new work
			Rootfs{},        // has the preloaded rootfs by name, or the provider of its scheme
			Constraint{},    // carries every required tag and no disallowed tag
		},
		// 2. Capacity: has the compatible cell room for it now (this round's earlier
		//    placements included)? Exhausted dimensions feed INSUFFICIENT_RESOURCES.
		capacity: []Filter{
			Resources{}, // memory, disk, one container
		},
		// 3. Spread: of the cells with room, keep those in the availability zones running the
		//    fewest instances of this LRP.
		spread: ZoneSpread{},
		// 4. Score: Diego's — fraction used after placement, starting containers, and
		//    instances of the same LRP already on the cell. Lowest wins; ties go to the
		//    lowest cell id so placement is deterministic.
		score: DiegoScore{
			StartingContainerWeight: DefaultStartingContainerWeight,
			LocalityWeight:          DefaultLocalityWeight,
		},
	}
}

// Select picks the cell w should go to among cells, skipping the cells in refused (which may be
// nil), or explains why no cell can take it. It does not reserve anything: the caller calls
// Cell.Reserve on the chosen cell so the next item sees the placement.
func (s *Stack) Select(w *Work, cells []*Cell, refused Refused) (*Cell, *Failure) {
	t := tally{total: len(cells)}
	fits := make([]*Cell, 0, len(cells))
	for _, c := range cells {
		if c.Unreachable {
			t.unreachable++
		}
		if rs := firstFailure(w, c, refused, s.compatible); rs != nil {
			t.incompatible(rs)
			continue
		}
		t.compatible++
		if rs := firstFailure(w, c, nil, s.capacity); rs != nil {
			t.full(rs)
			continue
		}
		fits = append(fits, c)
	}
	if len(fits) == 0 {
		return nil, t.failure()
	}
	var best *Cell
	var bestScore float64
	for _, c := range s.spread.Narrow(w, fits, cells) {
		sc := s.score.Score(w, c)
		if best == nil || sc < bestScore || (sc == bestScore && c.ID < best.ID) {
			best, bestScore = c, sc
		}
	}
	return best, nil
}

// firstFailure runs the refused check (when given) and then filters in order, returning the
// reasons of the first that fails, or nil when all pass.
func firstFailure(w *Work, c *Cell, refused Refused, filters []Filter) []Reason {
	if refused != nil {
		if rs := refused.Check(w, c); rs != nil {
			return rs
		}
	}
	for _, f := range filters {
		if rs := f.Check(w, c); len(rs) > 0 {
			return rs
		}
	}
	return nil
}
