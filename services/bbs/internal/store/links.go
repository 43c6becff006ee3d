package store

import (
	"errors"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/links"
)

// linkState is the last LRP-wide resolution of one consumer, as its digest.
type linkState struct {
	digest  string
	errs    []string
	sources []string
}

// linkTracker keeps the link index of the cached desired LRPs and every consumer's last
// resolution, so each revision re-resolves only the consumers it can affect and publishes a
// LinksChanged event for each whose resolution changed. It is guarded by the cache's lock.
type linkTracker struct {
	idx  *links.Index
	last map[string]linkState
	// dependents maps a provider guid to the consumers whose last resolution used it.
	dependents map[string]map[string]struct{}
}

func newLinkTracker() *linkTracker {
	return &linkTracker{idx: links.NewIndex(), last: map[string]linkState{}, dependents: map[string]map[string]struct{}{}}
}

func instancesIn(st *state) links.Instances {
	return func(guid string) []*modelsv1.ActualLRP {
		m := st.actual[guid]
		out := make([]*modelsv1.ActualLRP, 0, len(m))
		for _, it := range m {
			out = append(out, it.msg.(*modelsv1.ActualLRP))
		}
		return out
	}
}

func running(m proto.Message) bool {
	a, _ := m.(*modelsv1.ActualLRP)
	return a.GetState() == modelsv1.ActualLRP_STATE_RUNNING
}

// runLRP is the link view of a run info.
func runLRP(r *modelsv1.DesiredLRPRunInfo) links.LRP {
	return links.LRP{Guid: r.GetProcessGuid(), Domain: r.GetDomain(), Ports: r.GetPorts(), Links: r.GetLinks()}
}

// reset rebuilds the tracker from a full state, without events.
func (lt *linkTracker) reset(st *state) {
	*lt = *newLinkTracker()
	for _, it := range st.run {
		lt.idx.Put(runLRP(it.msg.(*modelsv1.DesiredLRPRunInfo)))
	}
	memo := links.NewMemo()
	for _, g := range lt.idx.Consumers() {
		lt.resolve(st, g, memo)
	}
}

// resolve recomputes the LRP-wide resolution of consumer g, records it and returns it with the
// previous one (ok is false when there was none).
func (lt *linkTracker) resolve(st *state, g string, memo *links.Memo) (now, before linkState, ok bool) {
	before, ok = lt.last[g]
	for _, p := range before.sources {
		delete(lt.dependents[p], g)
	}
	res, err := lt.idx.ResolveMemo(*lt.idx.LRP(g), instancesIn(st), "", memo)
	now = linkState{digest: res.Digest, sources: res.Sources}
	var le *links.Error
	if errors.As(err, &le) {
		now.errs = le.Lines()
	}
	for _, p := range now.sources {
		if lt.dependents[p] == nil {
			lt.dependents[p] = map[string]struct{}{}
		}
		lt.dependents[p][g] = struct{}{}
	}
	lt.last[g] = now
	return now, before, ok
}

// forget drops a consumer that left the index.
func (lt *linkTracker) forget(g string) {
	for _, p := range lt.last[g].sources {
		delete(lt.dependents[p], g)
	}
	delete(lt.last, g)
}

// apply takes the changes of one revision (already applied to st) and returns the
// LinksChanged events they cause, ordered by consumer guid.
func (lt *linkTracker) apply(st *state, changes []change) []*bbsv1.Event {
	affected := map[string]struct{}{}
	mark := func(gs []string) {
		for _, g := range gs {
			affected[g] = struct{}{}
		}
	}
	for _, c := range changes {
		switch c.key.kind {
		case kindRun:
			// A provider or consumer came or went: the consumers it can concern are re-resolved,
			// before (for what it provided) and after (for what it provides).
			if r, _ := c.before.(*modelsv1.DesiredLRPRunInfo); r != nil {
				mark(lt.idx.Affected(runLRP(r)))
			}
			if r, _ := c.after.(*modelsv1.DesiredLRPRunInfo); r != nil {
				lt.idx.Put(runLRP(r))
				mark(lt.idx.Affected(runLRP(r)))
			} else {
				lt.idx.Delete(c.key.id)
				lt.forget(c.key.id)
				delete(affected, c.key.id)
			}
		case kindActual:
			// Nodes are RUNNING instances: a change on neither side RUNNING changes none.
			if running(c.before) || running(c.after) {
				mark(slices.Collect(maps.Keys(lt.dependents[c.key.id])))
			}
		}
	}
	guids := make([]string, 0, len(affected))
	for g := range affected {
		if l := lt.idx.LRP(g); l != nil && len(l.Links.GetConsumes()) > 0 {
			guids = append(guids, g)
		}
	}
	slices.Sort(guids)
	var out []*bbsv1.Event
	memo := links.NewMemo()
	for _, g := range guids {
		now, before, ok := lt.resolve(st, g, memo)
		if !ok || now.digest == before.digest {
			continue
		}
		out = append(out, &bbsv1.Event{Kind: &bbsv1.Event_LinksChanged{LinksChanged: &bbsv1.LinksChanged{
			ProcessGuid: g,
			Domain:      lt.idx.LRP(g).Domain,
			Errors:      now.errs,
		}}})
	}
	return out
}

// linkEvents returns the LinksChanged events of one revision, stamped with it.
func (s *Store) linkEvents(rev int64, st *state, changes []change) []*bbsv1.Event {
	evs := s.links.apply(st, changes)
	for _, e := range evs {
		e.Revision = rev
	}
	return evs
}

// CheckLinks resolves the links of l as if l were stored (so an LRP may consume what it
// provides itself) and returns the *links.Error of those that do not resolve.
func (s *Store) CheckLinks(l links.LRP) error {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	lt := s.links
	prev := lt.idx.LRP(l.Guid)
	lt.idx.Put(l)
	err := lt.idx.Check(l)
	if prev != nil {
		lt.idx.Put(*prev)
	} else {
		lt.idx.Delete(l.Guid)
	}
	return err
}

// LinkConsumersOf returns the other desired LRPs whose links resolve to a link guid provides.
func (s *Store) LinkConsumersOf(guid string) []string {
	var out []string
	s.cache.read(func(*state, int64) { out = s.links.idx.ConsumersOf(guid) })
	return out
}

// LinkResolution is a consumer's resolution read from the cache.
type LinkResolution struct {
	// LRP is the consumer's link view.
	LRP links.LRP
	// Resolution is the resolution for the requested cell ("" for the LRP-wide view).
	Resolution links.Resolution
	// Err is the *links.Error of the links that do not resolve, or nil.
	Err error
	// Instances resolves each consumer instance placed on a cell, when asked.
	Instances []InstanceResolution
	// Revision is the revision read.
	Revision int64
}

// InstanceResolution is the resolution for one consumer instance placed on a cell.
type InstanceResolution struct {
	// Index is the instance index.
	Index int32
	// InstanceGuid identifies the container.
	InstanceGuid string
	// CellID is the cell it runs on.
	CellID string
	// Resolution is the instance's resolution.
	Resolution links.Resolution
	// Err is the *links.Error of the links that do not resolve, or nil.
	Err error
}

// ResolveLinks resolves the links of the desired LRP guid for cellID ("" for the LRP-wide
// view) and, when perInstance, for each of its instances placed on a cell. ok is false when the
// LRP is not desired.
func (s *Store) ResolveLinks(guid, cellID string, perInstance bool) (out LinkResolution, ok bool) {
	s.cache.read(func(st *state, rev int64) {
		out.Revision = rev
		it, found := st.run[guid]
		if !found {
			return
		}
		ok = true
		out.LRP = runLRP(it.msg.(*modelsv1.DesiredLRPRunInfo))
		inst := instancesIn(st)
		out.Resolution, out.Err = s.links.idx.Resolve(out.LRP, inst, cellID)
		if !perInstance {
			return
		}
		for _, sl := range sortedSlots(st.actual[guid]) {
			a := st.actual[guid][sl].msg.(*modelsv1.ActualLRP)
			cell := a.GetInstanceKey().GetCellId()
			if cell == "" {
				continue
			}
			ir := InstanceResolution{Index: a.GetKey().GetIndex(), InstanceGuid: a.GetInstanceKey().GetInstanceGuid(), CellID: cell}
			ir.Resolution, ir.Err = s.links.idx.Resolve(out.LRP, inst, cell)
			out.Instances = append(out.Instances, ir)
		}
	})
	return out, ok
}
