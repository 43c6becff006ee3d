// Package cfrouter is the one parser of the "cf-router" routes document, the routing provider
// Gavel itself serves: the BBS validates documents with it at desire and update, and the
// route-emitter builds its table from what it returns. Other providers' documents are opaque.
package cfrouter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

// Provider is the key of DesiredLRP.routes whose document Gavel interprets.
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

// Error is what is wrong with a document: the entry (its index in the array; -1 for the
// document as a whole), the field of that entry (empty for the entry as a whole) and why.
type Error struct {
	// Entry is the index of the wrong entry, or -1 when the document itself is wrong.
	Entry int
	// Field is the wrong field of the entry, e.g. "port" or "routes[2]"; may be empty.
	Field string
	// Reason says what is wrong.
	Reason string
}

// Path is where the problem is, relative to the document: "" (the document), "[1]" or
// "[1].port".
func (e *Error) Path() string {
	if e.Entry < 0 {
		return ""
	}
	p := "[" + strconv.Itoa(e.Entry) + "]"
	if e.Field != "" {
		p += "." + e.Field
	}
	return p
}

// Error implements error: "cf-router routes[1].port: 70000 is not in 1-65535".
func (e *Error) Error() string {
	return Provider + " routes" + e.Path() + ": " + e.Reason
}

// Parse reads a cf-router document: a JSON array of
// {port, routes|hostnames, route_to_instances, ssl, protocol, incoming_port}. A document that
// is itself a JSON string holding such an array (the proposal's map[string]string form) is
// accepted too. Unknown fields are ignored so the schema can grow; anything else that is not
// exactly right is an *Error naming the entry and field, and the whole document is refused.
func Parse(doc []byte) ([]Entry, error) {
	doc = bytes.TrimSpace(doc)
	if len(doc) > 0 && doc[0] == '"' {
		var inner string
		if err := json.Unmarshal(doc, &inner); err != nil {
			return nil, &Error{Entry: -1, Reason: err.Error()}
		}
		doc = bytes.TrimSpace([]byte(inner))
	}
	if len(doc) == 0 || doc[0] != '[' {
		return nil, &Error{Entry: -1, Reason: "want a JSON array of entries"}
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(doc, &raws); err != nil {
		return nil, &Error{Entry: -1, Reason: err.Error()}
	}
	out := make([]Entry, 0, len(raws))
	for i, raw := range raws {
		var r *rawEntry
		if err := json.Unmarshal(raw, &r); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				if te.Field == "" {
					return nil, &Error{Entry: i, Reason: fmt.Sprintf("must be an object, got a JSON %s", te.Value)}
				}
				return nil, &Error{Entry: i, Field: te.Field, Reason: fmt.Sprintf("must be %s, got a JSON %s", jsonKind(te), te.Value)}
			}
			return nil, &Error{Entry: i, Reason: err.Error()}
		}
		e, err := r.entry()
		if err != nil {
			err.Entry = i
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// jsonKind names the JSON type a field wants.
func jsonKind(te *json.UnmarshalTypeError) string {
	switch te.Type.Kind().String() {
	case "uint32", "int", "uint", "int64", "uint64":
		return "a number in 1-65535"
	case "bool":
		return "true or false"
	case "slice":
		return "an array of strings"
	case "string":
		return "a string"
	}
	return "a " + te.Type.String()
}

func fieldErr(field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// entry validates r and converts it.
func (r *rawEntry) entry() (Entry, *Error) {
	if r == nil {
		return Entry{}, fieldErr("", "entry is null")
	}
	if r.Port == nil {
		return Entry{}, fieldErr("port", "is required")
	}
	if *r.Port == 0 || *r.Port > 65535 {
		return Entry{}, fieldErr("port", "%d is not in 1-65535", *r.Port)
	}
	e := Entry{Port: *r.Port, RouteToInstances: r.RouteToInstances, TLSOnly: r.SSL}
	switch p := strings.ToLower(strings.TrimSpace(r.Protocol)); p {
	case "", "http":
		e.Protocol = routeemitterv1.Route_PROTOCOL_HTTP
		if r.IncomingPort != nil {
			return Entry{}, fieldErr("incoming_port", "is only for protocol tcp or udp")
		}
		seen := make(map[string]bool, len(r.Routes)+len(r.Hostnames))
		for _, list := range []struct {
			field string
			names []string
		}{{"routes", r.Routes}, {"hostnames", r.Hostnames}} {
			for j, h := range list.names {
				norm, err := normalizeHostname(h)
				if err != nil {
					return Entry{}, fieldErr(list.field+"["+strconv.Itoa(j)+"]", "%v", err)
				}
				if !seen[norm] {
					seen[norm] = true
					e.Hostnames = append(e.Hostnames, norm)
				}
			}
		}
	case "tcp", "udp":
		e.Protocol = routeemitterv1.Route_PROTOCOL_TCP
		if p == "udp" {
			e.Protocol = routeemitterv1.Route_PROTOCOL_UDP
		}
		switch {
		case r.IncomingPort == nil:
			return Entry{}, fieldErr("incoming_port", "is required for protocol %s", p)
		case *r.IncomingPort == 0 || *r.IncomingPort > 65535:
			return Entry{}, fieldErr("incoming_port", "%d is not in 1-65535", *r.IncomingPort)
		case len(r.Routes) > 0:
			return Entry{}, fieldErr("routes", "protocol %s routes by incoming_port and takes no routes or hostnames", p)
		case len(r.Hostnames) > 0:
			return Entry{}, fieldErr("hostnames", "protocol %s routes by incoming_port and takes no routes or hostnames", p)
		case r.SSL:
			return Entry{}, fieldErr("ssl", "applies only to http routes, not %s", p)
		case r.RouteToInstances:
			return Entry{}, fieldErr("route_to_instances", "applies only to http routes, not %s", p)
		}
		e.IncomingPort = *r.IncomingPort
	default:
		return Entry{}, fieldErr("protocol", "%q is unknown (want http, tcp or udp)", r.Protocol)
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
