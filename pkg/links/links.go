// Package links resolves the BOSH-style links LRPs provide and consume. It is pure: an Index of
// the desired LRPs' link declarations and a function giving each provider's instances are all
// it reads, so the BBS evaluates it from its cache and tests run it without etcd.
//
// A consumer names its provider with from (the provider's name, or its alias set with as, which
// hides the name; "domain.name" reaches a shared provider in another domain) or, without from,
// by type inside its own domain. Every failure of one LRP is collected into one *Error, one line
// per link.
package links

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Networks a consumer may choose; the default is NetworkHost when the provider offers it.
const (
	// NetworkHost addresses an instance by its cell's address and the host port of the link's
	// port.
	NetworkHost = "host"
	// NetworkInstance addresses an instance by its own address and the link's container port.
	NetworkInstance = "instance"
)

// LRP is the part of a desired LRP that links read.
type LRP struct {
	// Guid is the LRP's process guid.
	Guid string
	// Domain is the LRP's domain.
	Domain string
	// Ports are the LRP's container ports (those given a host port on the cell).
	Ports []uint32
	// Links are the LRP's link declarations.
	Links *modelsv1.Links
}

// FromDesired returns the link view of a desired LRP.
func FromDesired(d *modelsv1.DesiredLRP) LRP {
	return LRP{Guid: d.GetProcessGuid(), Domain: d.GetDomain(), Ports: d.GetPorts(), Links: d.GetLinks()}
}

// Instances returns the instance records of a provider (any order, any state, any presence).
type Instances func(guid string) []*modelsv1.ActualLRP

// provider is one provided link in the index.
type provider struct {
	lrp  *LRP
	link *modelsv1.LinkProvide
}

// exposed is the name consumers use: the alias when set.
func (p provider) exposed() string {
	if a := p.link.GetAs(); a != "" {
		return a
	}
	return p.link.GetName()
}

func (p provider) String() string {
	s := fmt.Sprintf("lrp %q link %q", p.lrp.Guid, p.link.GetName())
	if a := p.link.GetAs(); a != "" {
		s += fmt.Sprintf(" as %q", a)
	}
	return s
}

// Index holds the link declarations of desired LRPs, keyed for resolution. It is not safe for
// concurrent writes; readers may share it while nobody writes.
type Index struct {
	lrps   map[string]*LRP
	byName map[string][]provider // domain \x00 exposed name
	byType map[string][]provider // domain \x00 type
	hidden map[string][]provider // domain \x00 original name, for providers with an alias
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{
		lrps:   map[string]*LRP{},
		byName: map[string][]provider{},
		byType: map[string][]provider{},
		hidden: map[string][]provider{},
	}
}

// IndexOf builds an index of lrps.
func IndexOf(lrps ...LRP) *Index {
	x := NewIndex()
	for _, l := range lrps {
		x.Put(l)
	}
	return x
}

func key(domain, name string) string { return domain + "\x00" + name }

// Put adds or replaces an LRP. LRPs that neither provide nor consume links are not kept.
func (x *Index) Put(l LRP) {
	x.Delete(l.Guid)
	if len(l.Links.GetProvides()) == 0 && len(l.Links.GetConsumes()) == 0 {
		return
	}
	lp := &l
	x.lrps[l.Guid] = lp
	for _, pl := range l.Links.GetProvides() {
		p := provider{lrp: lp, link: pl}
		x.byName[key(l.Domain, p.exposed())] = append(x.byName[key(l.Domain, p.exposed())], p)
		x.byType[key(l.Domain, pl.GetType())] = append(x.byType[key(l.Domain, pl.GetType())], p)
		if pl.GetAs() != "" {
			x.hidden[key(l.Domain, pl.GetName())] = append(x.hidden[key(l.Domain, pl.GetName())], p)
		}
	}
}

// Delete removes an LRP.
func (x *Index) Delete(guid string) {
	old := x.lrps[guid]
	if old == nil {
		return
	}
	delete(x.lrps, guid)
	drop := func(m map[string][]provider, k string) {
		kept := slices.DeleteFunc(m[k], func(p provider) bool { return p.lrp.Guid == guid })
		if len(kept) == 0 {
			delete(m, k)
		} else {
			m[k] = kept
		}
	}
	for _, pl := range old.Links.GetProvides() {
		p := provider{lrp: old, link: pl}
		drop(x.byName, key(old.Domain, p.exposed()))
		drop(x.byType, key(old.Domain, pl.GetType()))
		drop(x.hidden, key(old.Domain, pl.GetName()))
	}
}

// LRP returns the indexed LRP with guid, or nil.
func (x *Index) LRP(guid string) *LRP { return x.lrps[guid] }

// Consumers returns the guids of indexed LRPs that consume at least one link, sorted.
func (x *Index) Consumers() []string {
	var out []string
	for g, l := range x.lrps {
		if len(l.Links.GetConsumes()) > 0 {
			out = append(out, g)
		}
	}
	sort.Strings(out)
	return out
}

// Affected returns the guids of the indexed consumers whose resolution adding, changing or
// removing l can change, sorted: l itself when it consumes, and, when l provides links, every
// consumer in l's domain and every consumer naming a provider across domains.
func (x *Index) Affected(l LRP) []string {
	provides := len(l.Links.GetProvides()) > 0
	var out []string
	for g, c := range x.lrps {
		if len(c.Links.GetConsumes()) == 0 {
			continue
		}
		if g == l.Guid || (provides && (c.Domain == l.Domain || crossDomain(c))) {
			out = append(out, g)
		}
	}
	sort.Strings(out)
	return out
}

func crossDomain(c *LRP) bool {
	for _, cl := range c.Links.GetConsumes() {
		if strings.Contains(cl.GetFrom(), ".") {
			return true
		}
	}
	return false
}

// ConsumersOf returns the guids of the other LRPs whose links resolve to a link guid provides,
// sorted.
func (x *Index) ConsumersOf(guid string) []string {
	var out []string
	for _, g := range x.Consumers() {
		if g == guid {
			continue
		}
		for _, c := range x.lrps[g].Links.GetConsumes() {
			if p, err := x.find(x.lrps[g], c); err == nil && p != nil && p.lrp.Guid == guid {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// Failure is one link of a consumer that does not resolve.
type Failure struct {
	// Index is the link's position in the consumer's consumes.
	Index int
	// Link is the consumed link's name.
	Link string
	// Reason says why it does not resolve.
	Reason string
}

// String is the failure's line in an Error.
func (f Failure) String() string { return fmt.Sprintf("link %q: %s", f.Link, f.Reason) }

// Error lists every link of one consumer that does not resolve.
type Error struct {
	// Guid is the consumer's process guid.
	Guid string
	// Failures are the links that do not resolve, in declaration order.
	Failures []Failure
}

// Error is a header line and one line per failure, BOSH-style.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cannot resolve links of desired lrp %q:", e.Guid)
	for _, f := range e.Failures {
		b.WriteString("\n  - ")
		b.WriteString(f.String())
	}
	return b.String()
}

// Lines returns one line per failure.
func (e *Error) Lines() []string {
	out := make([]string, len(e.Failures))
	for i, f := range e.Failures {
		out[i] = f.String()
	}
	return out
}

// Resolution is a consumer's resolved links.
type Resolution struct {
	// Links maps each consumed link name to its resolution; optional links without a provider
	// are absent.
	Links map[string]*modelsv1.ResolvedLink
	// Sources are the guids of the providers the links resolved to, sorted and distinct.
	Sources []string
	// Digest identifies the resolution (with its failures): equal digests, equal resolutions.
	// Only ResolveMemo computes it.
	Digest string
}

// linkError is a failure's reason.
type linkError struct {
	reason   string
	notFound bool
}

func (e *linkError) Error() string { return e.reason }

func notFound(format string, args ...any) *linkError {
	return &linkError{reason: fmt.Sprintf(format, args...), notFound: true}
}

func failed(format string, args ...any) *linkError {
	return &linkError{reason: fmt.Sprintf(format, args...)}
}

// Resolve resolves the links c consumes. cellID, when set, resolves colocated links for a
// consumer instance on that cell (each gets the single node of the provider instance there);
// when empty, a colocated link lists every provider node. A required link that does not resolve
// is a failure in the returned *Error; the links that do resolve are returned beside it.
func (x *Index) Resolve(c LRP, instances Instances, cellID string) (Resolution, error) {
	return x.ResolveMemo(c, instances, cellID, nil)
}

// Memo shares the nodes of one provider between the consumers resolved with it, for callers
// that resolve many consumers over one unchanging snapshot (the BBS after each revision). The
// resolutions it produces share their nodes: callers must not modify them.
type Memo struct {
	nodes map[memoKey]memoNodes
}

type memoKey struct {
	guid, link, network, cell string
}

type memoNodes struct {
	nodes  []*modelsv1.LinkNode
	digest string
}

// NewMemo returns an empty memo; use one per snapshot.
func NewMemo() *Memo { return &Memo{nodes: map[memoKey]memoNodes{}} }

// ResolveMemo is Resolve sharing provider nodes through memo (nil: no sharing).
func (x *Index) ResolveMemo(c LRP, instances Instances, cellID string, memo *Memo) (Resolution, error) {
	res := Resolution{Links: map[string]*modelsv1.ResolvedLink{}}
	var e Error
	e.Guid = c.Guid
	sources := map[string]struct{}{}
	var digest strings.Builder
	for i, cl := range c.Links.GetConsumes() {
		rl, src, d, err := x.resolveOne(&c, cl, instances, cellID, memo)
		if err != nil {
			if err.notFound && cl.GetOptional() {
				continue
			}
			e.Failures = append(e.Failures, Failure{Index: i, Link: cl.GetName(), Reason: err.reason})
			if memo != nil {
				fmt.Fprintf(&digest, "%q!%q;", cl.GetName(), err.reason)
			}
			continue
		}
		if memo != nil {
			fmt.Fprintf(&digest, "%q=%s;", cl.GetName(), d)
		}
		res.Links[cl.GetName()] = rl
		if src != "" {
			sources[src] = struct{}{}
		}
	}
	for s := range sources {
		res.Sources = append(res.Sources, s)
	}
	sort.Strings(res.Sources)
	res.Digest = digest.String()
	if len(e.Failures) > 0 {
		return res, &e
	}
	return res, nil
}

// Check resolves c's links against the declarations only (instances do not matter to whether
// a link resolves) and returns the *Error of those that do not.
func (x *Index) Check(c LRP) error {
	_, err := x.Resolve(c, func(string) []*modelsv1.ActualLRP { return nil }, "")
	return err
}

// resolveOne resolves one consumed link and returns it with its provider's guid (empty for a
// custom link) and a digest of the resolution.
func (x *Index) resolveOne(c *LRP, cl *modelsv1.LinkConsume, instances Instances, cellID string, memo *Memo) (*modelsv1.ResolvedLink, string, string, *linkError) {
	if cu := cl.GetCustom(); cu != nil {
		if len(cu.GetNodes()) == 0 {
			return nil, "", "", failed("custom link has no nodes")
		}
		out := &modelsv1.ResolvedLink{Properties: maps.Clone(cu.GetProperties())}
		for _, n := range cu.GetNodes() {
			out.Nodes = append(out.Nodes, cloneNode(n))
		}
		if out.Properties == nil {
			out.Properties = map[string]string{}
		}
		if memo == nil {
			return out, "", "", nil
		}
		return out, "", "custom" + nodesDigest(out.Nodes) + propsDigest(out.Properties), nil
	}
	p, err := x.find(c, cl)
	if err != nil {
		return nil, "", "", err
	}
	network, err := chooseNetwork(p, cl.GetNetwork())
	if err != nil {
		return nil, "", "", err
	}
	out := &modelsv1.ResolvedLink{Properties: maps.Clone(p.link.GetProperties())}
	if out.Properties == nil {
		out.Properties = map[string]string{}
	}
	cell := ""
	if cl.GetColocated() {
		cell = cellID
	}
	k := memoKey{guid: p.lrp.Guid, link: p.link.GetName(), network: network, cell: cell}
	m, ok := memoNodes{}, false
	if memo != nil {
		m, ok = memo.nodes[k]
	}
	if !ok {
		for _, a := range running(instances(p.lrp.Guid)) {
			if cell != "" && a.GetInstanceKey().GetCellId() != cell {
				continue
			}
			m.nodes = append(m.nodes, node(p, network, a))
		}
		if memo != nil {
			m.digest = nodesDigest(m.nodes)
			memo.nodes[k] = m
		}
	}
	d := ""
	if memo != nil {
		d = p.lrp.Guid + "/" + p.link.GetName() + "/" + network + "/" + cell + m.digest + propsDigest(out.Properties)
	}
	if cell != "" {
		if len(m.nodes) > 0 {
			out.Node = m.nodes[0]
		}
		return out, p.lrp.Guid, d, nil
	}
	out.Nodes = m.nodes
	return out, p.lrp.Guid, d, nil
}

func nodesDigest(ns []*modelsv1.LinkNode) string {
	var b strings.Builder
	for _, n := range ns {
		fmt.Fprintf(&b, "[%q %q %d %q %q]", n.GetName(), n.GetId(), n.GetIndex(), n.GetAz(), n.GetAddress())
	}
	return b.String()
}

func propsDigest(p map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(p)) {
		fmt.Fprintf(&b, "%q=%q,", k, p[k])
	}
	return b.String()
}

// find picks the provider a consumed link refers to.
func (x *Index) find(c *LRP, cl *modelsv1.LinkConsume) (*provider, *linkError) {
	from := cl.GetFrom()
	if from == "" {
		if cl.GetCustom() != nil {
			return nil, nil
		}
		return x.byTypeIn(c.Domain, cl.GetType())
	}
	// "domain.name" reaches another domain, unless the whole of from is a name in this one.
	domain, name := c.Domain, from
	if i := strings.LastIndexByte(from, '.'); i > 0 && len(x.byName[key(c.Domain, from)]) == 0 {
		domain, name = from[:i], from[i+1:]
	}
	cands := x.byName[key(domain, name)]
	if len(cands) == 0 {
		if hid := x.hidden[key(domain, name)]; len(hid) > 0 {
			return nil, notFound("no provider named %q in domain %q (%s hides the name behind its alias)", name, domain, hid[0])
		}
		return nil, notFound("no provider named %q in domain %q", name, domain)
	}
	if t := cl.GetType(); t != "" {
		cands = slices.DeleteFunc(slices.Clone(cands), func(p provider) bool { return p.link.GetType() != t })
		if len(cands) == 0 {
			return nil, failed("provider %q in domain %q has type %q, not %q", name, domain, x.byName[key(domain, name)][0].link.GetType(), t)
		}
	}
	if len(cands) > 1 {
		return nil, failed("%d providers named %q in domain %q: %s", len(cands), name, domain, list(cands))
	}
	p := cands[0]
	if domain != c.Domain && !p.link.GetShared() {
		return nil, failed("provider %q in domain %q is not shared", name, domain)
	}
	return &p, nil
}

func (x *Index) byTypeIn(domain, typ string) (*provider, *linkError) {
	cands := x.byType[key(domain, typ)]
	switch len(cands) {
	case 0:
		return nil, notFound("no provider of type %q in domain %q", typ, domain)
	case 1:
		p := cands[0]
		return &p, nil
	}
	return nil, failed("%d providers of type %q in domain %q: %s; set from to choose one", len(cands), typ, domain, list(cands))
}

func list(ps []provider) string {
	ps = slices.Clone(ps)
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].lrp.Guid != ps[j].lrp.Guid {
			return ps[i].lrp.Guid < ps[j].lrp.Guid
		}
		return ps[i].link.GetName() < ps[j].link.GetName()
	})
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.String()
	}
	return strings.Join(parts, ", ")
}

// offersHost reports whether the provider's link port has a host port: no port (the bare cell
// address) or a port among the LRP's ports.
func offersHost(p *provider) bool {
	port := p.link.GetPort()
	return port == 0 || slices.Contains(p.lrp.Ports, port)
}

func chooseNetwork(p *provider, want string) (string, *linkError) {
	switch want {
	case "":
		if offersHost(p) {
			return NetworkHost, nil
		}
		return NetworkInstance, nil
	case NetworkHost:
		if !offersHost(p) {
			return "", failed("%s does not offer network %q: port %d is not among the lrp's ports", p, want, p.link.GetPort())
		}
		return want, nil
	case NetworkInstance:
		return want, nil
	}
	return "", failed("%s does not offer network %q (networks: %q, %q)", p, want, NetworkHost, NetworkInstance)
}

// running returns one RUNNING record per index, ordered by index, preferring the ordinary copy.
// A draining record (withdrawn from routing before its stop) no longer serves and is left out.
func running(as []*modelsv1.ActualLRP) []*modelsv1.ActualLRP {
	byIndex := map[int32]*modelsv1.ActualLRP{}
	for _, a := range as {
		if a.GetState() != modelsv1.ActualLRP_STATE_RUNNING || a.GetDrainingSince() != nil {
			continue
		}
		i := a.GetKey().GetIndex()
		if cur, ok := byIndex[i]; ok && cur.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
			continue
		}
		byIndex[i] = a
	}
	out := make([]*modelsv1.ActualLRP, 0, len(byIndex))
	for _, a := range byIndex {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetKey().GetIndex() < out[j].GetKey().GetIndex() })
	return out
}

func node(p *provider, network string, a *modelsv1.ActualLRP) *modelsv1.LinkNode {
	n := &modelsv1.LinkNode{
		Name:  p.link.GetName(),
		Id:    a.GetInstanceKey().GetInstanceGuid(),
		Index: a.GetKey().GetIndex(),
		Az:    a.GetZone(),
	}
	port := p.link.GetPort()
	ni := a.GetNetInfo()
	switch network {
	case NetworkInstance:
		n.Address = withPort(ni.GetInstanceAddress(), port)
	default:
		var host uint32
		for _, m := range ni.GetPorts() {
			if m.GetContainerPort() == port {
				host = m.GetHostPort()
			}
		}
		n.Address = withPort(ni.GetAddress(), host)
	}
	return n
}

func withPort(addr string, port uint32) string {
	if port == 0 {
		return addr
	}
	return net.JoinHostPort(addr, strconv.FormatUint(uint64(port), 10))
}

func cloneNode(n *modelsv1.LinkNode) *modelsv1.LinkNode {
	return &modelsv1.LinkNode{Name: n.GetName(), Id: n.GetId(), Index: n.GetIndex(), Az: n.GetAz(), Address: n.GetAddress()}
}
