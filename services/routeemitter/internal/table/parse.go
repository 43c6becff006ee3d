package table

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

// Provider is the key of DesiredLRP.routes whose document the route-emitter interprets; every
// other provider's document (e.g. "skydns") is ignored.
const Provider = "cf-router"

// maxHostnameLen is the longest hostname accepted (RFC 1035).
const maxHostnameLen = 253

// Entry is one parsed element of a cf-router routes document: the routes of one container port.
type Entry struct {
	// Port is the container port the routes reach.
	Port uint32
	// Protocol is HTTP, TCP or UDP.
	Protocol routeemitterv1.Route_Protocol
	// Hostnames are the HTTP hostnames, lower-cased (HTTP only).
	Hostnames []string
	// RouteToInstances adds "<index>.<hostname>" for every hostname (HTTP only).
	RouteToInstances bool
	// TLSOnly serves the hostnames only on the router's TLS listener (HTTP only).
	TLSOnly bool
	// IncomingPort is the router port of a TCP or UDP route.
	IncomingPort uint32
}

// rawEntry is the JSON schema of one element, as the routing proposal writes it.
type rawEntry struct {
	// Port is the container port (required).
	Port *uint32 `json:"port"`
	// Routes are HTTP hostnames.
	Routes []string `json:"routes"`
	// Hostnames are HTTP hostnames too (Diego's later name for routes).
	Hostnames []string `json:"hostnames"`
	// RouteToInstances adds index-specific hostnames.
	RouteToInstances bool `json:"route_to_instances"`
	// SSL makes the hostnames TLS-only.
	SSL bool `json:"ssl"`
	// Protocol is http (default), tcp or udp.
	Protocol string `json:"protocol"`
	// IncomingPort is the router port of a tcp or udp route.
	IncomingPort *uint32 `json:"incoming_port"`
}

// Parse reads a cf-router document: a JSON array of
// {port, routes|hostnames, route_to_instances, ssl, protocol, incoming_port}. A document that
// is itself a JSON string holding such an array (the proposal's map[string]string form) is
// accepted too. Unknown fields are ignored so the schema can grow; anything else that is not
// exactly right is an error naming the entry and field, and the whole document is refused.
func Parse(doc []byte) ([]Entry, error) {
	doc = bytes.TrimSpace(doc)
	if len(doc) > 0 && doc[0] == '"' {
		var inner string
		if err := json.Unmarshal(doc, &inner); err != nil {
			return nil, fmt.Errorf("parse %s routes: %w", Provider, err)
		}
		doc = bytes.TrimSpace([]byte(inner))
	}
	if len(doc) == 0 || doc[0] != '[' {
		return nil, fmt.Errorf("parse %s routes: want a JSON array of entries", Provider)
	}
	var raw []*rawEntry
	if err := json.Unmarshal(doc, &raw); err != nil {
		return nil, fmt.Errorf("parse %s routes: %w", Provider, err)
	}
	out := make([]Entry, 0, len(raw))
	for i, r := range raw {
		e, err := r.entry()
		if err != nil {
			return nil, fmt.Errorf("parse %s routes: entry %d: %w", Provider, i, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// entry validates r and converts it.
func (r *rawEntry) entry() (Entry, error) {
	if r == nil {
		return Entry{}, errors.New("entry is null")
	}
	if r.Port == nil {
		return Entry{}, errors.New("port is required")
	}
	if *r.Port == 0 || *r.Port > 65535 {
		return Entry{}, fmt.Errorf("port %d is not in 1-65535", *r.Port)
	}
	e := Entry{Port: *r.Port, RouteToInstances: r.RouteToInstances, TLSOnly: r.SSL}
	hostnames := append(append([]string(nil), r.Routes...), r.Hostnames...)
	switch p := strings.ToLower(strings.TrimSpace(r.Protocol)); p {
	case "", "http":
		e.Protocol = routeemitterv1.Route_PROTOCOL_HTTP
		if r.IncomingPort != nil {
			return Entry{}, errors.New("incoming_port is only for protocol tcp or udp")
		}
		seen := make(map[string]bool, len(hostnames))
		for _, h := range hostnames {
			norm, err := normalizeHostname(h)
			if err != nil {
				return Entry{}, err
			}
			if !seen[norm] {
				seen[norm] = true
				e.Hostnames = append(e.Hostnames, norm)
			}
		}
	case "tcp", "udp":
		e.Protocol = routeemitterv1.Route_PROTOCOL_TCP
		if p == "udp" {
			e.Protocol = routeemitterv1.Route_PROTOCOL_UDP
		}
		switch {
		case r.IncomingPort == nil:
			return Entry{}, fmt.Errorf("protocol %s requires incoming_port", p)
		case *r.IncomingPort == 0 || *r.IncomingPort > 65535:
			return Entry{}, fmt.Errorf("incoming_port %d is not in 1-65535", *r.IncomingPort)
		case len(hostnames) > 0:
			return Entry{}, fmt.Errorf("protocol %s routes by incoming_port and takes no routes or hostnames", p)
		case r.SSL || r.RouteToInstances:
			return Entry{}, fmt.Errorf("ssl and route_to_instances apply only to http routes, not %s", p)
		}
		e.IncomingPort = *r.IncomingPort
	default:
		return Entry{}, fmt.Errorf("protocol %q is unknown (want http, tcp or udp)", r.Protocol)
	}
	return e, nil
}

// normalizeHostname lower-cases h, drops one trailing dot and checks it is a plausible DNS name
// (letters, digits, '-', '_' and '*' in non-empty dot-separated labels of at most 63 bytes).
func normalizeHostname(h string) (string, error) {
	n := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
	if n == "" {
		return "", fmt.Errorf("hostname %q is empty", h)
	}
	if len(n) > maxHostnameLen {
		return "", fmt.Errorf("hostname %q is longer than %d bytes", h, maxHostnameLen)
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 {
			return "", fmt.Errorf("hostname %q has an empty or over-long label", h)
		}
		for _, c := range label {
			ok := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '*'
			if !ok {
				return "", fmt.Errorf("hostname %q contains %q", h, c)
			}
		}
	}
	return n, nil
}
