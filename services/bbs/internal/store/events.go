package store

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/labels"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// change is one key's transition within a store revision; before or after is nil when the
// record was absent.
type change struct {
	key    parsedKey
	before proto.Message
	after  proto.Message
}

// lookup supplies a record a revision did not touch (the unchanged half of a desired LRP).
type lookup func(k parsedKey) proto.Message

// buildEvents turns the changes of one revision into BBS events: desired LRP events first
// (their two halves joined), then instance, task and cell events in the order of the changes.
func buildEvents(rev int64, changes []change, look lookup) []*bbsv1.Event {
	type halves struct {
		bs, as, br, ar proto.Message
		sched, run     bool
	}
	var desired []*bbsv1.Event
	var rest []*bbsv1.Event
	halvesOf := map[string]*halves{}
	var order []string
	for _, c := range changes {
		switch c.key.kind {
		case kindSched, kindRun:
			h := halvesOf[c.key.id]
			if h == nil {
				h = &halves{}
				halvesOf[c.key.id] = h
				order = append(order, c.key.id)
			}
			if c.key.kind == kindSched {
				h.bs, h.as, h.sched = c.before, c.after, true
			} else {
				h.br, h.ar, h.run = c.before, c.after, true
			}
		case kindActual:
			rest = append(rest, actualEvents(c)...)
		case kindTask:
			rest = append(rest, taskEvent(c))
		case kindCell:
			if e := cellEvent(c); e != nil {
				rest = append(rest, e)
			}
		}
	}
	for _, id := range order {
		h := halvesOf[id]
		if !h.sched {
			cur := look(parsedKey{kind: kindSched, id: id})
			h.bs, h.as = cur, cur
		}
		if !h.run {
			cur := look(parsedKey{kind: kindRun, id: id})
			h.br, h.ar = cur, cur
		}
		before, after := joinDesired(h.bs, h.br), joinDesired(h.as, h.ar)
		var e *bbsv1.Event
		switch {
		case before == nil && after != nil:
			e = &bbsv1.Event{Kind: &bbsv1.Event_DesiredLrpCreated{DesiredLrpCreated: &bbsv1.DesiredLRPCreated{DesiredLrp: after}}}
		case before != nil && after == nil:
			e = &bbsv1.Event{Kind: &bbsv1.Event_DesiredLrpRemoved{DesiredLrpRemoved: &bbsv1.DesiredLRPRemoved{DesiredLrp: before}}}
		case before != nil && after != nil:
			e = &bbsv1.Event{Kind: &bbsv1.Event_DesiredLrpChanged{DesiredLrpChanged: &bbsv1.DesiredLRPChanged{Before: before, After: after}}}
		}
		if e != nil {
			desired = append(desired, e)
		}
	}
	out := append(desired, rest...)
	for _, e := range out {
		e.Revision = rev
	}
	return out
}

func joinDesired(s, r proto.Message) *modelsv1.DesiredLRP {
	sched, _ := s.(*modelsv1.DesiredLRPSchedulingInfo)
	if sched == nil {
		return nil
	}
	run, _ := r.(*modelsv1.DesiredLRPRunInfo)
	return models.JoinDesiredLRP(sched, run)
}

func actualEvents(c change) []*bbsv1.Event {
	before, _ := c.before.(*modelsv1.ActualLRP)
	after, _ := c.after.(*modelsv1.ActualLRP)
	switch {
	case before == nil && after != nil:
		return []*bbsv1.Event{{Kind: &bbsv1.Event_ActualLrpCreated{ActualLrpCreated: &bbsv1.ActualLRPCreated{ActualLrp: after}}}}
	case before != nil && after == nil:
		return []*bbsv1.Event{{Kind: &bbsv1.Event_ActualLrpRemoved{ActualLrpRemoved: &bbsv1.ActualLRPRemoved{ActualLrp: before}}}}
	case before != nil && after != nil:
		out := []*bbsv1.Event{{Kind: &bbsv1.Event_ActualLrpChanged{ActualLrpChanged: &bbsv1.ActualLRPChanged{Before: before, After: after}}}}
		if after.GetCrashCount() > before.GetCrashCount() || (after.GetCrashCount() < before.GetCrashCount() && after.GetCrashCount() > 0) {
			out = append(out, &bbsv1.Event{Kind: &bbsv1.Event_ActualLrpCrashed{ActualLrpCrashed: &bbsv1.ActualLRPCrashed{
				Key:         after.GetKey(),
				InstanceKey: before.GetInstanceKey(),
				CrashCount:  after.GetCrashCount(),
				CrashReason: after.GetCrashReason(),
			}}})
		}
		return out
	}
	return nil
}

func taskEvent(c change) *bbsv1.Event {
	before, _ := c.before.(*modelsv1.Task)
	after, _ := c.after.(*modelsv1.Task)
	switch {
	case before == nil:
		return &bbsv1.Event{Kind: &bbsv1.Event_TaskCreated{TaskCreated: &bbsv1.TaskCreated{Task: after}}}
	case after == nil:
		return &bbsv1.Event{Kind: &bbsv1.Event_TaskRemoved{TaskRemoved: &bbsv1.TaskRemoved{Task: before}}}
	default:
		return &bbsv1.Event{Kind: &bbsv1.Event_TaskChanged{TaskChanged: &bbsv1.TaskChanged{Before: before, After: after}}}
	}
}

func cellEvent(c change) *bbsv1.Event {
	before, _ := c.before.(*modelsv1.CellPresence)
	after, _ := c.after.(*modelsv1.CellPresence)
	switch {
	case before == nil && after != nil:
		return &bbsv1.Event{Kind: &bbsv1.Event_CellAppeared{CellAppeared: &bbsv1.CellAppeared{Cell: after}}}
	case before != nil && after == nil:
		return &bbsv1.Event{Kind: &bbsv1.Event_CellDisappeared{CellDisappeared: &bbsv1.CellDisappeared{Cell: before}}}
	}
	return nil // a re-registration with new details is not an appearance
}

// labelSets are the label sets of one event that a label selector is matched against, as of
// the event's revision: the labels of the desired LRP it concerns (an instance's or a
// consumer's desired LRP; both sides of a desired LRP's change), or of the task's definition
// (both sides of a change). A presence event, or an instance event whose desired LRP is gone,
// has none.
type labelSets []map[string]string

// eventLabels returns the label sets of each event of one revision: changes are the
// revision's, and look supplies the desired LRPs it did not touch, as of the revision.
func eventLabels(events []*bbsv1.Event, changes []change, look lookup) []labelSets {
	var touched map[string]proto.Message // the revision's scheduling infos, after or else before
	for _, c := range changes {
		if c.key.kind != kindSched {
			continue
		}
		if touched == nil {
			touched = map[string]proto.Message{}
		}
		if c.after != nil {
			touched[c.key.id] = c.after
		} else {
			touched[c.key.id] = c.before
		}
	}
	desiredOf := func(guid string) labelSets {
		m, ok := touched[guid]
		if !ok {
			m = look(parsedKey{kind: kindSched, id: guid})
		}
		if sched, _ := m.(*modelsv1.DesiredLRPSchedulingInfo); sched != nil {
			return labelSets{sched.GetLabels()}
		}
		return nil
	}
	out := make([]labelSets, len(events))
	for i, e := range events {
		switch k := e.GetKind().(type) {
		case *bbsv1.Event_DesiredLrpCreated:
			out[i] = labelSets{k.DesiredLrpCreated.GetDesiredLrp().GetLabels()}
		case *bbsv1.Event_DesiredLrpChanged:
			out[i] = labelSets{k.DesiredLrpChanged.GetBefore().GetLabels(), k.DesiredLrpChanged.GetAfter().GetLabels()}
		case *bbsv1.Event_DesiredLrpRemoved:
			out[i] = labelSets{k.DesiredLrpRemoved.GetDesiredLrp().GetLabels()}
		case *bbsv1.Event_ActualLrpCreated:
			out[i] = desiredOf(k.ActualLrpCreated.GetActualLrp().GetKey().GetProcessGuid())
		case *bbsv1.Event_ActualLrpChanged:
			out[i] = desiredOf(k.ActualLrpChanged.GetAfter().GetKey().GetProcessGuid())
		case *bbsv1.Event_ActualLrpRemoved:
			out[i] = desiredOf(k.ActualLrpRemoved.GetActualLrp().GetKey().GetProcessGuid())
		case *bbsv1.Event_ActualLrpCrashed:
			out[i] = desiredOf(k.ActualLrpCrashed.GetKey().GetProcessGuid())
		case *bbsv1.Event_LinksChanged:
			out[i] = desiredOf(k.LinksChanged.GetProcessGuid())
		case *bbsv1.Event_TaskCreated:
			out[i] = labelSets{k.TaskCreated.GetTask().GetDefinition().GetLabels()}
		case *bbsv1.Event_TaskChanged:
			out[i] = labelSets{k.TaskChanged.GetBefore().GetDefinition().GetLabels(), k.TaskChanged.GetAfter().GetDefinition().GetLabels()}
		case *bbsv1.Event_TaskRemoved:
			out[i] = labelSets{k.TaskRemoved.GetTask().GetDefinition().GetLabels()}
		}
	}
	return out
}

// EventFilter keeps the events a subscriber asked for; empty fields match everything, and a
// record without the attribute a non-empty field asks for does not match.
type EventFilter struct {
	// Domain keeps events of records in this domain.
	Domain string
	// Guids keeps events of these process or task guids.
	Guids map[string]struct{}
	// CellID keeps events of instances, tasks and presences of this cell.
	CellID string
	// Selector keeps events whose labels match, as the list reads do: a desired LRP's labels
	// for its own events, its instances' and its links' (as of each event's revision), a task's
	// definition labels. A change matches when either side does; presence events never match
	// a non-empty selector.
	Selector labels.Selector
	// Kinds keeps only events of these kinds (Event's kind field numbers); nil keeps all.
	Kinds map[protoreflect.FieldNumber]bool
}

// eventKinds are the fields of Event's kind oneof.
var eventKinds = (&bbsv1.Event{}).ProtoReflect().Descriptor().Oneofs().ByName("kind")

// EventKinds is the Kinds filter of the event kinds named (Event's kind field names); nil for
// none. An unknown name is InvalidArgument, naming kinds[i].
func EventKinds(names []string) (map[protoreflect.FieldNumber]bool, error) {
	if len(names) == 0 {
		return nil, nil
	}
	out := make(map[protoreflect.FieldNumber]bool, len(names))
	for i, n := range names {
		fd := eventKinds.Fields().ByName(protoreflect.Name(n))
		if fd == nil {
			return nil, rpcerr.Invalid(fmt.Sprintf("kinds[%d]", i), "unknown event kind %q", n)
		}
		out[fd.Number()] = true
	}
	return out, nil
}

// NewEventFilter builds a filter from the API's filter message; the selector was validated
// with the request.
func NewEventFilter(f *bbsv1.Filter) (EventFilter, error) {
	ef := EventFilter{Domain: f.GetDomain(), CellID: f.GetCellId()}
	if len(f.GetProcessGuids()) > 0 {
		ef.Guids = make(map[string]struct{}, len(f.GetProcessGuids()))
		for _, g := range f.GetProcessGuids() {
			ef.Guids[g] = struct{}{}
		}
	}
	sel, err := labels.Parse(f.GetLabelSelector())
	if err != nil {
		return ef, rpcerr.Invalid("filter.label_selector", "%v", err)
	}
	ef.Selector = sel
	return ef, nil
}

func (f EventFilter) empty() bool {
	return f.Domain == "" && f.Guids == nil && f.CellID == "" && f.Selector.Empty() && f.Kinds == nil
}

// broadcastOnly reports whether f follows a cell but keeps none of the kinds indexed by cell
// (cellIndexedKinds): every event it keeps then passes every cell filter, as a rep's
// subscription to links and log drains does, and it needs only the ring's broadcast
// revisions (hub.sinceBroadcast).
func (f EventFilter) broadcastOnly() bool {
	if f.CellID == "" || f.Kinds == nil {
		return false
	}
	for k, on := range f.Kinds {
		if on && cellIndexedKinds[k] {
			return false
		}
	}
	return true
}

// kept reports whether e's kind passes the Kinds filter.
func (f EventFilter) kept(e *bbsv1.Event) bool {
	if f.Kinds == nil {
		return true
	}
	fd := e.ProtoReflect().WhichOneof(eventKinds)
	return fd != nil && f.Kinds[fd.Number()]
}

// selects reports whether one of an event's label sets matches the selector.
func (f EventFilter) selects(sets labelSets) bool {
	if f.Selector.Empty() {
		return true
	}
	for _, l := range sets {
		if f.Selector.Matches(l) {
			return true
		}
	}
	return false
}

func (f EventFilter) matchRecord(domain, guid, cell string) bool {
	if f.Domain != "" && f.Domain != domain {
		return false
	}
	if f.Guids != nil {
		if _, ok := f.Guids[guid]; !ok {
			return false
		}
	}
	return f.CellID == "" || f.CellID == cell
}

// Match reports whether e, whose label sets are sets, passes the filter; a change matches if
// either side does.
func (f EventFilter) Match(e *bbsv1.Event, sets labelSets) bool {
	if f.empty() {
		return true
	}
	if !f.kept(e) || !f.selects(sets) {
		return false
	}
	desired := func(d *modelsv1.DesiredLRP) bool {
		return d != nil && f.matchRecord(d.GetDomain(), d.GetProcessGuid(), "")
	}
	actual := func(a *modelsv1.ActualLRP) bool {
		return a != nil && f.matchRecord(a.GetKey().GetDomain(), a.GetKey().GetProcessGuid(), a.GetInstanceKey().GetCellId())
	}
	task := func(t *modelsv1.Task) bool {
		return t != nil && f.matchRecord(t.GetDomain(), t.GetTaskGuid(), t.GetCellId())
	}
	cell := func(c *modelsv1.CellPresence) bool {
		return c != nil && f.Domain == "" && f.Guids == nil && (f.CellID == "" || f.CellID == c.GetCellId())
	}
	switch k := e.GetKind().(type) {
	case *bbsv1.Event_DesiredLrpCreated:
		return desired(k.DesiredLrpCreated.GetDesiredLrp())
	case *bbsv1.Event_DesiredLrpChanged:
		c := k.DesiredLrpChanged
		if f.CellID != "" && !slices.Equal(c.GetBefore().GetLogDrains(), c.GetAfter().GetLogDrains()) {
			// A change of log drains concerns every cell that may run the LRP (its reps switch
			// the drains of its instances), so a cell filter keeps it, as it keeps LinksChanged.
			return f.matchRecord(c.GetAfter().GetDomain(), c.GetAfter().GetProcessGuid(), f.CellID)
		}
		return desired(c.GetBefore()) || desired(c.GetAfter())
	case *bbsv1.Event_DesiredLrpRemoved:
		return desired(k.DesiredLrpRemoved.GetDesiredLrp())
	case *bbsv1.Event_ActualLrpCreated:
		return actual(k.ActualLrpCreated.GetActualLrp())
	case *bbsv1.Event_ActualLrpChanged:
		return actual(k.ActualLrpChanged.GetBefore()) || actual(k.ActualLrpChanged.GetAfter())
	case *bbsv1.Event_ActualLrpRemoved:
		return actual(k.ActualLrpRemoved.GetActualLrp())
	case *bbsv1.Event_ActualLrpCrashed:
		c := k.ActualLrpCrashed
		return f.matchRecord(c.GetKey().GetDomain(), c.GetKey().GetProcessGuid(), c.GetInstanceKey().GetCellId())
	case *bbsv1.Event_TaskCreated:
		return task(k.TaskCreated.GetTask())
	case *bbsv1.Event_TaskChanged:
		return task(k.TaskChanged.GetBefore()) || task(k.TaskChanged.GetAfter())
	case *bbsv1.Event_TaskRemoved:
		return task(k.TaskRemoved.GetTask())
	case *bbsv1.Event_CellAppeared:
		return cell(k.CellAppeared.GetCell())
	case *bbsv1.Event_CellDisappeared:
		return cell(k.CellDisappeared.GetCell())
	case *bbsv1.Event_LinksChanged:
		// A consumer's links concern every cell that may run it, so a cell filter keeps them.
		l := k.LinksChanged
		return f.matchRecord(l.GetDomain(), l.GetProcessGuid(), f.CellID)
	}
	return false
}

// filterEvents returns the events of b that f keeps (b's own slice when all pass).
func (f EventFilter) filterEvents(b batch) []*bbsv1.Event {
	if f.empty() {
		return b.events
	}
	var out []*bbsv1.Event
	for i, e := range b.events {
		var sets labelSets
		if i < len(b.labels) {
			sets = b.labels[i]
		}
		if f.Match(e, sets) {
			out = append(out, e)
		}
	}
	return out
}
