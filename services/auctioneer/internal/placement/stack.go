package placement

// Stack is the placement pipeline: compatibility filters, capacity filters, a spreader and a
// scorer, applied to every cell for one item at a time (the style of Nomad's
// feasible/rank/stack).
type Stack struct {
	compatible []Filter
	available  []Filter
	capacity   []Filter
	spread     Spreader
	score      Scorer

	classes classes    // the compatibility filters' outcomes for the current round
	zones   zoneCounts // which cells hold each process guid this round, for the spread
}

// NewStack assembles the placement pipeline. This function is the one place that says which
// steps run and in what order.
func NewStack() *Stack {
	s := &Stack{
		// 1. Compatibility: could the cell ever run this work? Cheapest first; a cell failing
		//    one filter is not asked the next, and its reasons are counted for the
		//    CELL_MISMATCH message ("0/9 cells eligible (5 lack tag ...)"). Only these make
		//    CELL_MISMATCH: it means no cell could ever satisfy the work. They depend only on
		//    the work's class (rootfs, tags) and the cell's State, so they run once per class
		//    and cell per round (classes), not once per item.
		compatible: []Filter{
			Rootfs{},     // has the preloaded rootfs by name, or the provider of its scheme
			Constraint{}, // carries every required tag and no disallowed tag
		},
		// 2. Availability: does the compatible cell take work this round? (The round's
		//    Refused set, when given, is checked first.) A compatible cell failing here makes
		//    CELL_COMMUNICATION (did not answer, refused) or INSUFFICIENT_RESOURCES
		//    (evacuating), with the cells counted per reason.
		available: []Filter{
			Reachable{},     // answered State this round, and no Perform to it has failed
			NotEvacuating{}, // draining cells take no new work
		},
		// 3. Capacity: has the available cell room for it now (this round's earlier
		//    placements included)? Exhausted dimensions feed INSUFFICIENT_RESOURCES.
		capacity: []Filter{
			Resources{}, // memory, disk, one container
		},
		// 4. Spread: of the cells with room, keep those in the availability zones running the
		//    fewest instances of this LRP.
		spread: ZoneSpread{},
		// 5. Score: Diego's — fraction used after placement, starting containers, and
		//    instances of the same LRP already on the cell. Lowest wins; ties go to the
		//    lowest cell id so placement is deterministic.
		score: DiegoScore{
			StartingContainerWeight: DefaultStartingContainerWeight,
			LocalityWeight:          DefaultLocalityWeight,
		},
	}
	s.spread = ZoneSpread{Counts: s.zones.counts}
	return s
}

// Select picks the cell w should go to among cells, skipping the cells in refused (which may be
// nil), or explains why no cell can take it. Calls of one round pass the same cells slice;
// a cell's tags, rootfses and providers must not change within it. It does not reserve anything: the caller calls
// Cell.Reserve on the chosen cell so the next item sees the placement, and reserves nothing on
// any other cell of the round (Release of a chosen cell is allowed).
func (s *Stack) Select(w *Work, cells []*Cell, refused Refused) (*Cell, *Failure) {
	t := tally{total: len(cells)}
	fits := make([]*Cell, 0, len(cells))
	classFails := s.classes.reasons(w, cells, s.compatible)
	for i, c := range cells {
		if rs := classFails[i]; rs != nil {
			t.incompatible(rs)
			continue
		}
		t.compatible++
		if rs := firstFailure(w, c, refused, s.available); rs != nil {
			t.unavailable(rs)
			continue
		}
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
	if w.Kind == KindLRP {
		s.zones.placed(w.ProcessGuid, best, cells)
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
