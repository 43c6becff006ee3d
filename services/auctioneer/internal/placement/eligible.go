package placement

import (
	"strings"
	"sync"
)

// classes memoizes the class filters of one round: for each class of work (rootfs, required
// and disallowed tags) and each cell, the reasons the cell fails them (nil when it passes).
// Class filters depend only on the work's class and on what a cell's State said this round,
// which does not change within the round, so they run once per class and cell instead of once
// per work item and cell: a round of N items in K classes over C cells runs them K×C times,
// not N×C.
type classes struct {
	mu     sync.Mutex
	first  *Cell // the round's cells, told apart by their first element and length
	n      int
	byKind map[string][][]Reason
}

// classKey names w's class.
func classKey(w *Work) string {
	var b strings.Builder
	b.WriteString(w.Rootfs)
	b.WriteByte(0)
	b.WriteString(strings.Join(w.Require, "\x01"))
	b.WriteByte(0)
	b.WriteString(strings.Join(w.Disallow, "\x01"))
	return b.String()
}

// reasons returns, for each cell of cells (same order), why it fails filters for w's class.
func (k *classes) reasons(w *Work, cells []*Cell, filters []Filter) [][]Reason {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(cells) == 0 {
		return nil
	}
	if k.first != cells[0] || k.n != len(cells) {
		k.first, k.n, k.byKind = cells[0], len(cells), map[string][][]Reason{}
	}
	key := classKey(w)
	if rs, ok := k.byKind[key]; ok {
		return rs
	}
	rs := make([][]Reason, len(cells))
	for i, c := range cells {
		rs[i] = firstFailure(w, c, nil, filters)
	}
	k.byKind[key] = rs
	return rs
}
