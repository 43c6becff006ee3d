package placement

import (
	"slices"
	"sync"
)

// ZoneSpread spreads an LRP's instances across availability zones: of the cells that can take
// an instance, it keeps those in the zones running the fewest instances of that LRP (counted
// over every cell of the round), so the score only chooses within the least-loaded zones.
// Zones with the same count are tried together, as Diego does. Tasks are not spread.
type ZoneSpread struct {
	// Counts, when set, gives the instances of a process guid per zone over all; nil counts
	// them over every cell (the Stack sets its round memo, zoneCounts).
	Counts func(guid string, all []*Cell) map[string]int
}

// Narrow implements Spreader.
func (z ZoneSpread) Narrow(w *Work, candidates, all []*Cell) []*Cell {
	if w.Kind != KindLRP || len(candidates) < 2 {
		return candidates
	}
	var perZone map[string]int
	if z.Counts != nil {
		perZone = z.Counts(w.ProcessGuid, all)
	} else {
		perZone = countPerZone(w.ProcessGuid, all)
	}
	fewest := -1
	for _, c := range candidates {
		if n := perZone[c.Zone]; fewest < 0 || n < fewest {
			fewest = n
		}
	}
	out := make([]*Cell, 0, len(candidates))
	for _, c := range candidates {
		if perZone[c.Zone] == fewest {
			out = append(out, c)
		}
	}
	return out
}

// countPerZone counts the instances of guid per zone over cells.
func countPerZone(guid string, cells []*Cell) map[string]int {
	perZone := map[string]int{}
	for _, c := range cells {
		if n := c.Instances[guid]; n > 0 {
			perZone[c.Zone] += n
		}
	}
	return perZone
}

// zoneCounts memoizes, for one round, which cells hold instances of each process guid, so that
// counting a guid's instances per zone visits those few cells instead of every cell for every
// item. The holders of a guid are found by one walk over the round's cells the first time it is
// asked for; afterwards only Reserve on a cell that Select returned can add instances (the
// caller reserves nothing else), so Select records each cell it returns for an LRP. Counts are
// read live from the holders, so Release is seen too.
type zoneCounts struct {
	mu      sync.Mutex
	first   *Cell // the round's cells, told apart by their first element and length
	n       int
	holders map[string][]*Cell
}

// counts returns the instances of guid per zone over all.
func (z *zoneCounts) counts(guid string, all []*Cell) map[string]int {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.round(all)
	hs, ok := z.holders[guid]
	if !ok {
		for _, c := range all {
			if c.Instances[guid] > 0 {
				hs = append(hs, c)
			}
		}
		z.holders[guid] = hs
	}
	return countPerZone(guid, hs)
}

// placed records that Select chose c for an instance of guid among all.
func (z *zoneCounts) placed(guid string, c *Cell, all []*Cell) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.round(all)
	hs, ok := z.holders[guid]
	if !ok || slices.Contains(hs, c) {
		return // not asked for yet: the first walk will find it
	}
	z.holders[guid] = append(hs, c)
}

// round resets the memo when all is another round's cells.
func (z *zoneCounts) round(all []*Cell) {
	if len(all) == 0 || z.first != all[0] || z.n != len(all) {
		z.holders = map[string][]*Cell{}
		if len(all) > 0 {
			z.first, z.n = all[0], len(all)
		}
	}
}
