// Package batch collects auction requests between rounds, deduplicated by process_guid/index
// and task guid, and signals the auction loop when work is waiting.
package batch

import (
	"sync"

	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

// Entry is one piece of waiting work and how many rounds already failed to run for it.
type Entry struct {
	// Work is the LRP instance or task to place.
	Work *placement.Work
	// Attempts counts rounds that failed before placing (e.g. the BBS could not list cells).
	Attempts int
}

// Batch is the set of work waiting for the next auction round. It is safe for concurrent use.
type Batch struct {
	mu    sync.Mutex
	order []string
	items map[string]Entry
	ready chan struct{}
}

// New returns an empty batch.
func New() *Batch {
	return &Batch{items: map[string]Entry{}, ready: make(chan struct{}, 1)}
}

// Add queues work, replacing waiting work with the same key (the newer request wins, keeping
// its place in line), and signals Ready. It returns how many items were new.
func (b *Batch) Add(works ...*placement.Work) int {
	entries := make([]Entry, len(works))
	for i, w := range works {
		entries[i] = Entry{Work: w}
	}
	return b.add(entries, true)
}

// Requeue puts back entries of a round that could not run, unless newer requests for the same
// work arrived meanwhile, and signals Ready.
func (b *Batch) Requeue(entries []Entry) { b.add(entries, false) }

func (b *Batch) add(entries []Entry, replace bool) int {
	if len(entries) == 0 {
		return 0
	}
	b.mu.Lock()
	added := 0
	for _, e := range entries {
		k := e.Work.Key()
		if _, ok := b.items[k]; ok {
			if replace {
				b.items[k] = e
			}
			continue
		}
		b.items[k] = e
		b.order = append(b.order, k)
		added++
	}
	b.mu.Unlock()
	select {
	case b.ready <- struct{}{}:
	default:
	}
	return added
}

// Drain removes and returns all waiting entries in arrival order.
func (b *Batch) Drain() []Entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Entry, 0, len(b.order))
	for _, k := range b.order {
		out = append(out, b.items[k])
	}
	b.order = nil
	b.items = map[string]Entry{}
	return out
}

// Len is the number of waiting entries.
func (b *Batch) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.order)
}

// Reset drops all waiting work (leadership changed hands: the BBS re-auctions what was lost).
func (b *Batch) Reset() { b.Drain() }

// Ready receives a value after work has been added; one value may stand for several additions
// and may remain after a Drain, so the receiver must tolerate an empty batch.
func (b *Batch) Ready() <-chan struct{} { return b.ready }
