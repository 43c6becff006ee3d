package store

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Key layout of the BBS in etcd. Values are binary protobuf.
//
//	/gavel/v1/desired/sched/<process_guid>          DesiredLRPSchedulingInfo
//	/gavel/v1/desired/run/<process_guid>            DesiredLRPRunInfo
//	/gavel/v1/actual/<process_guid>/<index>/<presence> ActualLRP (presence: ordinary|evacuating|suspect)
//	/gavel/v1/task/<task_guid>                      Task
//	/gavel/v1/domain/<name>                         Domain, under a lease of its TTL
//	/gavel/v1/cell/<cell_id>                        CellPresence, under the rep's lease
//	/gavel/v1/port/<tcp|udp>/<incoming_port>        owner of a router port: StringValue(process_guid)
//	/gavel/v1/routing/published/<emitter_id>        Int64Value: the BBS revision a route-emitter
//	                                                has published, under a short lease
//	/gavel/v1/lock/<service>                        leader election (built by etcdx.LockKey)
//
// Every key the BBS reads or writes is built here; the rep writes cell presences with the same
// layout (services/rep/internal/presence/keys.go).
const (
	// Root is the prefix of every key Gavel writes.
	Root = etcdx.Root

	desiredSchedPrefix = Root + "desired/sched/"
	desiredRunPrefix   = Root + "desired/run/"
	actualPrefix       = Root + "actual/"
	taskPrefix         = Root + "task/"
	domainPrefix       = Root + "domain/"
	cellPrefix         = Root + "cell/"
	portPrefix         = Root + "port/"
	routesPrefix       = Root + "routing/published/"
)

// DesiredSchedKey is the key of a desired LRP's scheduling info.
func DesiredSchedKey(guid string) string { return desiredSchedPrefix + guid }

// DesiredRunKey is the key of a desired LRP's run info.
func DesiredRunKey(guid string) string { return desiredRunPrefix + guid }

// ActualGuidPrefix is the prefix of every actual LRP record of a process guid.
func ActualGuidPrefix(guid string) string { return actualPrefix + guid + "/" }

// ActualKey is the key of one actual LRP record.
func ActualKey(guid string, index int32, p modelsv1.ActualLRP_Presence) string {
	// One concatenation (one allocation) on every write's path, not ActualGuidPrefix's and then
	// another.
	return actualPrefix + guid + "/" + strconv.Itoa(int(index)) + "/" + presenceName(p)
}

// TaskKey is the key of a task.
func TaskKey(guid string) string { return taskPrefix + guid }

// DomainKey is the key of a domain.
func DomainKey(name string) string { return domainPrefix + name }

// CellKey is the key of a cell's presence.
func CellKey(cellID string) string { return cellPrefix + cellID }

// PortOwnerKey is the key naming the desired LRP that owns a router port; protocol is "tcp" or
// "udp". It is written and removed in the same transaction as the desired LRP, so two LRPs
// can never own one port.
func PortOwnerKey(protocol string, port uint32) string {
	return portPrefix + portID(protocol, port)
}

// RoutesPublishedKey is the key of the revision route-emitter emitterID reported published.
func RoutesPublishedKey(emitterID string) string { return routesPrefix + emitterID }

func portID(protocol string, port uint32) string {
	return protocol + "/" + strconv.FormatUint(uint64(port), 10)
}

func presenceName(p modelsv1.ActualLRP_Presence) string {
	switch p {
	case modelsv1.ActualLRP_PRESENCE_EVACUATING:
		return "evacuating"
	case modelsv1.ActualLRP_PRESENCE_SUSPECT:
		return "suspect"
	default:
		return "ordinary"
	}
}

func parsePresence(s string) (modelsv1.ActualLRP_Presence, bool) {
	switch s {
	case "ordinary":
		return modelsv1.ActualLRP_PRESENCE_ORDINARY, true
	case "evacuating":
		return modelsv1.ActualLRP_PRESENCE_EVACUATING, true
	case "suspect":
		return modelsv1.ActualLRP_PRESENCE_SUSPECT, true
	}
	return 0, false
}

type kind int

const (
	kindUnknown kind = iota
	kindSched
	kindRun
	kindActual
	kindTask
	kindDomain
	kindCell
	kindPort
	kindRoutes
)

// parsedKey identifies the record a key holds.
type parsedKey struct {
	kind     kind
	id       string // process guid, task guid, domain name, cell id, "<protocol>/<port>" or emitter id
	index    int32
	presence modelsv1.ActualLRP_Presence
}

func parseKey(k string) (parsedKey, error) {
	cut := func(prefix string) (string, bool) {
		rest, ok := strings.CutPrefix(k, prefix)
		return rest, ok && rest != "" && !strings.Contains(rest, "/")
	}
	if id, ok := cut(desiredSchedPrefix); ok {
		return parsedKey{kind: kindSched, id: id}, nil
	}
	if id, ok := cut(desiredRunPrefix); ok {
		return parsedKey{kind: kindRun, id: id}, nil
	}
	if id, ok := cut(taskPrefix); ok {
		return parsedKey{kind: kindTask, id: id}, nil
	}
	if id, ok := cut(domainPrefix); ok {
		return parsedKey{kind: kindDomain, id: id}, nil
	}
	if id, ok := cut(cellPrefix); ok {
		return parsedKey{kind: kindCell, id: id}, nil
	}
	if id, ok := cut(routesPrefix); ok {
		return parsedKey{kind: kindRoutes, id: id}, nil
	}
	if rest, ok := strings.CutPrefix(k, portPrefix); ok {
		proto, port, found := strings.Cut(rest, "/")
		n, err := strconv.ParseUint(port, 10, 16)
		if found && (proto == "tcp" || proto == "udp") && err == nil && n > 0 {
			return parsedKey{kind: kindPort, id: portID(proto, uint32(n))}, nil
		}
	}
	if rest, ok := strings.CutPrefix(k, actualPrefix); ok {
		// <process_guid>/<index>/<presence>, cut in place: every read of a record parses its key.
		guid, rest, ok1 := strings.Cut(rest, "/")
		index, presence, ok2 := strings.Cut(rest, "/")
		if ok1 && ok2 && guid != "" {
			idx, err := strconv.ParseInt(index, 10, 32)
			p, pok := parsePresence(presence) // a further "/" is no presence
			if err == nil && pok {
				return parsedKey{kind: kindActual, id: guid, index: int32(idx), presence: p}, nil
			}
		}
	}
	if strings.HasPrefix(k, etcdx.LockRoot) {
		return parsedKey{kind: kindUnknown}, nil
	}
	return parsedKey{}, fmt.Errorf("unrecognised key %q", k)
}

// String is the etcd key of the record k names.
func (k parsedKey) String() string {
	switch k.kind {
	case kindSched:
		return DesiredSchedKey(k.id)
	case kindRun:
		return DesiredRunKey(k.id)
	case kindActual:
		return ActualKey(k.id, k.index, k.presence)
	case kindTask:
		return TaskKey(k.id)
	case kindDomain:
		return DomainKey(k.id)
	case kindCell:
		return CellKey(k.id)
	case kindPort:
		return portPrefix + k.id
	case kindRoutes:
		return RoutesPublishedKey(k.id)
	}
	return ""
}
