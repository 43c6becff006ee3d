package cfrouter

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

const (
	httpP = routeemitterv1.Route_PROTOCOL_HTTP
	tcpP  = routeemitterv1.Route_PROTOCOL_TCP
	udpP  = routeemitterv1.Route_PROTOCOL_UDP
)

func pathOf(err error) string {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Path()
	}
	return "(not an *Error)"
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		want    []Entry
		wantErr string
		path    string // where the error is
	}{
		{name: "proposal multiple ports", doc: `[{"port": 4000, "routes": ["foo.com", "bar.com"]}, {"port": 5000, "routes": ["admin.foo.com"]}]`,
			want: []Entry{{Port: 4000, Protocol: httpP, Hostnames: []string{"foo.com", "bar.com"}}, {Port: 5000, Protocol: httpP, Hostnames: []string{"admin.foo.com"}}}},
		{name: "route to instances", doc: `[{"port": 5000, "routes": ["admin.foo.com"], "route_to_instances": true}]`,
			want: []Entry{{Port: 5000, Protocol: httpP, Hostnames: []string{"admin.foo.com"}, RouteToInstances: true}}},
		{name: "tcp udp ssl", doc: `[{"port": 4000, "protocol": "tcp", "incoming_port": 62312}, {"port": 4000, "protocol": "udp", "incoming_port": 43218}, {"port": 5000, "routes": ["admin.foo.com"], "ssl": true}]`,
			want: []Entry{{Port: 4000, Protocol: tcpP, IncomingPort: 62312}, {Port: 4000, Protocol: udpP, IncomingPort: 43218}, {Port: 5000, Protocol: httpP, Hostnames: []string{"admin.foo.com"}, TLSOnly: true}}},
		{name: "hostnames synonym, merged, lower-cased, deduplicated", doc: `[{"port": 8080, "routes": ["A.example.com"], "hostnames": ["b.example.com.", "a.EXAMPLE.com"], "protocol": "HTTP"}]`,
			want: []Entry{{Port: 8080, Protocol: httpP, Hostnames: []string{"a.example.com", "b.example.com"}}}},
		{name: "json string holding the array", doc: `"[{\"port\": 8080, \"routes\": [\"x.com\"]}]"`,
			want: []Entry{{Port: 8080, Protocol: httpP, Hostnames: []string{"x.com"}}}},
		{name: "unknown fields ignored", doc: `[{"port": 8080, "routes": ["x.com"], "weight": 3}]`,
			want: []Entry{{Port: 8080, Protocol: httpP, Hostnames: []string{"x.com"}}}},
		{name: "empty array", doc: `[]`, want: []Entry{}},
		{name: "invalid json", doc: `[{"port": 8080,`, wantErr: "unexpected end", path: ""},
		{name: "not an array", doc: `{"port": 8080}`, wantErr: "JSON array"},
		{name: "null", doc: `null`, wantErr: "JSON array"},
		{name: "wrong type port", doc: `[{"port": 80}, {"port": "8080", "routes": ["x.com"]}]`, wantErr: "must be a number", path: "[1].port"},
		{name: "wrong type routes", doc: `[{"port": 8080, "routes": "x.com"}]`, wantErr: "must be an array of strings", path: "[0].routes"},
		{name: "wrong type ssl", doc: `[{"port": 8080, "routes": ["x.com"], "ssl": "yes"}]`, wantErr: "true or false", path: "[0].ssl"},
		{name: "negative port", doc: `[{"port": -1}]`, wantErr: "must be a number", path: "[0].port"},
		{name: "missing port", doc: `[{"routes": ["x.com"]}]`, wantErr: "cf-router routes[0].port: is required", path: "[0].port"},
		{name: "port out of range", doc: `[{"port": 8080}, {"port": 70000, "routes": ["x.com"]}]`, wantErr: "70000 is not in 1-65535", path: "[1].port"},
		{name: "null entry", doc: `[null]`, wantErr: "entry is null", path: "[0]"},
		{name: "entry not an object", doc: `[{"port": 1}, 7]`, wantErr: "must be an object", path: "[1]"},
		{name: "unknown protocol", doc: `[{"port": 8080, "protocol": "sctp", "incoming_port": 1}]`, wantErr: `"sctp" is unknown`, path: "[0].protocol"},
		{name: "tcp without incoming port", doc: `[{"port": 8080, "protocol": "tcp"}]`, wantErr: "is required for protocol tcp", path: "[0].incoming_port"},
		{name: "tcp incoming port zero", doc: `[{"port": 8080, "protocol": "tcp", "incoming_port": 0}]`, wantErr: "0 is not in 1-65535", path: "[0].incoming_port"},
		{name: "tcp with hostnames", doc: `[{"port": 8080, "protocol": "tcp", "incoming_port": 1000, "routes": ["x.com"]}]`, wantErr: "takes no routes", path: "[0].routes"},
		{name: "udp with ssl", doc: `[{"port": 8080, "protocol": "udp", "incoming_port": 1000, "ssl": true}]`, wantErr: "only to http", path: "[0].ssl"},
		{name: "http with incoming port", doc: `[{"port": 8080, "routes": ["x.com"], "incoming_port": 1000}]`, wantErr: "is only for protocol tcp or udp", path: "[0].incoming_port"},
		{name: "bad hostname", doc: `[{"port": 8080, "routes": ["ok.com", "x.com/path"]}]`, wantErr: `contains '/'`, path: "[0].routes[1]"},
		{name: "empty hostname", doc: `[{"port": 8080, "hostnames": [""]}]`, wantErr: "empty", path: "[0].hostnames[0]"},
		{name: "empty label", doc: `[{"port": 8080, "routes": ["a..b"]}]`, wantErr: "label", path: "[0].routes[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.doc))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse = %v, %v; want error containing %q", got, err, tt.wantErr)
				}
				var pe *Error
				if !errors.As(err, &pe) || pe.Path() != tt.path {
					t.Fatalf("error %v at %q, want at %q", err, pathOf(err), tt.path)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("Parse = %+v\nwant    %+v", got, tt.want)
			}
		})
	}
}
