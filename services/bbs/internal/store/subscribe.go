package store

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// maxBatchesPerRead bounds how much one subscriber takes from the ring at a time.
const maxBatchesPerRead = 1024

// Subscribe sends every event after since (0: after the current revision) that f keeps, one
// message per revision, and a bookmark carrying the current revision whenever nothing was sent
// for bookmarkEvery. Resumes older than the in-memory ring are served by a dedicated etcd
// watch; a resume from a compacted revision fails with ErrOutOfRange. It returns when ctx ends
// or send fails.
func (s *Store) Subscribe(ctx context.Context, since int64, f EventFilter, bookmarkEvery time.Duration, send func(*bbsv1.SubscribeToEventsResponse) error) error {
	select {
	case <-s.synced:
	case <-ctx.Done():
		return nil
	}
	_, head := s.hub.window()
	if since == 0 {
		since = head
	} else if since > head {
		cur, err := s.CurrentRevision(ctx)
		if err != nil {
			return rpcerr.Unavailable("%v", err)
		}
		if since > cur {
			return rpcerr.OutOfRange("since_revision %d is ahead of the store's revision %d", since, cur)
		}
	}
	read := s.hub.since
	switch {
	case f.broadcastOnly():
		// It keeps only events for every cell: it reads (and wakes for) only those revisions.
		read = s.hub.sinceBroadcast
	case f.CellID != "":
		// A cell's subscriber reads (and wakes for) only the revisions that concern its cell.
		defer s.hub.follow(f.CellID)()
		read = func(rev int64, max int) ([]batch, int64, <-chan struct{}, bool) {
			return s.hub.sinceCell(f.CellID, rev, max)
		}
	}
	ticker := time.NewTicker(bookmarkEvery)
	defer ticker.Stop()
	cursor, lastSent := since, time.Now()
	for {
		bs, upTo, notify, ok := read(cursor, maxBatchesPerRead)
		if !ok {
			s.log.Debug("subscriber is behind the event ring; following etcd", "since", cursor)
			return s.subscribeFromEtcd(ctx, cursor, f, bookmarkEvery, send)
		}
		for _, b := range bs {
			if evs := f.filterEvents(b); len(evs) > 0 {
				if err := send(&bbsv1.SubscribeToEventsResponse{Revision: b.rev, Events: evs}); err != nil {
					return err
				}
				lastSent = time.Now()
			}
		}
		cursor = upTo
		if len(bs) == maxBatchesPerRead {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-notify:
		case <-ticker.C:
			if time.Since(lastSent) >= bookmarkEvery {
				if err := send(&bbsv1.SubscribeToEventsResponse{Revision: cursor, Bookmark: true}); err != nil {
					return err
				}
				lastSent = time.Now()
			}
		}
	}
}

// subscribeFromEtcd serves a subscriber from its own etcd watch starting after cursor.
func (s *Store) subscribeFromEtcd(ctx context.Context, cursor int64, f EventFilter, bookmarkEvery time.Duration, send func(*bbsv1.SubscribeToEventsResponse) error) error {
	w := clientv3.NewWatcher(s.client)
	defer w.Close()
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := w.Watch(wctx, Root, clientv3.WithPrefix(), clientv3.WithRev(cursor+1), clientv3.WithPrevKV(), clientv3.WithProgressNotify())
	ticker := time.NewTicker(bookmarkEvery)
	defer ticker.Stop()
	lastSent := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			if time.Since(lastSent) >= bookmarkEvery {
				_ = w.RequestProgress(wctx)
			}
		case resp, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return rpcerr.Unavailable("event watch from revision %d closed", cursor+1)
			}
			if resp.CompactRevision != 0 {
				return rpcerr.OutOfRange("revision %d has been compacted (oldest available %d): list again and subscribe from the list's revision", cursor, resp.CompactRevision)
			}
			if err := resp.Err(); err != nil {
				return rpcerr.Unavailable("event watch: %v", err)
			}
			if resp.IsProgressNotify() {
				if resp.Header.Revision > cursor {
					cursor = resp.Header.Revision
				}
				if err := send(&bbsv1.SubscribeToEventsResponse{Revision: cursor, Bookmark: true}); err != nil {
					return err
				}
				lastSent = time.Now()
				continue
			}
			for _, group := range byRevision(resp.Events) {
				rev := group[0].Kv.ModRevision
				evs := f.filterEvents(s.eventsFromWatch(rev, group))
				cursor = rev
				if len(evs) == 0 {
					continue
				}
				if err := send(&bbsv1.SubscribeToEventsResponse{Revision: rev, Events: evs}); err != nil {
					return err
				}
				lastSent = time.Now()
			}
		}
	}
}

// eventsFromWatch converts one revision of a watch with previous values into the batch of its
// BBS events.
func (s *Store) eventsFromWatch(rev int64, evs []*clientv3.Event) batch {
	changes := make([]change, 0, len(evs))
	for _, ev := range evs {
		d, ok, err := s.decodeEvent(ev)
		if err != nil {
			// The store's own watch stops the BBS on the same record.
			s.log.Error("skipping a record the keyring cannot open", "error", err)
		}
		if !ok {
			continue
		}
		c := change{key: d.key, after: d.after}
		if ev.PrevKv != nil {
			if m, label, err := s.decode(string(ev.Kv.Key), d.key, ev.PrevKv.Value); err == nil {
				if resealedOnly(label, d.label, m, d.after) {
					continue
				}
				c.before = m
			}
		}
		changes = append(changes, c)
	}
	// A desired LRP's run info never changes while it is desired, so the cached copy completes a
	// change that touched only the scheduling info, provided the cache has reached rev and the
	// copy was written by then (not by a later incarnation of the guid); else the copy at rev.
	look := func(k parsedKey) proto.Message {
		var it item
		var ok bool
		s.cache.read(func(st *state, cacheRev int64) {
			it, ok = st.get(k)
			ok = ok && cacheRev >= rev && it.modRev <= rev
		})
		if ok {
			return it.msg
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := s.client.Get(ctx, k.String(), clientv3.WithRev(rev))
		if err != nil || len(resp.Kvs) == 0 {
			return nil
		}
		m, _, err := s.decode(k.String(), k, resp.Kvs[0].Value)
		if err != nil {
			return nil
		}
		return m
	}
	events := buildEvents(rev, changes, look)
	return batch{rev: rev, events: events, labels: eventLabels(events, changes, look)}
}

// String describes the ring window, for logs and tests.
func (s *Store) String() string {
	start, head := s.hub.window()
	return fmt.Sprintf("store(cache rev %d, events %d..%d)", s.cache.Revision(), start, head)
}
