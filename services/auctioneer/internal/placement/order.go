package placement

import (
	"cmp"
	"slices"
)

// Order sorts work into placement order, as Diego does: index 0 LRP instances first (every LRP
// gets one instance before any gets more), then tasks, then the remaining instances; within
// each group larger memory first (big items are hardest to fit), then by key for a stable
// order.
func Order(work []*Work) {
	slices.SortStableFunc(work, func(a, b *Work) int {
		if c := cmp.Compare(rank(a), rank(b)); c != 0 {
			return c
		}
		if c := cmp.Compare(b.MemoryMB, a.MemoryMB); c != 0 {
			return c
		}
		if a.Kind == KindLRP && b.Kind == KindLRP {
			if c := cmp.Compare(a.ProcessGuid, b.ProcessGuid); c != 0 {
				return c
			}
			return cmp.Compare(a.Index, b.Index)
		}
		return cmp.Compare(a.Key(), b.Key())
	})
}

// rank is the placement group of w: 0 for index 0 instances, 1 for tasks, 2 for the rest.
func rank(w *Work) int {
	switch {
	case w.Kind == KindTask:
		return 1
	case w.Index == 0:
		return 0
	default:
		return 2
	}
}
