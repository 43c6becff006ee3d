package placement

import "sync"

// Stack is the placement pipeline: compatibility filters, availability and capacity filters,
// a spreader and a scorer, applied to every cell for one item at a time (the style of Nomad's
// feasible/rank/stack). Select is safe for concurrent use but serializes: one round places its
// items one after another, each seeing the last one's reservation.
type Stack struct {
	compatible []Filter
	available  []FastFilter
	capacity   []FastFilter
	spread     Spreader
	score      Scorer

	mu    sync.Mutex
	round round // the current round's memo: class outcomes, zones, the cells holding each LRP
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
		available: []FastFilter{
			Reachable{},     // answered State this round, and no Perform to it has failed
			PresenceHeld{},  // its rep holds its presence: it is not about to disappear
			NotEvacuating{}, // draining cells take no new work
		},
		// 3. Capacity: has the available cell room for it now (this round's earlier
		//    placements included)? Exhausted dimensions feed INSUFFICIENT_RESOURCES.
		capacity: []FastFilter{
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
	return s
}

// Select picks the cell w should go to among cells, skipping the cells in refused (which may be
// nil), or explains why no cell can take it. Calls of one round pass the same cells slice;
// a cell's zone, tags, rootfses and providers must not change within it. It does not reserve
// anything: the caller calls Cell.Reserve on the chosen cell so the next item sees the
// placement, and reserves nothing on any other cell of the round (Release of a chosen cell is
// allowed).
//
// One pass over the cells finds, among those passing every filter, the lowest zone rank, then
// the lowest score, then the lowest cell id; it allocates nothing. Only when no cell can take w
// does a second pass ask the filters for their reasons, to explain the failure.
func (s *Stack) Select(w *Work, cells []*Cell, refused Refused) (*Cell, *Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &s.round
	r.reset(cells)
	classFails := r.classReasons(w, cells, s.compatible)
	r.count(w, cells)
	best, bestRank, bestScore := -1, 0, 0.0
	for i, c := range cells {
		if classFails[i] != nil || (refused != nil && !refused.Passes(w, c)) ||
			!passesAll(s.available, w, c) || !passesAll(s.capacity, w, c) {
			continue
		}
		rank := s.spread.Rank(w, r.inZone(i))
		if best >= 0 && rank > bestRank {
			continue
		}
		sc := s.score.Score(w, c, r.sameOn(i))
		if best < 0 || rank < bestRank || sc < bestScore || (sc == bestScore && c.ID < cells[best].ID) {
			best, bestRank, bestScore = i, rank, sc
		}
	}
	if best < 0 {
		return nil, s.explain(w, cells, classFails, refused)
	}
	if w.Kind == KindLRP {
		r.placed(w.ProcessGuid, best)
	}
	return cells[best], nil
}

// passesAll reports whether every filter passes c for w.
func passesAll(filters []FastFilter, w *Work, c *Cell) bool {
	for _, f := range filters {
		if !f.Passes(w, c) {
			return false
		}
	}
	return true
}

// explain counts, for work no cell can take, every cell under the reasons it cannot.
func (s *Stack) explain(w *Work, cells []*Cell, classFails [][]Reason, refused Refused) *Failure {
	t := tally{total: len(cells)}
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
		}
	}
	return t.failure()
}

// firstFailure runs the refused check (when given) and then filters in order, returning the
// reasons of the first that fails, or nil when all pass.
func firstFailure(w *Work, c *Cell, refused Refused, filters []FastFilter) []Reason {
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
