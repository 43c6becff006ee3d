package placement

import (
	"slices"
	"strings"
)

// round is what Select memoizes over one auction round's cells, so that an item costs one
// tight pass over the cells with no map lookups and no allocation:
//
//   - classes: for each class of work (rootfs, required and disallowed tags) and each cell, the
//     reasons the cell fails the compatibility filters (nil when it passes). They depend only on
//     the class and on what a cell's State said this round, which does not change within it, so
//     they run once per class and cell: a round of N items in K classes over C cells runs them
//     K×C times, not N×C.
//   - zones: each cell's zone as a small index, for counting an LRP's instances per zone.
//   - byID: each cell's index by id, built the first time an item with a spread peer asks
//     (items without one never pay for it).
//   - holders: for each process guid, the indices of the cells holding its instances, found by
//     one walk over the cells the first time the guid is asked for. Afterwards only Reserve on
//     a cell that Select returned can add instances (the caller reserves nothing else), so
//     Select records each cell it returns for an LRP. Counts are read live from the holders, so
//     Release is seen too.
//
// The round's cells are told apart by their first element and length; another slice resets
// the memo.
type round struct {
	first *Cell
	n     int

	classes map[classKey][][]Reason
	zoneOf  []int // zone index of each cell
	zones   int
	byID    map[string]int // nil until an item with a spread peer needs it
	holders map[string][]int

	// The current item's LRP: instances per zone, and per cell where mark[i] == seq.
	perZone []int
	same    []int
	mark    []uint32
	seq     uint32
}

// reset makes r the memo of cells, keeping it when cells is the round it already describes.
func (r *round) reset(cells []*Cell) {
	if len(cells) > 0 && r.first == cells[0] && r.n == len(cells) {
		return
	}
	r.first, r.n = nil, len(cells)
	if len(cells) > 0 {
		r.first = cells[0]
	}
	r.classes = map[classKey][][]Reason{}
	r.holders = map[string][]int{}
	r.byID = nil
	zoneIdx := map[string]int{}
	r.zoneOf = make([]int, len(cells))
	for i, c := range cells {
		z, ok := zoneIdx[c.Zone]
		if !ok {
			z = len(zoneIdx)
			zoneIdx[c.Zone] = z
		}
		r.zoneOf[i] = z
	}
	r.zones = len(zoneIdx)
	r.perZone = make([]int, r.zones)
	r.same = make([]int, len(cells))
	r.mark = make([]uint32, len(cells))
	r.seq = 0
}

// classKey names a class of work: its rootfs, required and disallowed tags.
type classKey struct{ rootfs, require, disallow string }

// classOf is w's class (joining no or one tag allocates nothing).
func classOf(w *Work) classKey {
	return classKey{w.Rootfs, strings.Join(w.Require, "\x00"), strings.Join(w.Disallow, "\x00")}
}

// classReasons returns, for each cell of cells (same order), why it fails filters for w's
// class.
func (r *round) classReasons(w *Work, cells []*Cell, filters []Filter) [][]Reason {
	key := classOf(w)
	if rs, ok := r.classes[key]; ok {
		return rs
	}
	rs := make([][]Reason, len(cells))
	for i, c := range cells {
		for _, f := range filters {
			if fr := f.Check(w, c); len(fr) > 0 {
				rs[i] = fr
				break
			}
		}
	}
	r.classes[key] = rs
	return rs
}

// count loads the current item's LRP: its instances per zone over every cell and per holding
// cell, read by inZone and sameOn, and its spread peer's instances added to their zones (not to
// sameOn: the peer counts for the zone spread only). A task holds no instances.
func (r *round) count(w *Work, cells []*Cell) {
	r.seq++
	if r.seq == 0 { // wrapped: no mark may look current
		clear(r.mark)
		r.seq = 1
	}
	clear(r.perZone)
	if w.Kind != KindLRP {
		return
	}
	guid := w.ProcessGuid
	hs, ok := r.holders[guid]
	if !ok {
		for i, c := range cells {
			if c.Instances[guid] > 0 {
				hs = append(hs, i)
			}
		}
		r.holders[guid] = hs
	}
	for _, i := range hs {
		n := cells[i].Instances[guid]
		r.mark[i], r.same[i] = r.seq, n
		r.perZone[r.zoneOf[i]] += n
	}
	if len(w.SpreadPeer) > 0 {
		r.countPeer(w.SpreadPeer, cells)
	}
}

// countPeer adds a spread peer's instances (per cell id) to the zones of their cells.
func (r *round) countPeer(peer map[string]int, cells []*Cell) {
	if r.byID == nil {
		r.byID = make(map[string]int, len(cells))
		for i, c := range cells {
			r.byID[c.ID] = i
		}
	}
	for id, n := range peer {
		if i, ok := r.byID[id]; ok && n > 0 {
			r.perZone[r.zoneOf[i]] += n
		}
	}
}

// inZone is how many instances of the current item's LRP the zone of cell i holds.
func (r *round) inZone(i int) int { return r.perZone[r.zoneOf[i]] }

// sameOn is how many instances of the current item's LRP cell i holds.
func (r *round) sameOn(i int) int {
	if r.mark[i] == r.seq {
		return r.same[i]
	}
	return 0
}

// placed records that Select chose cell i for an instance of guid.
func (r *round) placed(guid string, i int) {
	hs, ok := r.holders[guid]
	if !ok || slices.Contains(hs, i) {
		return // not asked for yet (the first walk will find it), or known
	}
	r.holders[guid] = append(hs, i)
}
