package placement

// ZoneSpread spreads an LRP's instances across availability zones: of the cells that can take
// an instance, it keeps those in the zones running the fewest instances of that LRP (counted
// over every cell of the round), so the score only chooses within the least-loaded zones.
// Zones with the same count are tried together, as Diego does. Tasks are not spread.
type ZoneSpread struct{}

// Narrow implements Spreader.
func (ZoneSpread) Narrow(w *Work, candidates, all []*Cell) []*Cell {
	if w.Kind != KindLRP || len(candidates) < 2 {
		return candidates
	}
	perZone := map[string]int{}
	for _, c := range all {
		perZone[c.Zone] += c.Instances[w.ProcessGuid]
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
