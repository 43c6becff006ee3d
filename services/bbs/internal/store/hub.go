package store

import (
	"sort"
	"sync"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
)

// batch is every event of one store revision.
type batch struct {
	rev    int64
	events []*bbsv1.Event
}

// hub keeps the recent event batches in revision order so subscribers can catch up from any
// revision after start without touching etcd, and wakes them when a batch arrives.
type hub struct {
	mu      sync.RWMutex
	start   int64 // the ring holds every batch with start < rev <= head
	head    int64
	batches []batch
	limit   int
	notify  chan struct{}
}

func newHub(limit int) *hub {
	return &hub{limit: limit, notify: make(chan struct{})}
}

// reset empties the ring; it now covers revisions after rev.
func (h *hub) reset(rev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.start, h.head = rev, rev
	h.batches = nil
	close(h.notify)
	h.notify = make(chan struct{})
}

// publish appends the batch of revision rev (events may be empty) and wakes subscribers.
func (h *hub) publish(rev int64, events []*bbsv1.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rev <= h.head {
		return
	}
	h.head = rev
	if len(events) > 0 {
		h.batches = append(h.batches, batch{rev: rev, events: events})
		if len(h.batches) > 2*h.limit {
			drop := len(h.batches) - h.limit
			h.start = h.batches[drop-1].rev
			kept := make([]batch, h.limit)
			copy(kept, h.batches[drop:])
			h.batches = kept
		}
	}
	close(h.notify)
	h.notify = make(chan struct{})
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
