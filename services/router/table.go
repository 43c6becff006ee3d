package router

import (
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"strconv"
	"strings"
	"sync/atomic"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

// table is one immutable version of the routing table. Readers load it through an
// atomic.Pointer and never lock; every change builds a new table (copy-on-write of what
// changes) and swaps the pointer. Only the per-route round-robin counters mutate.
type table struct {
	id      string
	version uint64
	http    *hostMap          // by lower-cased hostname without a trailing dot
	tcp     map[uint32]*route // by incoming port
	udp     map[uint32]*route // by incoming port
}

// hostShards splits the HTTP routes so that a delta copies one shard (and the shard array)
// instead of the whole table: a one-route change in a 100,000-route table copies ~400
// entries.
const hostShards = 256

// hostSeed hashes hostnames to shards.
var hostSeed = maphash.MakeSeed()

// hostMap is the immutable HTTP part of a table: routes by hostname, sharded by hash.
type hostMap struct {
	shards [hostShards]map[string]*route
	n      int
}

// shardOf is host's shard.
func shardOf(host string) int { return int(maphash.String(hostSeed, host) % hostShards) }

// get returns host's route, or nil.
func (m *hostMap) get(host string) *route { return m.shards[shardOf(host)][host] }

// getBytes is get for a key in bytes, without copying it.
func (m *hostMap) getBytes(host []byte) *route {
	return m.shards[int(maphash.Bytes(hostSeed, host)%hostShards)][string(host)]
}

// len is the number of routes.
func (m *hostMap) len() int { return m.n }

// each calls f for every route.
func (m *hostMap) each(f func(*route)) {
	for _, s := range m.shards {
		for _, r := range s {
			f(r)
		}
	}
}

// route is every endpoint behind one hostname or one TCP/UDP incoming port.
type route struct {
	hostname  string // HTTP only
	port      uint32 // TCP/UDP only
	tlsOnly   bool
	endpoints []endpoint
	next      atomic.Uint64 // round-robin counter, carried over when the route is replaced
}

// endpoint is one instance behind a route.
type endpoint struct {
	addr         string // host:port to dial
	processGUID  string
	instanceGUID string
	index        int32
}

// pick returns the position in endpoints of the next round-robin choice (callers take it
// modulo the number of endpoints, and the following one on retry).
func (r *route) pick() uint64 { return r.next.Add(1) - 1 }

// errResync reports that a delta does not apply to the held table; the watcher then asks
// for a fresh snapshot.
var errResync = errors.New("delta does not apply to the held table")

// builder applies WatchRoutes messages to a table, copying each map the first time it
// changes, and yields the new table.
type builder struct {
	base                    *table           // the published table, never modified; nil before the first snapshot
	t                       *table           // the table being built
	ownHTTP, ownTCP, ownUDP bool             // whether t's hostMap and port maps are private copies
	ownShard                [hostShards]bool // whether each shard of t's hostMap is a private copy
	skipped                 int              // routes ignored as malformed
}

// newBuilder starts a table that shares base's maps until they change.
func newBuilder(base *table) *builder {
	b := &builder{base: base}
	if base != nil {
		b.t = &table{id: base.id, version: base.version, http: base.http, tcp: base.tcp, udp: base.udp}
	}
	return b
}

// apply applies one message. A delta that does not fit the table being built (no table yet,
// or another table_id) returns errResync; a delta at or below the held version is a
// duplicate and ignored.
func (b *builder) apply(m *routeemitterv1.WatchRoutesResponse) error {
	if m.GetSnapshot() {
		b.t = &table{id: m.GetTableId(), version: m.GetVersion(), http: &hostMap{}, tcp: map[uint32]*route{}, udp: map[uint32]*route{}}
		b.ownHTTP, b.ownTCP, b.ownUDP = true, true, true
		b.ownShard = [hostShards]bool{} // nil shards; ensureShard makes each on first use
		for _, r := range m.GetUpserts() {
			b.upsert(r)
		}
		return nil
	}
	if b.t == nil {
		return fmt.Errorf("delta at version %d before any snapshot: %w", m.GetVersion(), errResync)
	}
	if m.GetTableId() != b.t.id {
		return fmt.Errorf("delta for table %q while holding %q: %w", m.GetTableId(), b.t.id, errResync)
	}
	if m.GetVersion() <= b.t.version {
		return nil
	}
	b.t.version = m.GetVersion()
	for _, r := range m.GetRemovals() {
		b.remove(r)
	}
	for _, r := range m.GetUpserts() {
		b.upsert(r)
	}
	return nil
}

// result is the table built so far (nil if no snapshot was ever applied).
func (b *builder) result() *table { return b.t }

// upsert adds or replaces one route, keeping its round-robin position.
func (b *builder) upsert(pr *routeemitterv1.Route) {
	r, ok := convertRoute(pr)
	if !ok {
		b.skipped++
		return
	}
	switch pr.GetProtocol() {
	case routeemitterv1.Route_PROTOCOL_HTTP:
		if old := b.previousHTTP(r.hostname); old != nil {
			r.next.Store(old.next.Load())
		}
		shard := b.ensureShard(r.hostname)
		if _, ok := shard[r.hostname]; !ok {
			b.t.http.n++
		}
		shard[r.hostname] = r
	case routeemitterv1.Route_PROTOCOL_TCP:
		b.ensureTCP()
		if old := b.previousPort(r.port, func(t *table) map[uint32]*route { return t.tcp }); old != nil {
			r.next.Store(old.next.Load())
		}
		b.t.tcp[r.port] = r
	case routeemitterv1.Route_PROTOCOL_UDP:
		b.ensureUDP()
		if old := b.previousPort(r.port, func(t *table) map[uint32]*route { return t.udp }); old != nil {
			r.next.Store(old.next.Load())
		}
		b.t.udp[r.port] = r
	}
}

// remove deletes the route with pr's key, if present.
func (b *builder) remove(pr *routeemitterv1.Route) {
	switch pr.GetProtocol() {
	case routeemitterv1.Route_PROTOCOL_HTTP:
		host := normalizeHostname(pr.GetHostname())
		if b.t.http.get(host) != nil {
			delete(b.ensureShard(host), host)
			b.t.http.n--
		}
	case routeemitterv1.Route_PROTOCOL_TCP:
		if _, ok := b.t.tcp[pr.GetIncomingPort()]; ok {
			b.ensureTCP()
			delete(b.t.tcp, pr.GetIncomingPort())
		}
	case routeemitterv1.Route_PROTOCOL_UDP:
		if _, ok := b.t.udp[pr.GetIncomingPort()]; ok {
			b.ensureUDP()
			delete(b.t.udp, pr.GetIncomingPort())
		}
	}
}

// previousHTTP is the route host had in the table being built or, after a snapshot, in the
// published table.
func (b *builder) previousHTTP(host string) *route {
	if r := b.t.http.get(host); r != nil {
		return r
	}
	if b.base != nil {
		return b.base.http.get(host)
	}
	return nil
}

// previousPort is previousHTTP for a TCP or UDP map chosen by sel.
func (b *builder) previousPort(port uint32, sel func(*table) map[uint32]*route) *route {
	if r := sel(b.t)[port]; r != nil {
		return r
	}
	if b.base != nil {
		return sel(b.base)[port]
	}
	return nil
}

// ensureShard makes t.http and host's shard private copies before their first change and
// returns the shard.
func (b *builder) ensureShard(host string) map[string]*route {
	if !b.ownHTTP {
		cp := *b.t.http
		b.t.http, b.ownHTTP = &cp, true
	}
	i := shardOf(host)
	if !b.ownShard[i] {
		src := b.t.http.shards[i]
		m := make(map[string]*route, len(src)+1)
		for k, v := range src {
			m[k] = v
		}
		b.t.http.shards[i], b.ownShard[i] = m, true
	}
	return b.t.http.shards[i]
}

// ensureTCP makes t.tcp a private copy before its first change.
func (b *builder) ensureTCP() {
	if !b.ownTCP {
		b.t.tcp, b.ownTCP = copyPortMap(b.t.tcp), true
	}
}

// ensureUDP makes t.udp a private copy before its first change.
func (b *builder) ensureUDP() {
	if !b.ownUDP {
		b.t.udp, b.ownUDP = copyPortMap(b.t.udp), true
	}
}

// copyPortMap copies a TCP/UDP route map.
func copyPortMap(src map[uint32]*route) map[uint32]*route {
	m := make(map[uint32]*route, len(src)+1)
	for k, v := range src {
		m[k] = v
	}
	return m
}

// convertRoute turns a wire route into a table route; it reports false for a route that
// cannot be served (unknown protocol, no hostname, port out of range). Endpoints without an
// address or port are dropped.
func convertRoute(pr *routeemitterv1.Route) (*route, bool) {
	r := &route{tlsOnly: pr.GetTlsOnly()}
	switch pr.GetProtocol() {
	case routeemitterv1.Route_PROTOCOL_HTTP:
		r.hostname = normalizeHostname(pr.GetHostname())
		if r.hostname == "" {
			return nil, false
		}
	case routeemitterv1.Route_PROTOCOL_TCP, routeemitterv1.Route_PROTOCOL_UDP:
		r.port = pr.GetIncomingPort()
		if r.port == 0 || r.port > 65535 {
			return nil, false
		}
	default:
		return nil, false
	}
	r.endpoints = make([]endpoint, 0, len(pr.GetEndpoints()))
	for _, e := range pr.GetEndpoints() {
		if e.GetAddress() == "" || e.GetPort() == 0 || e.GetPort() > 65535 {
			continue
		}
		r.endpoints = append(r.endpoints, endpoint{
			addr:         net.JoinHostPort(e.GetAddress(), strconv.FormatUint(uint64(e.GetPort()), 10)),
			processGUID:  e.GetProcessGuid(),
			instanceGUID: e.GetInstanceGuid(),
			index:        e.GetIndex(),
		})
	}
	return r, true
}

// normalizeHostname lower-cases a hostname and drops a trailing dot.
func normalizeHostname(h string) string {
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// requestHost is the route key of an HTTP request's Host: without the port (IPv6 literals
// keep their brackets), without a trailing dot, lower-cased.
func requestHost(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	return normalizeHostname(host)
}
