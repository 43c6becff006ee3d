package core

import (
	"sort"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/routing/cfrouter"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// routerPort is a TCP or UDP port of the router that a desired LRP's cf-router routes claim.
type routerPort struct {
	protocol string // "tcp" or "udp"
	port     uint32
}

// routerPorts lists, sorted and without duplicates, the (protocol, incoming_port) pairs of the
// cf-router document in routes. Documents were validated at desire/update; one that does not
// parse claims nothing.
func routerPorts(routes map[string][]byte) []routerPort {
	entries, err := cfrouter.Parse(routes[cfrouter.Provider])
	if routes[cfrouter.Provider] == nil || err != nil {
		return nil
	}
	seen := map[routerPort]bool{}
	var out []routerPort
	for _, e := range entries {
		var p routerPort
		switch e.Protocol {
		case routeemitterv1.Route_PROTOCOL_TCP:
			p = routerPort{"tcp", e.IncomingPort}
		case routeemitterv1.Route_PROTOCOL_UDP:
			p = routerPort{"udp", e.IncomingPort}
		default:
			continue
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].protocol != out[j].protocol {
			return out[i].protocol < out[j].protocol
		}
		return out[i].port < out[j].port
	})
	return out
}

// movePorts makes guid the owner of the router ports in next that it does not hold in prev, and
// releases those of prev that are not in next, in transaction t: each (protocol, port) has one
// owner, and a port another LRP owns is AlreadyExists naming that LRP. The owner keys are read
// in t, so two desires racing for one port cannot both commit: the loser's compare fails and
// its retry sees the winner.
func movePorts(t *store.Txn, guid string, prev, next []routerPort) error {
	held := make(map[routerPort]bool, len(prev))
	for _, p := range prev {
		held[p] = true
	}
	wanted := make(map[routerPort]bool, len(next))
	for _, p := range next {
		wanted[p] = true
		owner, err := t.PortOwner(p.protocol, p.port)
		if err != nil {
			return err
		}
		switch {
		case owner == guid:
			continue
		case owner != "":
			return rpcerr.AlreadyExists("%s port %d is owned by desired lrp %q", p.protocol, p.port, owner)
		}
		if err := t.PutPortOwner(p.protocol, p.port, guid); err != nil {
			return err
		}
	}
	for _, p := range prev {
		if wanted[p] {
			continue
		}
		owner, err := t.PortOwner(p.protocol, p.port)
		if err != nil {
			return err
		}
		if owner == guid {
			t.Delete(store.PortOwnerKey(p.protocol, p.port))
		}
	}
	return nil
}
