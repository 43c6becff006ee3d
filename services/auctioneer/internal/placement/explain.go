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
	// MsgUnreachable starts CELL_COMMUNICATION messages when no cell answered.
	MsgUnreachable = "could not reach any cell"
)

// tally counts, while one item is matched against every cell, how many cells failed for each
// reason, so a failure can explain itself.
type tally struct {
	total       int
	unreachable int
	compatible  int
	// mismatch counts cells per reason they are incompatible, in first-seen order.
	mismatch []reasonCount
	// lacking is the set of exhausted dimensions among compatible cells.
	lacking map[string]bool
}

type reasonCount struct {
	reason Reason
	n      int
}

func (t *tally) incompatible(rs []Reason) {
	for _, r := range rs {
		i := slices.IndexFunc(t.mismatch, func(rc reasonCount) bool { return rc.reason == r })
		if i < 0 {
			t.mismatch = append(t.mismatch, reasonCount{reason: r})
			i = len(t.mismatch) - 1
		}
		t.mismatch[i].n++
	}
}

func (t *tally) full(rs []Reason) {
	if t.lacking == nil {
		t.lacking = map[string]bool{}
	}
	for _, r := range rs {
		t.lacking[r.Many] = true
	}
}

// failure explains why no cell was chosen:
//   - no cells at all, or none compatible: CELL_MISMATCH, "found no compatible cell: 0/9 cells
//     eligible (5 lack tag "staging", 4 lack rootfs "preloaded:lucid64")", reasons by count;
//   - every cell unreachable: CELL_COMMUNICATION, "could not reach any cell: 0/3 cells eligible
//     (3 did not answer)";
//   - compatible cells but none with room: INSUFFICIENT_RESOURCES, "insufficient resources:
//     memory, disk (4 compatible cells)".
func (t *tally) failure() *Failure {
	if t.total == 0 {
		return &Failure{Code: modelsv1.PlacementError_CODE_CELL_MISMATCH, Message: MsgNoCompatibleCell + ": no cells are registered"}
	}
	if t.compatible == 0 {
		slices.SortStableFunc(t.mismatch, func(a, b reasonCount) int { return b.n - a.n })
		parts := make([]string, len(t.mismatch))
		for i, rc := range t.mismatch {
			parts[i] = fmt.Sprintf("%d %s", rc.n, rc.reason.For(rc.n))
		}
		code, prefix := modelsv1.PlacementError_CODE_CELL_MISMATCH, MsgNoCompatibleCell
		if t.unreachable == t.total {
			code, prefix = modelsv1.PlacementError_CODE_CELL_COMMUNICATION, MsgUnreachable
		}
		return &Failure{Code: code, Message: fmt.Sprintf("%s: 0/%d %s eligible (%s)", prefix, t.total, plural(t.total, "cell", "cells"), strings.Join(parts, ", "))}
	}
	var dims []string
	for _, d := range []string{DimMemory, DimDisk, DimContainers} {
		if t.lacking[d] {
			dims = append(dims, d)
		}
	}
	return &Failure{
		Code:    modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES,
		Message: fmt.Sprintf("%s: %s (%d compatible %s)", MsgInsufficientResources, strings.Join(dims, ", "), t.compatible, plural(t.compatible, "cell", "cells")),
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
