// Package table computes Gavel's routing table: it joins the cf-router routes of desired LRPs
// with their RUNNING, routable instances into routes keyed by protocol and hostname or incoming
// port, and reports what changed since the last commit. It is not safe for concurrent use; the
// route-emitter's syncer owns it.
package table

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/routing/cfrouter"
)

// Key identifies a route: an HTTP hostname, or a TCP or UDP incoming port.
type Key struct {
	// Protocol is the route's protocol.
	Protocol routeemitterv1.Route_Protocol
	// Hostname is the lower-cased HTTP hostname (HTTP only).
	Hostname string
	// IncomingPort is the router port (TCP and UDP only).
	IncomingPort uint32
}

// KeyOf returns the key of r.
func KeyOf(r *routeemitterv1.Route) Key {
	return Key{Protocol: r.GetProtocol(), Hostname: r.GetHostname(), IncomingPort: r.GetIncomingPort()}
}

// Compare orders keys by protocol, hostname and incoming port, as the table is sent.
func (k Key) Compare(o Key) int {
	if c := cmp.Compare(k.Protocol, o.Protocol); c != 0 {
		return c
	}
	if c := strings.Compare(k.Hostname, o.Hostname); c != 0 {
		return c
	}
	return cmp.Compare(k.IncomingPort, o.IncomingPort)
}

// String describes the key for logs.
func (k Key) String() string {
	if k.Protocol == routeemitterv1.Route_PROTOCOL_HTTP {
		return "http:" + k.Hostname
	}
	return fmt.Sprintf("%s:%d", strings.ToLower(strings.TrimPrefix(k.Protocol.String(), "PROTOCOL_")), k.IncomingPort)
}

// Removal is a route carrying only k, as a removal is sent.
func (k Key) Removal() *routeemitterv1.Route {
	return &routeemitterv1.Route{Protocol: k.Protocol, Hostname: k.Hostname, IncomingPort: k.IncomingPort}
}

// Delta is what changed in the table between two commits. Routes in it are never modified
// afterwards, so they may be shared and sent concurrently.
type Delta struct {
	// Upserts are routes that appeared or changed, whole, ordered by key.
	Upserts []*routeemitterv1.Route
	// Removals are routes that disappeared (key fields only), ordered by key.
	Removals []*routeemitterv1.Route
}

// Empty reports whether nothing changed.
func (d Delta) Empty() bool { return len(d.Upserts) == 0 && len(d.Removals) == 0 }

// slot names one instance record of a process: its index and presence.
type slot struct {
	index    int32
	presence modelsv1.ActualLRP_Presence
}

// desired is what the table keeps of a desired LRP: its cf-router document and its entries.
type desired struct {
	doc     []byte
	entries []cfrouter.Entry
}

// contribution is what one process adds to one route.
type contribution struct {
	tlsOnly   bool
	endpoints []*routeemitterv1.Endpoint
}

// Table is the routing table and the inputs it is computed from. Mutations mark the affected
// process guids dirty; Commit recomputes only those and returns the delta.
type Table struct {
	log     hclog.Logger
	desired map[string]*desired
	actual  map[string]map[slot]*modelsv1.ActualLRP
	contrib map[string]map[Key]*contribution // process guid → its routes
	owners  map[Key]map[string]struct{}      // route → process guids contributing
	routes  map[Key]*routeemitterv1.Route
	dirty   map[string]struct{}
	invalid int
}

// New returns an empty table; bad routes documents are logged to logger.
func New(logger hclog.Logger) *Table {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Table{
		log:     logger,
		desired: map[string]*desired{},
		actual:  map[string]map[slot]*modelsv1.ActualLRP{},
		contrib: map[string]map[Key]*contribution{},
		owners:  map[Key]map[string]struct{}{},
		routes:  map[Key]*routeemitterv1.Route{},
		dirty:   map[string]struct{}{},
	}
}

// SetDesired records the routes of a desired LRP (created or changed). Only the cf-router
// document matters; it is parsed again only when its bytes change, and a bad one is logged
// once and gives the LRP no routes.
func (t *Table) SetDesired(guid string, routes map[string][]byte) {
	doc := routes[cfrouter.Provider]
	if d, ok := t.desired[guid]; ok && bytes.Equal(d.doc, doc) {
		return
	}
	d := &desired{doc: doc}
	if len(bytes.TrimSpace(doc)) > 0 {
		entries, err := cfrouter.Parse(doc)
		if err != nil {
			t.log.Warn("ignoring the routes of a desired LRP", "process_guid", guid, "provider", cfrouter.Provider, "error", err)
		}
		d.entries = entries
	}
	if old, ok := t.desired[guid]; ok && old.invalid() {
		t.invalid--
	}
	if d.invalid() {
		t.invalid++
	}
	t.desired[guid] = d
	t.dirty[guid] = struct{}{}
}

// invalid reports whether d's document was refused.
func (d *desired) invalid() bool { return len(bytes.TrimSpace(d.doc)) > 0 && d.entries == nil }

// RemoveDesired forgets a desired LRP; its routes go at the next commit.
func (t *Table) RemoveDesired(guid string) {
	d, ok := t.desired[guid]
	if !ok {
		return
	}
	if d.invalid() {
		t.invalid--
	}
	delete(t.desired, guid)
	t.dirty[guid] = struct{}{}
}

// SetActual records an instance record (created or changed).
func (t *Table) SetActual(a *modelsv1.ActualLRP) {
	guid := a.GetKey().GetProcessGuid()
	s := slot{index: a.GetKey().GetIndex(), presence: a.GetPresence()}
	m := t.actual[guid]
	if m == nil {
		m = map[slot]*modelsv1.ActualLRP{}
		t.actual[guid] = m
	}
	old := m[s]
	m[s] = a
	if routingChanged(old, a) {
		t.dirty[guid] = struct{}{}
	}
}

// RemoveActual forgets an instance record.
func (t *Table) RemoveActual(a *modelsv1.ActualLRP) {
	guid := a.GetKey().GetProcessGuid()
	s := slot{index: a.GetKey().GetIndex(), presence: a.GetPresence()}
	m := t.actual[guid]
	old, ok := m[s]
	if !ok {
		return
	}
	delete(m, s)
	if len(m) == 0 {
		delete(t.actual, guid)
	}
	if routable(old) {
		t.dirty[guid] = struct{}{}
	}
}

// Listing is one full listing of the BBS indexed by process: its desired LRPs' routes and its
// instance records grouped by slot, as Replace and ReplaceProcess take it. Building it reads no
// table, so a periodic listing is indexed beside the event loop, and the loop only compares and
// swaps.
type Listing struct {
	routes    map[string]map[string][]byte // process guid → its desired LRP's routes
	byProcess map[string]map[slot]*modelsv1.ActualLRP
}

// NewListing indexes a listing's scheduling infos and instance records by process.
func NewListing(infos []*modelsv1.DesiredLRPSchedulingInfo, actuals []*modelsv1.ActualLRP) Listing {
	l := Listing{routes: make(map[string]map[string][]byte, len(infos)), byProcess: map[string]map[slot]*modelsv1.ActualLRP{}}
	for _, d := range infos {
		l.routes[d.GetProcessGuid()] = d.GetRoutes()
	}
	for _, a := range actuals {
		guid := a.GetKey().GetProcessGuid()
		m := l.byProcess[guid]
		if m == nil {
			m = map[slot]*modelsv1.ActualLRP{}
			l.byProcess[guid] = m
		}
		m[slot{index: a.GetKey().GetIndex(), presence: a.GetPresence()}] = a
	}
	return l
}

// Processes returns every process guid that l or the table names, each once, in no
// particular order: what Replace goes through, and what ReplaceProcess is asked about when a
// listing is swapped in a part at a time.
func (t *Table) Processes(l Listing) []string {
	seen := make(map[string]struct{}, len(l.routes)+len(l.byProcess))
	out := make([]string, 0, len(l.routes)+len(l.byProcess))
	add := func(guid string) {
		if _, ok := seen[guid]; !ok {
			seen[guid] = struct{}{}
			out = append(out, guid)
		}
	}
	for guid := range l.routes {
		add(guid)
	}
	for guid := range l.byProcess {
		add(guid)
	}
	for guid := range t.desired {
		add(guid)
	}
	for guid := range t.actual {
		add(guid)
	}
	return out
}

// Replace swaps every input for a full listing, marking dirty only the processes whose routes
// document or routable instances differ, so the next commit is the difference between the old
// table and the listed one. The table keeps l's maps; a listing is replaced once.
func (t *Table) Replace(l Listing) {
	for _, guid := range t.Processes(l) {
		t.ReplaceProcess(l, guid)
	}
}

// ReplaceProcess swaps process guid's inputs (its routes document and its instance records)
// for l's, marking it dirty only if its routes can differ. A listing may be swapped in this
// way a few processes at a time, with events applied in between: each process is then exact
// once its own events newer than the listing are applied again on top of it.
func (t *Table) ReplaceProcess(l Listing, guid string) {
	if routes, ok := l.routes[guid]; ok {
		t.SetDesired(guid, routes)
	} else {
		t.RemoveDesired(guid)
	}
	next, old := l.byProcess[guid], t.actual[guid]
	if instancesDiffer(old, next) {
		t.dirty[guid] = struct{}{}
	}
	if len(next) == 0 {
		delete(t.actual, guid)
	} else {
		t.actual[guid] = next
	}
}

// instancesDiffer reports whether two sets of records of one process route differently.
func instancesDiffer(a, b map[slot]*modelsv1.ActualLRP) bool {
	for s, x := range a {
		if routingChanged(x, b[s]) {
			return true
		}
	}
	for s, y := range b {
		if _, ok := a[s]; !ok && routable(y) {
			return true
		}
	}
	return false
}

// routable reports whether an instance receives traffic: RUNNING (in any presence — evacuating
// and suspect copies keep routing until removed), routable, with an address.
func routable(a *modelsv1.ActualLRP) bool {
	return a != nil && a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetRoutable() && a.GetNetInfo().GetAddress() != ""
}

// routingChanged reports whether replacing old by new can change any route: whether one is
// routable and the other not, or both are and they differ in what compute reads of a record
// (its instance, the cell's address, the port mappings; index and presence are the slot's).
// It compares those fields directly: a periodic listing asks it of every instance, and
// reflection (proto.Equal) was a third of that listing's time on the event loop.
func routingChanged(old, new *modelsv1.ActualLRP) bool {
	ro, rn := routable(old), routable(new)
	if !ro && !rn {
		return false
	}
	if ro != rn {
		return true
	}
	on, nn := old.GetNetInfo(), new.GetNetInfo()
	return old.GetInstanceKey().GetInstanceGuid() != new.GetInstanceKey().GetInstanceGuid() ||
		on.GetAddress() != nn.GetAddress() ||
		!slices.EqualFunc(on.GetPorts(), nn.GetPorts(), func(a, b *modelsv1.PortMapping) bool {
			return a.GetContainerPort() == b.GetContainerPort() && a.GetHostPort() == b.GetHostPort()
		})
}

// Dirty reports how many processes wait for the next commit.
func (t *Table) Dirty() int { return len(t.dirty) }

// Invalid reports how many desired LRPs have a refused cf-router document.
func (t *Table) Invalid() int { return t.invalid }

// Len is the number of routes.
func (t *Table) Len() int { return len(t.routes) }

// dirtyKept is the most dirty processes whose map Commit clears for reuse; a larger one is
// dropped for a new one.
const dirtyKept = 256

// Commit recomputes the routes of every dirty process and returns what changed since the last
// commit.
func (t *Table) Commit() Delta {
	if len(t.dirty) == 0 {
		return Delta{}
	}
	changed := map[Key]struct{}{}
	for guid := range t.dirty {
		old := t.contrib[guid]
		next := t.compute(guid)
		for k := range old {
			changed[k] = struct{}{}
			if _, ok := next[k]; !ok {
				delete(t.owners[k], guid)
				if len(t.owners[k]) == 0 {
					delete(t.owners, k)
				}
			}
		}
		for k := range next {
			changed[k] = struct{}{}
			o := t.owners[k]
			if o == nil {
				o = map[string]struct{}{}
				t.owners[k] = o
			}
			o[guid] = struct{}{}
		}
		if len(next) == 0 {
			delete(t.contrib, guid)
		} else {
			t.contrib[guid] = next
		}
	}
	if len(t.dirty) > dirtyKept {
		// A map keeps the room it grew to, and ranging over it walks all of that room: after a
		// listing dirtied every process, every event's commit would walk them all again.
		t.dirty = map[string]struct{}{}
	} else {
		clear(t.dirty)
	}
	var d Delta
	for k := range changed {
		r, old := t.merge(k), t.routes[k]
		switch {
		case r == nil && old != nil:
			delete(t.routes, k)
			d.Removals = append(d.Removals, k.Removal())
		case r != nil && !old.EqualVT(r): // generated: proto.Equal's reflection was a third of a commit
			t.routes[k] = r
			d.Upserts = append(d.Upserts, r)
		}
	}
	byKey := func(a, b *routeemitterv1.Route) int { return KeyOf(a).Compare(KeyOf(b)) }
	slices.SortFunc(d.Upserts, byKey)
	slices.SortFunc(d.Removals, byKey)
	return d
}

// compute is what process guid contributes to each route now.
func (t *Table) compute(guid string) map[Key]*contribution {
	d := t.desired[guid]
	instances := t.actual[guid]
	if d == nil || len(d.entries) == 0 || len(instances) == 0 {
		return nil
	}
	out := map[Key]*contribution{}
	add := func(k Key, ep *routeemitterv1.Endpoint, tlsOnly bool) {
		c := out[k]
		if c == nil {
			c = &contribution{}
			out[k] = c
		}
		c.tlsOnly = c.tlsOnly || tlsOnly
		c.endpoints = append(c.endpoints, ep)
	}
	for _, a := range instances {
		if !routable(a) {
			continue
		}
		for _, e := range d.entries {
			hostPort, ok := hostPortOf(a, e.Port)
			if !ok {
				continue
			}
			ep := &routeemitterv1.Endpoint{
				ProcessGuid:   guid,
				Index:         a.GetKey().GetIndex(),
				InstanceGuid:  a.GetInstanceKey().GetInstanceGuid(),
				Address:       a.GetNetInfo().GetAddress(),
				Port:          hostPort,
				ContainerPort: e.Port,
			}
			switch e.Protocol {
			case routeemitterv1.Route_PROTOCOL_HTTP:
				for _, h := range e.Hostnames {
					add(Key{Protocol: e.Protocol, Hostname: h}, ep, e.TLSOnly)
					if e.RouteToInstances {
						add(Key{Protocol: e.Protocol, Hostname: fmt.Sprintf("%d.%s", ep.Index, h)}, ep, e.TLSOnly)
					}
				}
			default:
				add(Key{Protocol: e.Protocol, IncomingPort: e.IncomingPort}, ep, false)
			}
		}
	}
	return out
}

// hostPortOf is the host port that reaches containerPort on a.
func hostPortOf(a *modelsv1.ActualLRP, containerPort uint32) (uint32, bool) {
	for _, p := range a.GetNetInfo().GetPorts() {
		if p.GetContainerPort() == containerPort && p.GetHostPort() != 0 {
			return p.GetHostPort(), true
		}
	}
	return 0, false
}

// merge builds route k from every process contributing to it; nil when it has no endpoint.
// The route is TLS-only when any contributor asks for it.
func (t *Table) merge(k Key) *routeemitterv1.Route {
	owners := t.owners[k]
	if len(owners) == 0 {
		return nil
	}
	r := k.Removal()
	for guid := range owners {
		c := t.contrib[guid][k]
		r.TlsOnly = r.TlsOnly || c.tlsOnly
		r.Endpoints = append(r.Endpoints, c.endpoints...)
	}
	slices.SortFunc(r.Endpoints, compareEndpoints)
	r.Endpoints = slices.CompactFunc(r.Endpoints, func(a, b *routeemitterv1.Endpoint) bool { return compareEndpoints(a, b) == 0 })
	if len(r.Endpoints) == 0 {
		return nil
	}
	return r
}

// compareEndpoints orders endpoints by process, index, instance, address and ports.
func compareEndpoints(a, b *routeemitterv1.Endpoint) int {
	return cmp.Or(
		strings.Compare(a.GetProcessGuid(), b.GetProcessGuid()),
		cmp.Compare(a.GetIndex(), b.GetIndex()),
		strings.Compare(a.GetInstanceGuid(), b.GetInstanceGuid()),
		strings.Compare(a.GetAddress(), b.GetAddress()),
		cmp.Compare(a.GetPort(), b.GetPort()),
		cmp.Compare(a.GetContainerPort(), b.GetContainerPort()),
	)
}

// Routes returns every route ordered by key.
func (t *Table) Routes() []*routeemitterv1.Route {
	out := make([]*routeemitterv1.Route, 0, len(t.routes))
	for _, r := range t.routes {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *routeemitterv1.Route) int { return KeyOf(a).Compare(KeyOf(b)) })
	return out
}
