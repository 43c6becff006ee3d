package store

import (
	"slices"
	"sort"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
)

// batch is every event of one store revision, with each event's label sets.
type batch struct {
	rev    int64
	events []*bbsv1.Event
	labels []labelSets // per event; nil: no event has labels
}

// hub keeps the recent event batches in revision order so subscribers can catch up from any
// revision after start without touching etcd, and wakes them when a batch arrives.
//
// Subscribers filtered by cell (every rep follows its own cell's events) are indexed: for each
// cell the hub keeps the revisions whose events concern it, and a channel closed only when one
// arrives, so each such subscriber wakes for and reads only its cell's revisions. Without the
// index every revision woke and was filtered by every rep's subscription: O(cells × events).
type hub struct {
	mu      sync.RWMutex
	start   int64 // the ring holds every batch with start < rev <= head
	head    int64
	batches []batch
	// events counts the events of batches; limit bounds it (see publish).
	events int
	limit  int
	notify chan struct{}
	// cells indexes the ring's revisions by the cells their events concern.
	cells map[string]*cellIndex
	// broadcast are the ring's revisions with an event every cell filter keeps (LinksChanged).
	broadcast []int64
	// broadcastNotify is closed when a broadcast revision is published (or the ring reset).
	broadcastNotify chan struct{}
}

// cellIndex is one cell's view of the ring.
type cellIndex struct {
	revs []int64 // revisions in the ring whose events concern the cell, ascending
	// events holds, for each of revs, the indexes of the cell's events in that revision's
	// batch: a cell's subscriber filters those, not the whole batch (the store's group commit
	// puts the events of many cells in one revision).
	events [][]int32
	notify chan struct{} // closed when such a revision (or a broadcast one) is published
	subs   int           // subscribers following the cell
}

func newHub(limit int) *hub {
	return &hub{limit: limit, notify: make(chan struct{}), broadcastNotify: make(chan struct{}), cells: map[string]*cellIndex{}}
}

// reset empties the ring; it now covers revisions after rev.
func (h *hub) reset(rev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.start, h.head = rev, rev
	h.batches = nil
	h.events = 0
	h.broadcast = nil
	for id, ci := range h.cells {
		ci.revs, ci.events = nil, nil
		ci.wake()
		if ci.subs == 0 {
			delete(h.cells, id)
		}
	}
	close(h.notify)
	h.notify = make(chan struct{})
	h.wakeBroadcast()
}

// wakeBroadcast closes broadcastNotify and makes a new one.
func (h *hub) wakeBroadcast() {
	close(h.broadcastNotify)
	h.broadcastNotify = make(chan struct{})
}

// publish appends the batch of revision rev (events may be empty), with each event's label
// sets (see eventLabels), and wakes subscribers.
func (h *hub) publish(rev int64, events []*bbsv1.Event, labels []labelSets) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rev <= h.head {
		return
	}
	h.head = rev
	if len(events) > 0 {
		h.batches = append(h.batches, batch{rev: rev, events: events, labels: labels})
		h.events += len(events)
		h.index(rev, events)
		if h.events > 2*h.limit {
			h.trim()
		}
	}
	close(h.notify)
	h.notify = make(chan struct{})
}

// trim drops the oldest batches until the ring holds at most limit events (the newest batch
// is always kept). The ring is bounded by events, not revisions: the store's group commit puts
// hundreds of events in one revision, and a ring of 100,000 revisions then held every version of
// every record a large run wrote, which kept most of the BBS's memory alive. Trimming only once
// the ring holds twice the limit keeps the copy amortized.
func (h *hub) trim() {
	drop := 0
	for drop < len(h.batches)-1 && h.events > h.limit {
		h.events -= len(h.batches[drop].events)
		drop++
	}
	if drop == 0 {
		return
	}
	h.start = h.batches[drop-1].rev
	h.batches = append([]batch(nil), h.batches[drop:]...)
	h.trimIndex()
}

// index records revision rev under every cell its events concern and wakes those cells'
// subscribers (every cell's, for a broadcast revision).
func (h *hub) index(rev int64, events []*bbsv1.Event) {
	cells, all := cellsOf(events)
	for _, c := range cells {
		ci := h.cells[c.id]
		if ci == nil {
			ci = &cellIndex{notify: make(chan struct{})}
			h.cells[c.id] = ci
		}
		ci.revs = append(ci.revs, rev)
		ci.events = append(ci.events, c.events)
		if !all {
			ci.wake()
		}
	}
	if all {
		h.broadcast = append(h.broadcast, rev)
		for _, ci := range h.cells {
			ci.wake()
		}
		h.wakeBroadcast()
	}
}

// trimIndex drops the indexed revisions the ring no longer holds, and the cells left with none
// and no subscriber.
func (h *hub) trimIndex() {
	first := func(revs []int64) int { return sort.Search(len(revs), func(i int) bool { return revs[i] > h.start }) }
	h.broadcast = append([]int64(nil), h.broadcast[first(h.broadcast):]...)
	for id, ci := range h.cells {
		i := first(ci.revs)
		ci.revs, ci.events = append([]int64(nil), ci.revs[i:]...), append([][]int32(nil), ci.events[i:]...)
		if len(ci.revs) == 0 && ci.subs == 0 {
			delete(h.cells, id)
		}
	}
}

// wake closes the cell's channel and makes a new one.
func (ci *cellIndex) wake() {
	close(ci.notify)
	ci.notify = make(chan struct{})
}

// follow registers a subscriber of cell's events; the returned func unregisters it.
func (h *hub) follow(cell string) (unfollow func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ci := h.cells[cell]
	if ci == nil {
		ci = &cellIndex{notify: make(chan struct{})}
		h.cells[cell] = ci
	}
	ci.subs++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if ci.subs--; ci.subs == 0 && len(ci.revs) == 0 && h.cells[cell] == ci {
			delete(h.cells, cell)
		}
	}
}

// sinceCell is since for a subscriber of cell (registered with follow): it returns the batches
// after rev whose events concern the cell or every cell, and a channel closed when the next
// such batch is published. A batch holds only the cell's events, unless it has an event for
// every cell (then it is whole); the caller filters them as it would the whole batch, with
// the same result (cellsOf).
func (h *hub) sinceCell(cell string, rev int64, max int) (bs []batch, upTo int64, notify <-chan struct{}, ok bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if rev < h.start {
		return nil, 0, nil, false
	}
	ci := h.cells[cell]
	if ci == nil { // not followed (only tests read without following): wake on every publish
		ci = &cellIndex{notify: h.notify}
	}
	revs := mergeAfter(ci.revs, h.broadcast, rev, max)
	for _, r := range revs {
		b := h.batchAt(r)
		if _, broadcast := slices.BinarySearch(h.broadcast, r); !broadcast {
			if k, ok := slices.BinarySearch(ci.revs, r); ok {
				b = b.only(ci.events[k])
			}
		}
		bs = append(bs, b)
	}
	return bs, h.upTo(revs, max), ci.notify, true
}

// sinceBroadcast is since for a cell's subscriber whose filter keeps only events that pass
// every cell filter (EventFilter.broadcastOnly: a rep following links and log drains): it
// returns the broadcast batches after rev, whole, and a channel closed when the next one is
// published. Such a subscriber is not woken by its cell's own instance events, which it
// would only filter out.
func (h *hub) sinceBroadcast(rev int64, max int) (bs []batch, upTo int64, notify <-chan struct{}, ok bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if rev < h.start {
		return nil, 0, nil, false
	}
	revs := mergeAfter(nil, h.broadcast, rev, max)
	for _, r := range revs {
		bs = append(bs, h.batchAt(r))
	}
	return bs, h.upTo(revs, max), h.broadcastNotify, true
}

// batchAt is the ring's batch of revision r, which it holds (callers hold mu).
func (h *hub) batchAt(r int64) batch {
	return h.batches[sort.Search(len(h.batches), func(i int) bool { return h.batches[i].rev >= r })]
}

// upTo is the revision a reader handed revs, at most max of those it asked for, is complete
// up to: the last of them when it got max, else the head (callers hold mu).
func (h *hub) upTo(revs []int64, max int) int64 {
	if len(revs) == max {
		return revs[max-1]
	}
	return h.head
}

// only is the batch of b's events at the indexes idx, with their label sets.
func (b batch) only(idx []int32) batch {
	out := batch{rev: b.rev, events: make([]*bbsv1.Event, len(idx))}
	for j, i := range idx {
		out.events[j] = b.events[i]
		if int(i) < len(b.labels) {
			if out.labels == nil {
				out.labels = make([]labelSets, len(idx))
			}
			out.labels[j] = b.labels[i]
		}
	}
	return out
}

// mergeAfter returns, ascending and without repeats, at most max of the revisions of a and b
// (each ascending) that are after rev.
func mergeAfter(a, b []int64, rev int64, max int) []int64 {
	i := sort.Search(len(a), func(i int) bool { return a[i] > rev })
	j := sort.Search(len(b), func(j int) bool { return b[j] > rev })
	var out []int64
	for len(out) < max && (i < len(a) || j < len(b)) {
		var next int64
		switch {
		case j >= len(b) || (i < len(a) && a[i] < b[j]):
			next, i = a[i], i+1
		case i >= len(a) || b[j] < a[i]:
			next, j = b[j], j+1
		default: // equal
			next, i, j = a[i], i+1, j+1
		}
		out = append(out, next)
	}
	return out
}

// cellIndexedKinds are the event kinds cellsOf indexes by the cells they name (instance, task
// and presence events). No event of another kind passes a cell filter unless it passes every
// cell filter (then its revision is a broadcast one).
var cellIndexedKinds = mustEventKinds("actual_lrp_created", "actual_lrp_changed", "actual_lrp_removed",
	"actual_lrp_crashed", "task_created", "task_changed", "task_removed", "cell_appeared", "cell_disappeared")

// mustEventKinds is EventKinds of names known to be valid.
func mustEventKinds(names ...string) map[protoreflect.FieldNumber]bool {
	k, err := EventKinds(names)
	if err != nil {
		panic(err)
	}
	return k
}

// cellEvents are the events of a batch that concern one cell, by their indexes in the batch.
type cellEvents struct {
	id     string
	events []int32
}

// cellsOf lists the cells the events concern, each once with the indexes of its events: every
// cell x for which some event passes EventFilter{CellID: x} (instance, task and presence
// events name their cells), and for x exactly the events that pass it, apart from those that
// pass every cell filter; all is true when there is one of those (LinksChanged, and
// DesiredLRPChanged of log drains).
func cellsOf(events []*bbsv1.Event) (cells []cellEvents, all bool) {
	pos := map[string]int{}
	var i int32
	add := func(id string) {
		if id == "" {
			return
		}
		p, ok := pos[id]
		if !ok {
			p = len(cells)
			pos[id] = p
			cells = append(cells, cellEvents{id: id})
		}
		if c := &cells[p]; len(c.events) == 0 || c.events[len(c.events)-1] != i {
			c.events = append(c.events, i)
		}
	}
	for n, e := range events {
		i = int32(n)
		switch k := e.GetKind().(type) {
		case *bbsv1.Event_ActualLrpCreated:
			add(k.ActualLrpCreated.GetActualLrp().GetInstanceKey().GetCellId())
		case *bbsv1.Event_ActualLrpChanged:
			add(k.ActualLrpChanged.GetBefore().GetInstanceKey().GetCellId())
			add(k.ActualLrpChanged.GetAfter().GetInstanceKey().GetCellId())
		case *bbsv1.Event_ActualLrpRemoved:
			add(k.ActualLrpRemoved.GetActualLrp().GetInstanceKey().GetCellId())
		case *bbsv1.Event_ActualLrpCrashed:
			add(k.ActualLrpCrashed.GetInstanceKey().GetCellId())
		case *bbsv1.Event_TaskCreated:
			add(k.TaskCreated.GetTask().GetCellId())
		case *bbsv1.Event_TaskChanged:
			add(k.TaskChanged.GetBefore().GetCellId())
			add(k.TaskChanged.GetAfter().GetCellId())
		case *bbsv1.Event_TaskRemoved:
			add(k.TaskRemoved.GetTask().GetCellId())
		case *bbsv1.Event_CellAppeared:
			add(k.CellAppeared.GetCell().GetCellId())
		case *bbsv1.Event_CellDisappeared:
			add(k.CellDisappeared.GetCell().GetCellId())
		case *bbsv1.Event_LinksChanged:
			all = true
		case *bbsv1.Event_DesiredLrpChanged:
			if c := k.DesiredLrpChanged; !slices.Equal(c.GetBefore().GetLogDrains(), c.GetAfter().GetLogDrains()) {
				all = true // a change of log drains passes every cell filter (EventFilter.Match)
			}
		}
	}
	return cells, all
}

// since returns up to max batches after rev, the revision the reader is complete up to once it
// has consumed them, and a channel closed at the next publish. ok is false when rev is older
// than the ring.
func (h *hub) since(rev int64, max int) (bs []batch, upTo int64, notify <-chan struct{}, ok bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if rev < h.start {
		return nil, 0, nil, false
	}
	i := sort.Search(len(h.batches), func(i int) bool { return h.batches[i].rev > rev })
	end := len(h.batches)
	upTo = h.head
	if end-i > max {
		end = i + max
		upTo = h.batches[end-1].rev
	}
	if upTo < rev {
		upTo = rev
	}
	return h.batches[i:end:end], upTo, h.notify, true
}

// window reports the revisions the ring covers.
func (h *hub) window() (start, head int64) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.start, h.head
}
