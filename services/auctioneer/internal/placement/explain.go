package placement

import (
	"fmt"
	"slices"
	"strings"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Message prefixes of placement failures.
const (
	// MsgNoCompatibleCell starts CELL_MISMATCH messages.
	MsgNoCompatibleCell = "found no compatible cell"
	// MsgInsufficientResources starts INSUFFICIENT_RESOURCES messages.
	MsgInsufficientResources = "insufficient resources"
	// MsgUnreachable starts CELL_COMMUNICATION messages: the compatible cells did not answer
	// or refused the work.
	MsgUnreachable = "could not reach any compatible cell"
)

// tally counts, while one item is matched against every cell, how many cells failed for each
// reason, so a failure can explain itself.
type tally struct {
	total      int
	compatible int
	// mismatch counts cells per reason they are incompatible, in first-seen order.
	mismatch []reasonCount
	// unavail counts compatible cells per reason they take no work this round.
	unavail []reasonCount
	// communication counts the compatible cells that did not answer or refused the work.
	communication int
	// noRoom counts the available compatible cells without room.
	noRoom int
	// lacking is the set of exhausted dimensions among compatible cells.
	lacking map[string]bool
}

type reasonCount struct {
	reason Reason
	n      int
}

func (t *tally) incompatible(rs []Reason) { t.mismatch = countReasons(t.mismatch, rs) }

func (t *tally) unavailable(rs []Reason) {
	t.unavail = countReasons(t.unavail, rs)
	if rs[0] != reasonEvacuating {
		t.communication++
	}
}

func countReasons(counts []reasonCount, rs []Reason) []reasonCount {
	for _, r := range rs {
		i := slices.IndexFunc(counts, func(rc reasonCount) bool { return rc.reason == r })
		if i < 0 {
			counts = append(counts, reasonCount{reason: r})
			i = len(counts) - 1
		}
		counts[i].n++
	}
	return counts
}

// list is "5 lack tag "staging", 4 ..." with the most frequent reason first.
func list(counts []reasonCount) string {
	slices.SortStableFunc(counts, func(a, b reasonCount) int { return b.n - a.n })
	parts := make([]string, len(counts))
	for i, rc := range counts {
		parts[i] = fmt.Sprintf("%d %s", rc.n, rc.reason.For(rc.n))
	}
	return strings.Join(parts, ", ")
}

func (t *tally) full(rs []Reason) {
	t.noRoom++
	if t.lacking == nil {
		t.lacking = map[string]bool{}
	}
	for _, r := range rs {
		t.lacking[r.Many] = true
	}
}

// failure explains why no cell was chosen. CELL_MISMATCH only when no cell could ever run the
// work; otherwise the compatible cells are counted per reason they did not take it:
//   - no cells at all, or none compatible: CELL_MISMATCH, "found no compatible cell: 0/9 cells
//     eligible (5 lack tag "staging", 4 lack rootfs "preloaded:lucid64")", reasons by count;
//   - compatible cells, none with room: INSUFFICIENT_RESOURCES, "insufficient resources:
//     memory, disk (4 compatible cells)", and when some of them take no work this round
//     "insufficient resources: memory (4 compatible cells: 2 without room, 1 is evacuating,
//     1 did not answer)";
//   - compatible cells that all are evacuating: INSUFFICIENT_RESOURCES, "insufficient
//     resources: no compatible cell takes work (3 compatible cells: 3 are evacuating)";
//   - compatible cells, none with room and some unreachable or refusing: CELL_COMMUNICATION,
//     "could not reach any compatible cell: 0/3 compatible cells available (2 did not
//     answer, 1 is evacuating)".
func (t *tally) failure() *Failure {
	if t.total == 0 {
		return &Failure{Code: modelsv1.PlacementError_CODE_CELL_MISMATCH, Message: MsgNoCompatibleCell + ": no cells are registered"}
	}
	if t.compatible == 0 {
		return &Failure{Code: modelsv1.PlacementError_CODE_CELL_MISMATCH,
			Message: fmt.Sprintf("%s: 0/%d %s eligible (%s)", MsgNoCompatibleCell, t.total, plural(t.total, "cell", "cells"), list(t.mismatch))}
	}
	compatible := fmt.Sprintf("%d compatible %s", t.compatible, plural(t.compatible, "cell", "cells"))
	if t.noRoom == 0 && t.communication > 0 {
		return &Failure{Code: modelsv1.PlacementError_CODE_CELL_COMMUNICATION,
			Message: fmt.Sprintf("%s: 0/%s available (%s)", MsgUnreachable, compatible, list(t.unavail))}
	}
	var dims []string
	for _, d := range []string{DimMemory, DimDisk, DimContainers} {
		if t.lacking[d] {
			dims = append(dims, d)
		}
	}
	what := strings.Join(dims, ", ")
	if t.noRoom == 0 {
		what = "no compatible cell takes work"
	}
	detail := compatible
	if len(t.unavail) > 0 {
		counts := append([]reasonCount{{reason: reasonNoRoom, n: t.noRoom}}, t.unavail...)
		if t.noRoom == 0 {
			counts = t.unavail
		}
		detail += ": " + list(counts)
	}
	return &Failure{Code: modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES,
		Message: fmt.Sprintf("%s: %s (%s)", MsgInsufficientResources, what, detail)}
}

// reasonNoRoom counts the available compatible cells without room, beside unavailable ones.
var reasonNoRoom = Reason{One: "without room", Many: "without room"}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
