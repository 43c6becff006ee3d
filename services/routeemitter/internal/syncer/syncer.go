// Package syncer keeps the routing table in step with the BBS by list-then-watch: it lists the
// desired LRP scheduling infos and the actual LRPs, subscribes to the BBS's events from the
// listing's revision, applies each revision's events to the table and publishes the delta. A
// broken stream is resumed from the last revision received; a resume the BBS can no longer
// serve (OUT_OF_RANGE after compaction) leads to a fresh listing, and a timer (the sync
// interval) to a listing beside the open stream; either is diffed against the table so watchers
// see deltas, never a jump.
package syncer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/services/routeemitter/internal/table"
)

// BBS is the part of the BBS API the syncer reads.
type BBS interface {
	// DesiredLRPSchedulingInfos lists the desired LRPs' scheduling infos (with their routes).
	DesiredLRPSchedulingInfos(ctx context.Context, in *bbsv1.DesiredLRPSchedulingInfosRequest, opts ...grpc.CallOption) (*bbsv1.DesiredLRPSchedulingInfosResponse, error)
	// ActualLRPs lists instance records.
	ActualLRPs(ctx context.Context, in *bbsv1.ActualLRPsRequest, opts ...grpc.CallOption) (*bbsv1.ActualLRPsResponse, error)
	// SubscribeToEvents streams the store's events after a revision.
	SubscribeToEvents(ctx context.Context, in *bbsv1.SubscribeToEventsRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[bbsv1.SubscribeToEventsResponse], error)
}

// Publisher receives the table's deltas.
type Publisher interface {
	// Publish makes d the next version of the served table (an empty delta changes nothing).
	Publish(d table.Delta)
	// MarkSynced records that the table reflects a full listing.
	MarkSynced()
}

// Observer is told what the syncer does, for metrics. Its methods are called from Run's
// goroutine and must not block.
type Observer interface {
	// Listed is called after every full listing (a first sync, a periodic or a compaction
	// re-list) was applied to the table, with its duration.
	Listed(d time.Duration)
	// EventApplied is called for every BBS event applied to the table, by kind
	// (desired_lrp_created, desired_lrp_changed, desired_lrp_removed, actual_lrp_created,
	// actual_lrp_changed, actual_lrp_removed); events the last listing already held are not.
	EventApplied(kind string)
	// SyncFailed is called when a listing ("list") or an event stream ("watch") failed.
	SyncFailed(stage string)
}

// nopObserver ignores everything.
type nopObserver struct{}

func (nopObserver) Listed(time.Duration) {}
func (nopObserver) EventApplied(string)  {}
func (nopObserver) SyncFailed(string)    {}

// Defaults of Config.
const (
	// DefaultListTimeout bounds one listing call.
	DefaultListTimeout = 30 * time.Second
	// DefaultMinBackoff is the first wait after a failure.
	DefaultMinBackoff = 100 * time.Millisecond
	// DefaultMaxBackoff caps the wait between retries.
	DefaultMaxBackoff = 5 * time.Second
	// listAttempts bounds how often the two lists are repeated to read them at one revision.
	listAttempts = 3
)

// Config configures a Syncer; zero durations take the defaults.
type Config struct {
	// BBS is the BBS client.
	BBS BBS
	// Table is the table to maintain; only the syncer may use it while Run runs.
	Table *table.Table
	// Publisher receives every delta.
	Publisher Publisher
	// Logger receives the syncer's logs.
	Logger hclog.Logger
	// SyncInterval is how often the BBS is listed again in full (required).
	SyncInterval time.Duration
	// ListTimeout bounds one listing call.
	ListTimeout time.Duration
	// MinBackoff is the first wait after a failure; it doubles per consecutive failure.
	MinBackoff time.Duration
	// MaxBackoff caps the wait between retries.
	MaxBackoff time.Duration
	// Observer is told what the syncer does; nil ignores it.
	Observer Observer
}

// Stats counts what the syncer did, for tests and operators.
type Stats struct {
	// Lists is how many full listings were applied.
	Lists uint64
	// Subscriptions is how many event streams were opened.
	Subscriptions uint64
	// OutOfRange is how many resumes the BBS refused because the revision was compacted.
	OutOfRange uint64
	// Failures is how many listings or streams failed.
	Failures uint64
	// Revision is the BBS revision the table reflects.
	Revision int64
}

// Syncer maintains a table from the BBS. Create it with New and call Run once.
type Syncer struct {
	cfg Config
	log hclog.Logger

	// Owned by Run's goroutine.
	desiredRev int64 // revision of the last desired listing; earlier desired events are in it
	actualRev  int64 // revision of the last actual listing; earlier instance events are in it
	cursor     int64 // revision the table's inputs reflect; streams resume after it
	published  int64 // revision of the last published table
	holdUntil  int64 // no publishing before the cursor reaches this revision

	lists, subscriptions, outOfRange, failures atomic.Uint64
	revision                                   atomic.Int64
	advanced                                   chan struct{} // one pending signal that revision moved
}

// errSyncDue ends a stream when a periodic listing must be done with the stream closed.
var errSyncDue = errors.New("full sync due")

// New returns a syncer for cfg.
func New(cfg Config) (*Syncer, error) {
	switch {
	case cfg.BBS == nil:
		return nil, errors.New("syncer: BBS client is required")
	case cfg.Table == nil:
		return nil, errors.New("syncer: table is required")
	case cfg.Publisher == nil:
		return nil, errors.New("syncer: publisher is required")
	case cfg.SyncInterval <= 0:
		return nil, errors.New("syncer: sync interval must be positive")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.ListTimeout <= 0 {
		cfg.ListTimeout = DefaultListTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	return &Syncer{cfg: cfg, log: cfg.Logger, advanced: make(chan struct{}, 1)}, nil
}

// Stats returns the syncer's counters.
func (s *Syncer) Stats() Stats {
	return Stats{
		Lists:         s.lists.Load(),
		Subscriptions: s.subscriptions.Load(),
		OutOfRange:    s.outOfRange.Load(),
		Failures:      s.failures.Load(),
		Revision:      s.revision.Load(),
	}
}

// Run lists and follows the BBS until ctx ends, retrying every failure with a capped,
// jittered exponential backoff. It returns nil when ctx ends.
func (s *Syncer) Run(ctx context.Context) error {
	needList := true
	failures := 0 // consecutive
	wait := retry.Policy{Initial: s.cfg.MinBackoff, Max: s.cfg.MaxBackoff, Jitter: 0.2}.BackOff()
	var nextList time.Time
	for ctx.Err() == nil {
		if needList {
			if err := s.list(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				failures++
				s.failures.Add(1)
				s.cfg.Observer.SyncFailed("list")
				s.log.Warn("listing the BBS failed; will retry", "error", err, "attempt", failures)
				if !retry.Sleep(ctx, wait.NextBackOff()) {
					return nil
				}
				continue
			}
			needList = false
			nextList = time.Now().Add(s.cfg.SyncInterval)
		}
		progressed, err := s.watch(ctx, &nextList)
		if progressed {
			failures = 0
			wait.Reset()
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errSyncDue):
			s.log.Debug("periodic full sync could not overlap the stream; listing with the stream closed", "revision", s.cursor)
			needList = true
			continue
		case status.Code(err) == codes.OutOfRange:
			s.outOfRange.Add(1)
			s.log.Info("the BBS can no longer replay events from our revision; listing again", "revision", s.cursor, "error", err)
			needList = true
		default:
			s.log.Warn("BBS event stream failed; resuming", "revision", s.cursor, "error", err)
		}
		failures++
		s.failures.Add(1)
		s.cfg.Observer.SyncFailed("watch")
		if !retry.Sleep(ctx, wait.NextBackOff()) {
			return nil
		}
	}
	return nil
}

// list reads the desired scheduling infos and the actual LRPs, replaces the table's inputs with
// them and publishes the difference (at once when both lists, and the published table, are at
// one revision; else once the event stream has caught up with the newest of them).
//
// The two lists are two calls, possibly answered at different revisions D and A. Events are
// then subscribed from min(D, A): desired events at or before D and instance events at or
// before A are already in the lists and skipped; the others are applied. So each half of the
// table is exact from its own revision on, and nothing between the two is lost.
func (s *Syncer) list(ctx context.Context) error {
	start := time.Now()
	l, err := s.fetch(ctx)
	if err != nil {
		return err
	}
	s.install(l)
	s.cursor = min(l.desired.GetRevision(), l.actual.GetRevision())
	s.publish()
	s.cfg.Observer.Listed(time.Since(start))
	return nil
}

// listing is one full read of the BBS: the desired LRPs' scheduling infos and the actual LRPs,
// each with the revision it reflects.
type listing struct {
	desired *bbsv1.DesiredLRPSchedulingInfosResponse
	actual  *bbsv1.ActualLRPsResponse
	indexed table.Listing // both, indexed by process for the table
	err     error
}

// fetch reads both lists, repeating them (up to listAttempts) to read them at one revision, and
// indexes them by process for the table. It touches no syncer state, so it may run beside
// the event stream.
func (s *Syncer) fetch(ctx context.Context) (listing, error) {
	lctx, cancel := context.WithTimeout(ctx, s.cfg.ListTimeout)
	defer cancel()
	var l listing
	for attempt := 1; attempt <= listAttempts; attempt++ {
		var err error
		l.desired, err = s.cfg.BBS.DesiredLRPSchedulingInfos(lctx, &bbsv1.DesiredLRPSchedulingInfosRequest{})
		if err != nil {
			return l, fmt.Errorf("list desired LRP scheduling infos: %w", err)
		}
		l.actual, err = s.cfg.BBS.ActualLRPs(lctx, &bbsv1.ActualLRPsRequest{})
		if err != nil {
			return l, fmt.Errorf("list actual LRPs: %w", err)
		}
		if l.desired.GetRevision() == l.actual.GetRevision() {
			break
		}
	}
	l.indexed = table.NewListing(l.desired.GetSchedulingInfos(), l.actual.GetActualLrps())
	return l, nil
}

// install replaces the table's inputs with l, all at once, and adopts its revisions.
func (s *Syncer) install(l listing) {
	s.cfg.Table.Replace(l.indexed)
	d, a := s.adopt(l)
	s.lists.Add(1)
	s.log.Debug("listed the BBS; its lists replace the table's inputs", "desired_lrps", len(l.desired.GetSchedulingInfos()), "actual_lrps", len(l.actual.GetActualLrps()),
		"desired_revision", d, "actual_revision", a, "invalid_routes", s.cfg.Table.Invalid())
}

// maxOverlapBuffer bounds the stream messages kept while a periodic listing runs beside the
// stream; past it the listing is dropped and done again with the stream closed.
const maxOverlapBuffer = 100_000

// swapChunk is how many processes of a periodic listing are swapped into the table between two
// looks at the stream: at 250,000 instances swapping a whole listing held every event for 0.3 s
// on an idle machine and 1.8 s on a busy one.
var swapChunk = 256

// recvd is one stream message or the stream's end.
type recvd struct {
	resp *bbsv1.SubscribeToEventsResponse
	err  error
}

// keptEvent is one event kept while a periodic listing ran, with its revision.
type keptEvent struct {
	rev int64
	e   *bbsv1.Event
}

// swap is a periodic listing being swapped into the table a chunk of processes at a time,
// with the stream's messages applied in between.
type swap struct {
	l       listing
	guids   []string               // every process the listing or the table names
	next    int                    // guids[:next] are swapped
	kept    map[string][]keptEvent // process guid → its events since the listing started, in order
	started time.Time              // when the listing started
	begun   time.Time              // when the swap began
}

// keep records resp's events for the processes they name.
func (w *swap) keep(resp *bbsv1.SubscribeToEventsResponse) {
	for _, e := range resp.GetEvents() {
		if guid := eventProcess(e); guid != "" {
			w.kept[guid] = append(w.kept[guid], keptEvent{eventRevision(resp, e), e})
		}
	}
}

// watch follows the event stream from the cursor until it fails. It reports whether any message
// arrived.
//
// When *nextList comes, the periodic listing runs beside the stream instead of closing it, so
// routes keep flowing while a large BBS is listed: every message received meanwhile is applied
// and published as usual and also kept. When the listing arrives it replaces the table's
// inputs, the kept messages newer than each list are applied again on top of it, and the
// difference is published: the same table the stream alone would give, plus whatever the
// listing repairs. The listing is swapped in swapChunk processes at a time, each part followed
// by its processes' kept events and by whatever the stream delivered meanwhile, so routes keep
// flowing while a large listing is swapped in too. If a list is older than the
// revision the stream had reached when the listing started (a lagging BBS replica), the kept
// messages do not cover the gap and watch returns errSyncDue, for a listing with the stream
// closed.
func (s *Syncer) watch(ctx context.Context, nextList *time.Time) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	s.subscriptions.Add(1)
	stream, err := s.cfg.BBS.SubscribeToEvents(sctx, &bbsv1.SubscribeToEventsRequest{SinceRevision: s.cursor})
	if err != nil {
		cancel()
		return false, fmt.Errorf("subscribe to BBS events after revision %d: %w", s.cursor, err)
	}
	msgs := make(chan recvd, 64)
	var listed chan listing // non-nil while a periodic listing runs
	receiving := make(chan struct{})
	go func() {
		defer close(receiving)
		for {
			resp, err := stream.Recv()
			select {
			case msgs <- recvd{resp, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		cancel()
		<-receiving
		if listed != nil {
			<-listed
		}
	}()

	progressed := false
	var kept []*bbsv1.SubscribeToEventsResponse
	var keptFrom int64 // the cursor when the listing started
	overflow := false
	var started time.Time
	var swapping *swap // non-nil while a listing is swapped in a chunk at a time
	due := time.NewTimer(time.Until(*nextList))
	defer due.Stop()
	receive := func(m recvd) error {
		if m.err != nil {
			return fmt.Errorf("BBS events after revision %d: %w", s.cursor, m.err)
		}
		progressed = true
		s.apply(m.resp)
		switch {
		case swapping != nil:
			swapping.keep(m.resp)
		case listed != nil && !overflow:
			if kept = append(kept, m.resp); len(kept) > maxOverlapBuffer {
				overflow, kept = true, nil
			}
		}
		return nil
	}
	for {
		if swapping != nil {
			if s.swapPart(swapping) {
				swapping = nil
			}
			// Whatever the stream delivered during the part, before the next one.
		delivered:
			for range cap(msgs) {
				select {
				case m := <-msgs:
					if err := receive(m); err != nil {
						return progressed, err
					}
				default:
					break delivered
				}
			}
			if sctx.Err() != nil {
				return progressed, fmt.Errorf("BBS events after revision %d: %w", s.cursor, sctx.Err())
			}
			continue
		}
		select {
		case <-sctx.Done():
			return progressed, fmt.Errorf("BBS events after revision %d: %w", s.cursor, sctx.Err())
		case m := <-msgs:
			if err := receive(m); err != nil {
				return progressed, err
			}
		case <-due.C:
			started, keptFrom, kept, overflow = time.Now(), s.cursor, nil, false
			s.log.Debug("listing the BBS beside the stream", "revision", s.cursor)
			listed = make(chan listing, 1)
			go func(out chan<- listing) {
				l, err := s.fetch(sctx)
				l.err = err
				out <- l
			}(listed)
		case l := <-listed:
			listed = nil
			*nextList = time.Now().Add(s.cfg.SyncInterval)
			due.Reset(s.cfg.SyncInterval)
			switch {
			case sctx.Err() != nil:
				return progressed, fmt.Errorf("BBS events after revision %d: %w", s.cursor, sctx.Err())
			case l.err != nil:
				s.failures.Add(1)
				s.cfg.Observer.SyncFailed("list")
				s.log.Warn("periodic listing of the BBS failed; the stream goes on and the next one retries", "error", l.err)
				continue
			case overflow || l.desired.GetRevision() < keptFrom || l.actual.GetRevision() < keptFrom:
				return progressed, errSyncDue
			}
			swapping = s.beginSwap(l, kept, started)
			kept = nil
		}
	}
}

// beginSwap starts swapping l into the table, with the messages kept since it started, and
// adopts its revisions at once, for every process: one not yet swapped may skip an event the
// listing holds until its turn, when the listing brings it.
func (s *Syncer) beginSwap(l listing, kept []*bbsv1.SubscribeToEventsResponse, started time.Time) *swap {
	w := &swap{l: l, guids: s.cfg.Table.Processes(l.indexed), kept: map[string][]keptEvent{}, started: started, begun: time.Now()}
	for _, resp := range kept {
		w.keep(resp)
	}
	s.adopt(l)
	return w
}

// adopt makes l's revisions the syncer's: events at or before each list's revision are
// skipped, as the lists hold them, and nothing is published before the stream has passed both
// (nor older than the table already published: a lagging BBS replica). It returns them.
func (s *Syncer) adopt(l listing) (desired, actual int64) {
	desired, actual = l.desired.GetRevision(), l.actual.GetRevision()
	s.desiredRev, s.actualRev = desired, actual
	s.holdUntil = max(desired, actual, s.published)
	return desired, actual
}

// swapPart swaps the next swapChunk processes of w into the table, applies each one's kept
// events again on top, and publishes; it reports whether the listing is now wholly swapped in.
func (s *Syncer) swapPart(w *swap) bool {
	end := min(w.next+swapChunk, len(w.guids))
	for _, guid := range w.guids[w.next:end] {
		s.cfg.Table.ReplaceProcess(w.l.indexed, guid)
		for _, k := range w.kept[guid] {
			s.applyEvent(k.rev, k.e, nopObserver{}) // counted when first applied
		}
	}
	w.next = end
	last := w.next == len(w.guids)
	if last {
		s.lists.Add(1) // before the last part is published, as a whole listing's was
	}
	s.publish()
	if !last {
		return false
	}
	s.cfg.Observer.Listed(time.Since(w.started))
	s.log.Debug("swapped in the periodic listing", "desired_lrps", len(w.l.desired.GetSchedulingInfos()), "actual_lrps", len(w.l.actual.GetActualLrps()),
		"desired_revision", w.l.desired.GetRevision(), "actual_revision", w.l.actual.GetRevision(), "processes", len(w.guids),
		"fetched_in", w.begun.Sub(w.started), "swapped_in", time.Since(w.begun), "invalid_routes", s.cfg.Table.Invalid())
	return true
}

// apply feeds one revision's events (or a bookmark) to the table and publishes the result.
func (s *Syncer) apply(resp *bbsv1.SubscribeToEventsResponse) {
	spans := publishSpans(resp) // trace.go
	s.applyEvents(resp, s.cfg.Observer)
	if resp.GetRevision() > s.cursor {
		s.cursor = resp.GetRevision()
	}
	s.publish()
	endPublishSpans(spans, s.cursor < s.holdUntil)
}

// applyEvents feeds one revision's events to the table's inputs, skipping those the last
// listing already holds, and tells obs of each one applied.
func (s *Syncer) applyEvents(resp *bbsv1.SubscribeToEventsResponse, obs Observer) {
	for _, e := range resp.GetEvents() {
		s.applyEvent(eventRevision(resp, e), e, obs)
	}
}

// eventRevision is the store revision of e, one of resp's events: its own, or resp's when the
// event carries none.
func eventRevision(resp *bbsv1.SubscribeToEventsResponse, e *bbsv1.Event) int64 {
	if rev := e.GetRevision(); rev != 0 {
		return rev
	}
	return resp.GetRevision()
}

// applyEvent feeds one event of revision rev to the table's inputs unless the last listing
// already holds it, and tells obs if it was applied.
func (s *Syncer) applyEvent(rev int64, e *bbsv1.Event, obs Observer) {
	switch k := e.GetKind().(type) {
	case *bbsv1.Event_DesiredLrpCreated:
		if d := k.DesiredLrpCreated.GetDesiredLrp(); rev > s.desiredRev {
			s.cfg.Table.SetDesired(d.GetProcessGuid(), d.GetRoutes())
			obs.EventApplied("desired_lrp_created")
		}
	case *bbsv1.Event_DesiredLrpChanged:
		if d := k.DesiredLrpChanged.GetAfter(); rev > s.desiredRev {
			s.cfg.Table.SetDesired(d.GetProcessGuid(), d.GetRoutes())
			obs.EventApplied("desired_lrp_changed")
		}
	case *bbsv1.Event_DesiredLrpRemoved:
		if rev > s.desiredRev {
			s.cfg.Table.RemoveDesired(k.DesiredLrpRemoved.GetDesiredLrp().GetProcessGuid())
			obs.EventApplied("desired_lrp_removed")
		}
	case *bbsv1.Event_ActualLrpCreated:
		if rev > s.actualRev {
			s.cfg.Table.SetActual(k.ActualLrpCreated.GetActualLrp())
			obs.EventApplied("actual_lrp_created")
		}
	case *bbsv1.Event_ActualLrpChanged:
		if rev > s.actualRev {
			s.cfg.Table.SetActual(k.ActualLrpChanged.GetAfter())
			obs.EventApplied("actual_lrp_changed")
		}
	case *bbsv1.Event_ActualLrpRemoved:
		if rev > s.actualRev {
			s.cfg.Table.RemoveActual(k.ActualLrpRemoved.GetActualLrp())
			obs.EventApplied("actual_lrp_removed")
		}
	}
}

// eventProcess is the process guid an event is about ("" for kinds the table ignores).
func eventProcess(e *bbsv1.Event) string {
	switch k := e.GetKind().(type) {
	case *bbsv1.Event_DesiredLrpCreated:
		return k.DesiredLrpCreated.GetDesiredLrp().GetProcessGuid()
	case *bbsv1.Event_DesiredLrpChanged:
		return k.DesiredLrpChanged.GetAfter().GetProcessGuid()
	case *bbsv1.Event_DesiredLrpRemoved:
		return k.DesiredLrpRemoved.GetDesiredLrp().GetProcessGuid()
	case *bbsv1.Event_ActualLrpCreated:
		return k.ActualLrpCreated.GetActualLrp().GetKey().GetProcessGuid()
	case *bbsv1.Event_ActualLrpChanged:
		return k.ActualLrpChanged.GetAfter().GetKey().GetProcessGuid()
	case *bbsv1.Event_ActualLrpRemoved:
		return k.ActualLrpRemoved.GetActualLrp().GetKey().GetProcessGuid()
	}
	return ""
}

// publish commits the table and hands the delta to the publisher, unless a listing is still
// waiting for the stream to catch up.
func (s *Syncer) publish() {
	if s.cursor < s.holdUntil {
		return
	}
	s.cfg.Publisher.Publish(s.cfg.Table.Commit())
	s.published = s.cursor
	if s.revision.Swap(s.cursor) != s.cursor {
		select {
		case s.advanced <- struct{}{}:
		default:
		}
	}
	s.cfg.Publisher.MarkSynced()
}

// Published is the BBS revision whose events (and all earlier ones) the published table
// reflects (0 before the first sync); Advanced signals when it moves.
func (s *Syncer) Published() int64 { return s.revision.Load() }

// Advanced holds a signal whenever Published has moved since it was last received.
func (s *Syncer) Advanced() <-chan struct{} { return s.advanced }
