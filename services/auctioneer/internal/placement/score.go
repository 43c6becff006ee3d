package placement

// Weights of Diego's score.
const (
	// DefaultStartingContainerWeight is added to the score per container starting on the cell,
	// so a burst of starts spreads instead of piling onto one cell.
	DefaultStartingContainerWeight = 0.25
	// DefaultLocalityWeight is added per instance of the same LRP already on the cell, so
	// instances spread across cells before doubling up.
	DefaultLocalityWeight = 1000
)

// DiegoScore is Diego's score (lower wins): the average fraction of memory, disk and containers
// the cell would have in use after taking the work, plus StartingContainerWeight per starting
// container, plus (for LRP instances) LocalityWeight per instance of the same LRP on the cell.
type DiegoScore struct {
	// StartingContainerWeight is added per container starting on the cell.
	StartingContainerWeight float64
	// LocalityWeight is added per instance of the same LRP already on the cell.
	LocalityWeight float64
}

// Score implements Scorer.
func (s DiegoScore) Score(w *Work, c *Cell, same int) float64 {
	used := (fractionUsed(c.Available.MemoryMB-w.MemoryMB, c.Total.MemoryMB) +
		fractionUsed(c.Available.DiskMB-w.DiskMB, c.Total.DiskMB) +
		fractionUsed(c.Available.Containers-1, c.Total.Containers)) / 3
	score := used + s.StartingContainerWeight*float64(c.Starting)
	if w.Kind == KindLRP {
		score += s.LocalityWeight * float64(same)
	}
	return score
}

// fractionUsed is the part of total not left in remaining; a cell without capacity in a
// dimension counts as full in it.
func fractionUsed(remaining, total int) float64 {
	if total <= 0 {
		return 1
	}
	return 1 - float64(remaining)/float64(total)
}
