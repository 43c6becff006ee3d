package store

import (
	"cmp"
	"slices"
	"sort"

	"google.golang.org/protobuf/types/known/wrapperspb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/labels"
	"github.com/gavel-sched/gavel/pkg/models"
)

// ListFilter selects records in list reads; zero fields match everything.
type ListFilter struct {
	// Domain keeps records of this domain.
	Domain string
	// Guids keeps records with these process (or task) guids.
	Guids map[string]struct{}
	// CellID keeps instances and tasks on this cell.
	CellID string
	// Selector keeps records whose labels match (instances: their desired LRP's labels).
	Selector labels.Selector
	// Index, when set, keeps instances with this index.
	Index *int32
}

// candidates returns, in order, the keys of m the guid filter admits: every key, or only the
// named guids present in m (without scanning m).
func candidates[V any](f *ListFilter, m map[string]V) []string {
	if f.Guids == nil {
		return sortedKeys(m)
	}
	out := make([]string, 0, len(f.Guids))
	for g := range f.Guids {
		if _, ok := m[g]; ok {
			out = append(out, g)
		}
	}
	sort.Strings(out)
	return out
}

func (f *ListFilter) selects(m map[string]string) bool {
	return f.Selector.Empty() || f.Selector.Matches(m)
}

// DesiredLRPs lists desired LRPs ordered by guid, with the revision read.
func (s *Store) DesiredLRPs(f ListFilter) ([]*modelsv1.DesiredLRP, int64) {
	return readAt(s, func(st *state) (out []*modelsv1.DesiredLRP) {
		for _, g := range candidates(&f, st.sched) {
			sched := st.sched[g].msg.(*modelsv1.DesiredLRPSchedulingInfo)
			if (f.Domain != "" && sched.GetDomain() != f.Domain) || !f.selects(sched.GetLabels()) {
				continue
			}
			run, _ := st.run[g].msg.(*modelsv1.DesiredLRPRunInfo)
			out = append(out, models.JoinDesiredLRP(sched, run))
		}
		return out
	})
}

// SchedulingInfos lists desired LRP scheduling infos ordered by guid, with the revision read.
func (s *Store) SchedulingInfos(f ListFilter) ([]*modelsv1.DesiredLRPSchedulingInfo, int64) {
	return readAt(s, func(st *state) (out []*modelsv1.DesiredLRPSchedulingInfo) {
		for _, g := range candidates(&f, st.sched) {
			sched := st.sched[g].msg.(*modelsv1.DesiredLRPSchedulingInfo)
			if (f.Domain != "" && sched.GetDomain() != f.Domain) || !f.selects(sched.GetLabels()) {
				continue
			}
			out = append(out, sched)
		}
		return out
	})
}

// DesiredLRP returns one desired LRP (nil when absent), with the revision read.
func (s *Store) DesiredLRP(guid string) (*modelsv1.DesiredLRP, int64) {
	return readAt(s, func(st *state) (out *modelsv1.DesiredLRP) {
		if it, ok := st.sched[guid]; ok {
			run, _ := st.run[guid].msg.(*modelsv1.DesiredLRPRunInfo)
			out = models.JoinDesiredLRP(it.msg.(*modelsv1.DesiredLRPSchedulingInfo), run)
		}
		return out
	})
}

// LostCells is what cells without presence hold, as OnLostCells reads it.
type LostCells struct {
	// Cells are the ids of the cells read.
	Cells []string
	// Actual are their instance records, ordered by guid, index and presence.
	Actual []*modelsv1.ActualLRP
	// Tasks are their tasks.
	Tasks []*modelsv1.Task
}

// OnLostCells reads, in one view of the cache, the cells that hold instance records or tasks
// but have no presence, leaving out those skip reports true, with what they hold, and the
// revision read. It reads the cache's index of records by cell: the cells' ids and the lost
// cells' records, not every record, under the cache's read lock (which holds off the watch's
// writes), for convergence's cell-loss passes. skip is called under that lock and must not
// read the store.
func (s *Store) OnLostCells(skip func(cellID string) bool) (LostCells, int64) {
	lost, rev := readAt(s, func(st *state) (out LostCells) {
		// judged holds the cells without a presence: lost unless skipped. out.Cells gets each
		// lost cell once. A present cell is answered by its presence alone, so a pass reads
		// thousands of live cells without recording them.
		judged := map[string]bool{}
		lost := func(cell string) bool {
			if _, present := st.cells[cell]; present || cell == "" {
				return false
			}
			l, ok := judged[cell]
			if !ok {
				l = !skip(cell)
				judged[cell] = l
				if l {
					out.Cells = append(out.Cells, cell)
				}
			}
			return l
		}
		for cell, refs := range st.onCell {
			if lost(cell) {
				for ref := range refs {
					out.Actual = append(out.Actual, st.actual[ref.guid][ref.slot].msg.(*modelsv1.ActualLRP))
				}
			}
		}
		for cell, guids := range st.tasksOn {
			if lost(cell) {
				for g := range guids {
					out.Tasks = append(out.Tasks, st.tasks[g].msg.(*modelsv1.Task))
				}
			}
		}
		return out
	})
	// Ordered after the lock is released: the watch's writes, and every change's reads
	// queued behind them, wait for the lock, and at 5,000 cells a 10% loss's passes sorted
	// 25,000 records under it.
	slices.Sort(lost.Cells)
	slices.SortFunc(lost.Tasks, func(a, b *modelsv1.Task) int { return cmp.Compare(a.GetTaskGuid(), b.GetTaskGuid()) })
	slices.SortFunc(lost.Actual, func(a, b *modelsv1.ActualLRP) int {
		ka, kb := a.GetKey(), b.GetKey()
		return cmp.Or(cmp.Compare(ka.GetProcessGuid(), kb.GetProcessGuid()), cmp.Compare(ka.GetIndex(), kb.GetIndex()),
			cmp.Compare(a.GetPresence(), b.GetPresence()))
	})
	return lost, rev
}

// ActualLRPs lists instance records ordered by guid, index and presence, with the revision read.
func (s *Store) ActualLRPs(f ListFilter) ([]*modelsv1.ActualLRP, int64) {
	return readAt(s, func(st *state) (out []*modelsv1.ActualLRP) {
		if n := allActual(st, &f); n > 0 {
			out = make([]*modelsv1.ActualLRP, 0, n)
		}
		eachActual(st, &f, func(it item) { out = append(out, it.msg.(*modelsv1.ActualLRP)) })
		return out
	})
}

// ActualLRPsEncoded is ActualLRPs with each record as it is stored and sent: its protobuf
// encoding, kept by the cache, so that a list is answered without marshalling every record
// again (docs/decisions/0053-actual-list-encoded-once.md). The slices are shared and must not
// be modified.
func (s *Store) ActualLRPsEncoded(f ListFilter) ([][]byte, int64) {
	return readAt(s, func(st *state) (out [][]byte) {
		if n := allActual(st, &f); n > 0 {
			out = make([][]byte, 0, n)
		}
		eachActual(st, &f, func(it item) { out = append(out, it.raw) })
		return out
	})
}

// allActual is the number of instance records when f selects them all, else 0 (a list's
// capacity); st is read-locked.
func allActual(st *state, f *ListFilter) int {
	if f.Guids != nil || f.CellID != "" || f.Domain != "" || !f.Selector.Empty() || f.Index != nil {
		return 0
	}
	n := 0
	for _, m := range st.actual {
		n += len(m)
	}
	return n
}

// eachActual calls fn with every instance record f selects, ordered by guid, index and
// presence; st is read-locked. A filter naming a cell reads that cell's records from the
// onCell index (eachActualOnCell) instead of walking every record.
func eachActual(st *state, f *ListFilter, fn func(it item)) {
	if f.CellID != "" {
		eachActualOnCell(st, f, fn)
		return
	}
	for _, g := range candidates(f, st.actual) {
		if !f.selectsLRP(st, g) {
			continue
		}
		m := st.actual[g]
		for _, sl := range sortedSlots(m) {
			if it := m[sl]; f.keepsInstance(sl, it) {
				fn(it)
			}
		}
	}
}

// eachActualOnCell is eachActual for a filter naming a cell: it reads only the records the
// onCell index holds for f.CellID (a cell's reconcile asks every bulk interval, so at 5,000
// cells the walk of every record ran hundreds of times a second).
func eachActualOnCell(st *state, f *ListFilter, fn func(it item)) {
	refs := make([]actualRef, 0, len(st.onCell[f.CellID]))
	for ref := range st.onCell[f.CellID] {
		if _, named := f.Guids[ref.guid]; f.Guids == nil || named {
			refs = append(refs, ref)
		}
	}
	slices.SortFunc(refs, func(a, b actualRef) int { return cmp.Or(cmp.Compare(a.guid, b.guid), compareSlots(a.slot, b.slot)) })
	for _, ref := range refs {
		if it := st.actual[ref.guid][ref.slot]; f.selectsLRP(st, ref.guid) && f.keepsInstance(ref.slot, it) {
			fn(it)
		}
	}
}

// selectsLRP reports whether f's label selector keeps the instances of guid, matched against
// its desired LRP's labels; st is read-locked.
func (f *ListFilter) selectsLRP(st *state, guid string) bool {
	if f.Selector.Empty() {
		return true
	}
	sched, ok := st.sched[guid]
	return ok && f.selects(sched.msg.(*modelsv1.DesiredLRPSchedulingInfo).GetLabels())
}

// keepsInstance reports whether f's domain and index keep the instance record it in slot sl
// (its guid, cell and labels are judged apart).
func (f *ListFilter) keepsInstance(sl slot, it item) bool {
	return (f.Domain == "" || it.msg.(*modelsv1.ActualLRP).GetKey().GetDomain() == f.Domain) &&
		(f.Index == nil || sl.index == *f.Index)
}

// Tasks lists tasks ordered by guid, with the revision read. A filter naming a cell reads
// that cell's tasks from the index by cell instead of walking every task.
func (s *Store) Tasks(f ListFilter) ([]*modelsv1.Task, int64) {
	return readAt(s, func(st *state) []*modelsv1.Task { return tasksOf(st, &f) })
}

// tasksOf is the tasks f selects, ordered by guid; st is read-locked. A cell's tasks are
// those its entry in the index by cell holds.
func tasksOf(st *state, f *ListFilter) (out []*modelsv1.Task) {
	var guids []string
	if f.CellID != "" {
		guids = candidates(f, st.tasksOn[f.CellID])
	} else {
		guids = candidates(f, st.tasks)
	}
	for _, g := range guids {
		t := st.tasks[g].msg.(*modelsv1.Task)
		if (f.Domain != "" && t.GetDomain() != f.Domain) || !f.selects(t.GetDefinition().GetLabels()) {
			continue
		}
		out = append(out, t)
	}
	return out
}

// Task returns one task (nil when absent), with the revision read.
func (s *Store) Task(guid string) (*modelsv1.Task, int64) {
	return readAt(s, func(st *state) (out *modelsv1.Task) {
		if it, ok := st.tasks[guid]; ok {
			out = it.msg.(*modelsv1.Task)
		}
		return out
	})
}

// Domains lists the fresh domains ordered by name, with the revision read.
func (s *Store) Domains() ([]*modelsv1.Domain, int64) {
	return readAt(s, func(st *state) (out []*modelsv1.Domain) {
		for _, n := range sortedKeys(st.domains) {
			out = append(out, st.domains[n].msg.(*modelsv1.Domain))
		}
		return out
	})
}

// Domain returns a fresh domain and the lease it is held by (nil when absent or expired).
func (s *Store) Domain(name string) (*modelsv1.Domain, int64) {
	it, ok := s.cache.get(parsedKey{kind: kindDomain, id: name})
	if !ok {
		return nil, 0
	}
	return it.msg.(*modelsv1.Domain), it.lease
}

// Cells lists registered cells ordered by id, with the revision read. The list is shared
// with other readers until the cells change: it must not be modified.
func (s *Store) Cells() ([]*modelsv1.CellPresence, int64) {
	return readAt(s, sortedCells)
}

// CellsSince is Cells for a caller holding the list read at known: unchanged is true (and
// cells nil) when no cell registered, changed or disappeared after known, and known is not
// past what the cache has seen (a lagging or restored store lists).
func (s *Store) CellsSince(known int64) (cells []*modelsv1.CellPresence, rev int64, unchanged bool) {
	s.cache.read(func(st *state, r int64) {
		rev = r
		if known > 0 && st.cellsRev <= known && known <= r {
			unchanged = true
			return
		}
		cells = sortedCells(st)
	})
	return cells, rev, unchanged
}

// sortedCells is st's cells ordered by id, built once per change of the cells (concurrent
// readers may both build it; either result is the same).
func sortedCells(st *state) []*modelsv1.CellPresence {
	if p := st.cellsSorted.Load(); p != nil {
		return *p
	}
	out := make([]*modelsv1.CellPresence, 0, len(st.cells))
	for _, id := range sortedKeys(st.cells) {
		out = append(out, st.cells[id].msg.(*modelsv1.CellPresence))
	}
	st.cellsSorted.Store(&out)
	return out
}

// Cell returns a registered cell (nil when absent).
func (s *Store) Cell(id string) *modelsv1.CellPresence {
	it, ok := s.cache.get(parsedKey{kind: kindCell, id: id})
	if !ok {
		return nil
	}
	return it.msg.(*modelsv1.CellPresence)
}

// SchedulingInfo returns one desired LRP's scheduling info (nil when absent).
func (s *Store) SchedulingInfo(guid string) *modelsv1.DesiredLRPSchedulingInfo {
	it, ok := s.cache.get(parsedKey{kind: kindSched, id: guid})
	if !ok {
		return nil
	}
	return it.msg.(*modelsv1.DesiredLRPSchedulingInfo)
}

// readAt runs fn over one consistent state of the cache and returns what it built with the
// revision that state reflects.
func readAt[T any](s *Store, fn func(st *state) T) (T, int64) {
	var out T
	var rev int64
	s.cache.read(func(st *state, r int64) {
		rev = r
		out = fn(st)
	})
	return out, rev
}

// RoutesPublished is what the route-emitters reported: the lowest revision any of them has
// published (0 when none reports), how many report, and a channel closed at the next change
// of any report (a new revision, a new emitter, one whose lease expired).
func (s *Store) RoutesPublished() (lowest int64, emitters int, changed <-chan struct{}) {
	s.cache.mu.RLock()
	defer s.cache.mu.RUnlock()
	for _, it := range s.cache.st.routes {
		rev := it.msg.(*wrapperspb.Int64Value).GetValue()
		if emitters == 0 || rev < lowest {
			lowest = rev
		}
		emitters++
	}
	return lowest, emitters, s.cache.routes
}

// RoutesPublishedBy is the revision route-emitter id last reported and the lease its report
// lives under; ok is false when it has no live report.
func (s *Store) RoutesPublishedBy(id string) (rev, lease int64, ok bool) {
	it, ok := s.cache.get(parsedKey{kind: kindRoutes, id: id})
	if !ok {
		return 0, 0, false
	}
	return it.msg.(*wrapperspb.Int64Value).GetValue(), it.lease, true
}
