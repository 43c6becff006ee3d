package placement

// ZoneSpread spreads an LRP's instances across availability zones: of the cells that can take
// an instance, Select keeps those in the zones running the fewest instances of that LRP (counted
// over every cell of the round, including cells that cannot take it), so the score only chooses
// within the least-loaded zones. Zones with the same count are tried together, as Diego does.
// Tasks are not spread. An LRP with a spread peer (Work.SpreadPeer) counts the peer's listed
// instances in their zones too, so that during a deployment the app's instances across both
// versions stay spread.
type ZoneSpread struct{}

// Rank implements Spreader: an LRP's zone ranks by its instances of that LRP; every zone ranks
// alike for a task.
func (ZoneSpread) Rank(w *Work, inZone int) int {
	if w.Kind != KindLRP {
		return 0
	}
	return inZone
}
