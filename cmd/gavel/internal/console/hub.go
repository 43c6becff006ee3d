package console

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/retry"
)

// Bounds of what the hub remembers.
const (
	maxLines          = 500 // event lines on the events page
	maxHistoryPerLRP  = 200 // history entries per process guid
	maxHistoryLRPs    = 2000
	subscriberBacklog = 64 // messages a slow browser may lag before it misses some
)

// line is one event as the events page and an LRP's history show it.
type line struct {
	Time     time.Time `json:"time"`
	Revision int64     `json:"revision"`
	Kind     string    `json:"kind"`
	Text     string    `json:"text"`
	guid     string    // process guid the event concerns, if any
}

// update is what one server-sent event carries: the pages (topics) a revision touched and its
// lines.
type update struct {
	Revision int64    `json:"revision"`
	Topics   []string `json:"topics"`
	Lines    []line   `json:"lines"`
}

// hub follows the BBS event stream (list-then-watch, resuming after the last revision seen)
// and fans each revision out to the open pages; it remembers the last lines and each LRP's
// history since the console started.
type hub struct {
	bbs bbsv1.BBSServiceClient

	mu      sync.Mutex
	lines   []line            // newest last
	history map[string][]line // by process guid, oldest first
	subs    map[chan []byte]struct{}
	status  string // the stream's state, for the footer
	since   time.Time
}

func newHub(bbs bbsv1.BBSServiceClient) *hub {
	return &hub{bbs: bbs, history: map[string][]line{}, subs: map[chan []byte]struct{}{}, status: "connecting", since: time.Now()}
}

// run follows the stream until ctx ends, calling ready once the first subscription is in
// force (every later change reaches the pages).
func (h *hub) run(ctx context.Context, ready func()) {
	b := retry.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}.BackOff()
	var since int64
	once := sync.OnceFunc(ready)
	for ctx.Err() == nil {
		if since == 0 {
			// Read a revision to start after: nothing after it is missed.
			resp, err := h.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{}, grpc.WaitForReady(true))
			if err != nil {
				h.setStatus(fmt.Sprintf("event stream down: %v", err))
				retry.Sleep(ctx, b.NextBackOff())
				continue
			}
			since = resp.GetRevision()
		}
		stream, err := h.bbs.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{SinceRevision: since}, grpc.WaitForReady(true))
		if err == nil {
			h.setStatus("live")
			once()
			for {
				var msg *bbsv1.SubscribeToEventsResponse
				msg, err = stream.Recv()
				if err != nil {
					break
				}
				b.Reset()
				since = msg.GetRevision()
				if !msg.GetBookmark() {
					h.publish(msg)
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.OutOfRange {
			since = 0 // compacted: re-list and resume from the list's revision
			h.publishTopics("cells", "lrps", "tasks")
		}
		h.setStatus(fmt.Sprintf("event stream down, retrying: %v", err))
		retry.Sleep(ctx, b.NextBackOff())
	}
}

func (h *hub) setStatus(s string) {
	h.mu.Lock()
	h.status = s
	h.mu.Unlock()
}

// streamStatus reports the stream's state.
func (h *hub) streamStatus() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.status
}

// publish records a revision's events and sends them to every open page.
func (h *hub) publish(msg *bbsv1.SubscribeToEventsResponse) {
	now := time.Now()
	u := update{Revision: msg.GetRevision()}
	topics := map[string]bool{"events": true}
	for _, e := range msg.GetEvents() {
		l, topic := describe(e)
		l.Time, l.Revision = now, msg.GetRevision()
		topics[topic] = true
		if topic == "lrps" {
			topics["cells"] = true // instances use cells' capacity
		}
		u.Lines = append(u.Lines, l)
	}
	for _, t := range []string{"cells", "lrps", "tasks", "events"} {
		if topics[t] {
			u.Topics = append(u.Topics, t)
		}
	}
	h.mu.Lock()
	for _, l := range u.Lines {
		h.lines = append(h.lines, l)
		if l.guid != "" {
			if _, ok := h.history[l.guid]; ok || len(h.history) < maxHistoryLRPs {
				hist := append(h.history[l.guid], l)
				if len(hist) > maxHistoryPerLRP {
					hist = hist[len(hist)-maxHistoryPerLRP:]
				}
				h.history[l.guid] = hist
			}
		}
	}
	if len(h.lines) > maxLines {
		h.lines = append([]line(nil), h.lines[len(h.lines)-maxLines:]...)
	}
	h.mu.Unlock()
	h.send(u)
}

// publishTopics tells the pages of topics to re-render.
func (h *hub) publishTopics(topics ...string) { h.send(update{Topics: topics}) }

func (h *hub) send(u update) {
	b, err := json.Marshal(u)
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- b:
		default: // a page that lags misses lines; its next re-render is whole again
		}
	}
}

// subscribe returns a channel of encoded updates and its cancel.
func (h *hub) subscribe() (<-chan []byte, func()) {
	ch := make(chan []byte, subscriberBacklog)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}

// recent returns the last lines, newest first.
func (h *hub) recent() []line {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]line, len(h.lines))
	for i, l := range h.lines {
		out[len(out)-1-i] = l
	}
	return out
}

// historyOf returns an LRP's lines since the console started, oldest first.
func (h *hub) historyOf(guid string) []line {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]line(nil), h.history[guid]...)
}

// describe renders one event as a line and names the page topic it touches.
func describe(e *bbsv1.Event) (line, string) {
	inst := func(a *modelsv1.ActualLRP) string {
		s := fmt.Sprintf("%s/%d %s", a.GetKey().GetProcessGuid(), a.GetKey().GetIndex(), stateWord(a.GetState()))
		if c := a.GetInstanceKey().GetCellId(); c != "" {
			s += " on " + c
		}
		if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_EVACUATING {
			s += " (evacuating)"
		}
		if pe := a.GetPlacementError(); pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED {
			s += ": " + pe.GetMessage()
		}
		return s
	}
	switch k := e.GetKind().(type) {
	case *bbsv1.Event_DesiredLrpCreated:
		d := k.DesiredLrpCreated.GetDesiredLrp()
		return line{Kind: "desired LRP created", Text: fmt.Sprintf("%s desired with %d instances (%s)", d.GetProcessGuid(), d.GetInstances(), d.GetRootfs()), guid: d.GetProcessGuid()}, "lrps"
	case *bbsv1.Event_DesiredLrpChanged:
		b, a := k.DesiredLrpChanged.GetBefore(), k.DesiredLrpChanged.GetAfter()
		text := a.GetProcessGuid() + " changed"
		if b.GetInstances() != a.GetInstances() {
			text = fmt.Sprintf("%s scaled from %d to %d instances", a.GetProcessGuid(), b.GetInstances(), a.GetInstances())
		}
		return line{Kind: "desired LRP changed", Text: text, guid: a.GetProcessGuid()}, "lrps"
	case *bbsv1.Event_DesiredLrpRemoved:
		d := k.DesiredLrpRemoved.GetDesiredLrp()
		return line{Kind: "desired LRP removed", Text: d.GetProcessGuid() + " removed", guid: d.GetProcessGuid()}, "lrps"
	case *bbsv1.Event_ActualLrpCreated:
		a := k.ActualLrpCreated.GetActualLrp()
		return line{Kind: "instance created", Text: inst(a), guid: a.GetKey().GetProcessGuid()}, "lrps"
	case *bbsv1.Event_ActualLrpChanged:
		b, a := k.ActualLrpChanged.GetBefore(), k.ActualLrpChanged.GetAfter()
		text := inst(a)
		if b.GetState() != a.GetState() {
			text = fmt.Sprintf("%s (was %s)", text, stateWord(b.GetState()))
		}
		return line{Kind: "instance changed", Text: text, guid: a.GetKey().GetProcessGuid()}, "lrps"
	case *bbsv1.Event_ActualLrpRemoved:
		a := k.ActualLrpRemoved.GetActualLrp()
		return line{Kind: "instance removed", Text: inst(a), guid: a.GetKey().GetProcessGuid()}, "lrps"
	case *bbsv1.Event_ActualLrpCrashed:
		c := k.ActualLrpCrashed
		return line{Kind: "instance crashed", Text: fmt.Sprintf("%s/%d crashed (%d crashes): %s", c.GetKey().GetProcessGuid(), c.GetKey().GetIndex(), c.GetCrashCount(), c.GetCrashReason()), guid: c.GetKey().GetProcessGuid()}, "lrps"
	case *bbsv1.Event_TaskCreated:
		return line{Kind: "task created", Text: k.TaskCreated.GetTask().GetTaskGuid()}, "tasks"
	case *bbsv1.Event_TaskChanged:
		t := k.TaskChanged.GetAfter()
		return line{Kind: "task changed", Text: fmt.Sprintf("%s %s %s", t.GetTaskGuid(), taskStateWord(t.GetState()), t.GetCellId())}, "tasks"
	case *bbsv1.Event_TaskRemoved:
		return line{Kind: "task removed", Text: k.TaskRemoved.GetTask().GetTaskGuid()}, "tasks"
	case *bbsv1.Event_CellAppeared:
		return line{Kind: "cell appeared", Text: k.CellAppeared.GetCell().GetCellId()}, "cells"
	case *bbsv1.Event_CellDisappeared:
		return line{Kind: "cell disappeared", Text: k.CellDisappeared.GetCell().GetCellId()}, "cells"
	case *bbsv1.Event_LinksChanged:
		l := k.LinksChanged
		text := l.GetProcessGuid() + " links resolved anew"
		if len(l.GetErrors()) > 0 {
			text = fmt.Sprintf("%s links fail: %v", l.GetProcessGuid(), l.GetErrors())
		}
		return line{Kind: "links changed", Text: text, guid: l.GetProcessGuid()}, "lrps"
	default:
		return line{Kind: fmt.Sprintf("%T", e.GetKind())}, "events"
	}
}
