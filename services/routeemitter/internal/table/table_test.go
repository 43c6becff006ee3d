package table

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/routing/cfrouter"
)

const (
	httpP = routeemitterv1.Route_PROTOCOL_HTTP
	tcpP  = routeemitterv1.Route_PROTOCOL_TCP
	udpP  = routeemitterv1.Route_PROTOCOL_UDP
)

// actual is a RUNNING, routable instance of guid at index with host ports 30000+container port+index.
func actual(guid string, index int32, instance string, presence modelsv1.ActualLRP_Presence, containerPorts ...uint32) *modelsv1.ActualLRP {
	net := &modelsv1.ActualLRPNetInfo{Address: "10.0.0." + fmt.Sprint(index+1)}
	for _, p := range containerPorts {
		net.Ports = append(net.Ports, &modelsv1.PortMapping{ContainerPort: p, HostPort: 30000 + p + uint32(index)})
	}
	return &modelsv1.ActualLRP{
		Key:         &modelsv1.ActualLRPKey{ProcessGuid: guid, Index: index, Domain: "apps"},
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: instance, CellId: "cell"},
		State:       modelsv1.ActualLRP_STATE_RUNNING,
		Presence:    presence,
		NetInfo:     net,
		Routable:    true,
	}
}

func routes(doc string) map[string][]byte {
	return map[string][]byte{cfrouter.Provider: []byte(doc), "skydns": []byte(`[{"port":5000,"host":"admin-api.service.skydns.local","priority":20}]`)}
}

// render writes a table compactly: "http:foo.com[tls] g/0@10.0.0.1:34000" per route.
func render(rs []*routeemitterv1.Route) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(KeyOf(r).String())
		if r.GetTlsOnly() {
			b.WriteString("[tls]")
		}
		for _, e := range r.GetEndpoints() {
			fmt.Fprintf(&b, " %s/%d/%s@%s:%d", e.GetProcessGuid(), e.GetIndex(), e.GetInstanceGuid(), e.GetAddress(), e.GetPort())
		}
		b.WriteString("\n")
	}
	return b.String()
}

func renderDelta(d Delta) string {
	var b strings.Builder
	for _, r := range d.Upserts {
		b.WriteString("+" + render([]*routeemitterv1.Route{r}))
	}
	for _, r := range d.Removals {
		b.WriteString("-" + KeyOf(r).String() + "\n")
	}
	return b.String()
}

func wantTable(t *testing.T, tb *Table, want string) {
	t.Helper()
	if got := render(tb.Routes()); got != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got, want)
	}
}

func wantDelta(t *testing.T, d Delta, want string) {
	t.Helper()
	if got := renderDelta(d); got != want {
		t.Fatalf("delta:\n%s\nwant:\n%s", got, want)
	}
}

const (
	ordinary   = modelsv1.ActualLRP_PRESENCE_ORDINARY
	evacuating = modelsv1.ActualLRP_PRESENCE_EVACUATING
	suspect    = modelsv1.ActualLRP_PRESENCE_SUSPECT
)

func TestTableRules(t *testing.T) {
	tb := New(logtest.New(t))
	tb.SetDesired("web", routes(`[{"port": 4000, "routes": ["foo.com", "bar.com"]}, {"port": 5000, "routes": ["admin.foo.com"], "route_to_instances": true, "ssl": true},
		{"port": 4000, "protocol": "tcp", "incoming_port": 62312}, {"port": 4000, "protocol": "udp", "incoming_port": 43218}]`))
	if d := tb.Commit(); !d.Empty() {
		t.Fatalf("routes without instances: %v", renderDelta(d))
	}
	tb.SetActual(actual("web", 0, "i0", ordinary, 4000, 5000))
	tb.SetActual(actual("web", 1, "i1", ordinary, 4000, 5000))
	wantDelta(t, tb.Commit(), `+http:0.admin.foo.com[tls] web/0/i0@10.0.0.1:35000
+http:1.admin.foo.com[tls] web/1/i1@10.0.0.2:35001
+http:admin.foo.com[tls] web/0/i0@10.0.0.1:35000 web/1/i1@10.0.0.2:35001
+http:bar.com web/0/i0@10.0.0.1:34000 web/1/i1@10.0.0.2:34001
+http:foo.com web/0/i0@10.0.0.1:34000 web/1/i1@10.0.0.2:34001
+tcp:62312 web/0/i0@10.0.0.1:34000 web/1/i1@10.0.0.2:34001
+udp:43218 web/0/i0@10.0.0.1:34000 web/1/i1@10.0.0.2:34001
`)

	// Not routable, or not running: out. Index 1's own hostname goes with it.
	notRoutable := actual("web", 1, "i1", ordinary, 4000, 5000)
	notRoutable.Routable = false
	tb.SetActual(notRoutable)
	wantDelta(t, tb.Commit(), `+http:admin.foo.com[tls] web/0/i0@10.0.0.1:35000
+http:bar.com web/0/i0@10.0.0.1:34000
+http:foo.com web/0/i0@10.0.0.1:34000
+tcp:62312 web/0/i0@10.0.0.1:34000
+udp:43218 web/0/i0@10.0.0.1:34000
-http:1.admin.foo.com
`)

	// An evacuating copy keeps routing next to its replacement; a suspect copy too.
	tb.SetActual(actual("web", 0, "i0", evacuating, 4000, 5000))
	claimed := &modelsv1.ActualLRP{Key: &modelsv1.ActualLRPKey{ProcessGuid: "web", Index: 0}, State: modelsv1.ActualLRP_STATE_CLAIMED,
		Presence: ordinary, InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "i0b"}}
	tb.SetActual(claimed)
	tb.RemoveActual(notRoutable)
	tb.SetActual(actual("web", 1, "i1s", suspect, 4000))
	tb.Commit()
	wantTable(t, tb, `http:0.admin.foo.com[tls] web/0/i0@10.0.0.1:35000
http:admin.foo.com[tls] web/0/i0@10.0.0.1:35000
http:bar.com web/0/i0@10.0.0.1:34000 web/1/i1s@10.0.0.2:34001
http:foo.com web/0/i0@10.0.0.1:34000 web/1/i1s@10.0.0.2:34001
tcp:62312 web/0/i0@10.0.0.1:34000 web/1/i1s@10.0.0.2:34001
udp:43218 web/0/i0@10.0.0.1:34000 web/1/i1s@10.0.0.2:34001
`)
	// A change that cannot affect routing does not even mark the process dirty.
	claimed2 := proto.Clone(claimed).(*modelsv1.ActualLRP)
	claimed2.CrashCount = 1
	tb.SetActual(claimed2)
	if tb.Dirty() != 0 {
		t.Fatalf("a non-routable change marked %d processes dirty", tb.Dirty())
	}

	// Removing the desired LRP removes everything.
	tb.RemoveDesired("web")
	wantDelta(t, tb.Commit(), `-http:0.admin.foo.com
-http:admin.foo.com
-http:bar.com
-http:foo.com
-tcp:62312
-udp:43218
`)
	if tb.Len() != 0 {
		t.Fatalf("table keeps %d routes", tb.Len())
	}
}

func TestTableSharedHostnamesAndBadDocuments(t *testing.T) {
	tb := New(logtest.New(t))
	tb.SetDesired("a", routes(`[{"port": 8080, "routes": ["shared.com", "a.com"]}]`))
	tb.SetDesired("b", routes(`[{"port": 8080, "routes": ["SHARED.com"], "ssl": true}, {"port": 8080, "protocol": "tcp", "incoming_port": 1234}]`))
	tb.SetDesired("c", routes(`[{"port": 8080, "protocol": "tcp", "incoming_port": 1234}]`))
	tb.SetDesired("bad", routes(`[{"port": 8080, "protocol": "tcp"}]`))
	tb.SetDesired("dns", map[string][]byte{"skydns": []byte(`[{"port":8080,"host":"x.skydns.local"}]`)})
	for _, g := range []string{"a", "b", "c", "bad", "dns"} {
		tb.SetActual(actual(g, 0, g+"0", ordinary, 8080))
	}
	tb.Commit()
	wantTable(t, tb, `http:a.com a/0/a0@10.0.0.1:38080
http:shared.com[tls] a/0/a0@10.0.0.1:38080 b/0/b0@10.0.0.1:38080
tcp:1234 b/0/b0@10.0.0.1:38080 c/0/c0@10.0.0.1:38080
`)
	if tb.Invalid() != 1 {
		t.Fatalf("Invalid() = %d, want 1", tb.Invalid())
	}

	// b leaving shared.com drops the TLS requirement it brought.
	tb.SetDesired("b", routes(`[{"port": 8080, "protocol": "tcp", "incoming_port": 1234}]`))
	d := tb.Commit()
	if len(d.Upserts) != 1 || d.Upserts[0].GetHostname() != "shared.com" || d.Upserts[0].GetTlsOnly() || len(d.Upserts[0].GetEndpoints()) != 1 {
		t.Fatalf("delta after b left shared.com: %s", renderDelta(d))
	}
	// The same document again is no change; fixing the bad one routes it.
	tb.SetDesired("b", routes(`[{"port": 8080, "protocol": "tcp", "incoming_port": 1234}]`))
	if tb.Dirty() != 0 {
		t.Fatal("an unchanged document marked the process dirty")
	}
	tb.SetDesired("bad", routes(`[{"port": 8080, "routes": ["fixed.com"]}]`))
	wantDelta(t, tb.Commit(), "+http:fixed.com bad/0/bad0@10.0.0.1:38080\n")
	if tb.Invalid() != 0 {
		t.Fatalf("Invalid() = %d after the fix", tb.Invalid())
	}
}

// tableOfAAndB is a committed table of a.com and b.com, each with one instance (a0, b0).
func tableOfAAndB(t *testing.T) *Table {
	tb := New(logtest.New(t))
	tb.SetDesired("a", routes(`[{"port": 8080, "routes": ["a.com"]}]`))
	tb.SetDesired("b", routes(`[{"port": 8080, "routes": ["b.com"]}]`))
	tb.SetActual(actual("a", 0, "a0", ordinary, 8080))
	tb.SetActual(actual("b", 0, "b0", ordinary, 8080))
	tb.Commit()
	return tb
}

func TestTableReplaceDiffs(t *testing.T) {
	tb := tableOfAAndB(t)

	// The listing: a unchanged, b gone, c new, a's instance 1 new.
	infos := []*modelsv1.DesiredLRPSchedulingInfo{
		{ProcessGuid: "a", Routes: routes(`[{"port": 8080, "routes": ["a.com"]}]`)},
		{ProcessGuid: "c", Routes: routes(`[{"port": 8080, "routes": ["c.com"]}]`)},
	}
	actuals := []*modelsv1.ActualLRP{actual("a", 0, "a0", ordinary, 8080), actual("a", 1, "a1", ordinary, 8080), actual("c", 0, "c0", ordinary, 8080), actual("b", 0, "b0", ordinary, 8080)}
	tb.Replace(NewListing(infos, actuals))
	wantDelta(t, tb.Commit(), `+http:a.com a/0/a0@10.0.0.1:38080 a/1/a1@10.0.0.2:38081
+http:c.com c/0/c0@10.0.0.1:38080
-http:b.com
`)
	// The same listing again changes nothing and marks nothing.
	tb.Replace(NewListing(infos, actuals))
	if tb.Dirty() != 0 {
		t.Fatalf("an identical listing marked %d processes dirty", tb.Dirty())
	}
	// Instances that vanished from the listing go.
	tb.Replace(NewListing(infos, actuals[:1]))
	wantDelta(t, tb.Commit(), `+http:a.com a/0/a0@10.0.0.1:38080
-http:c.com
`)
}

// TestReplaceAProcessAtATime: a listing swapped in one process at a time, with a commit after
// each, ends with the routes of the listing swapped in whole, and each commit carries only its
// process's difference.
func TestReplaceAProcessAtATime(t *testing.T) {
	infos := []*modelsv1.DesiredLRPSchedulingInfo{
		{ProcessGuid: "a", Routes: routes(`[{"port": 8080, "routes": ["a.com"]}]`)},
		{ProcessGuid: "c", Routes: routes(`[{"port": 8080, "routes": ["c.com"]}]`)},
	}
	actuals := []*modelsv1.ActualLRP{actual("a", 0, "a0", ordinary, 8080), actual("a", 1, "a1", ordinary, 8080), actual("c", 0, "c0", ordinary, 8080)}
	whole := tableOfAAndB(t)
	whole.Replace(NewListing(infos, actuals))
	whole.Commit()

	parts := tableOfAAndB(t)
	l := NewListing(infos, actuals)
	guids := parts.Processes(l)
	slices.Sort(guids)
	if want := []string{"a", "b", "c"}; !slices.Equal(guids, want) {
		t.Fatalf("Processes = %v, want %v (the listing's and the table's, once each)", guids, want)
	}
	for _, guid := range guids {
		parts.ReplaceProcess(l, guid)
		d := parts.Commit()
		for _, r := range append(d.Upserts, d.Removals...) {
			if !strings.HasPrefix(r.GetHostname(), guid+".") {
				t.Fatalf("replacing %s changed %s", guid, r.GetHostname())
			}
		}
	}
	if got, want := render(parts.Routes()), render(whole.Routes()); got != want {
		t.Fatalf("a process at a time:\n%s\nwant\n%s", got, want)
	}
}

func TestTableMissingPortMapping(t *testing.T) {
	tb := New(logtest.New(t))
	tb.SetDesired("a", routes(`[{"port": 9999, "routes": ["a.com"]}, {"port": 8080, "routes": ["ok.com"]}]`))
	tb.SetActual(actual("a", 0, "a0", ordinary, 8080))
	tb.Commit()
	wantTable(t, tb, "http:ok.com a/0/a0@10.0.0.1:38080\n")
}

// TestRoutingChanged checks which differences between two records of a slot can change a
// route: those in what an endpoint is made of (the instance, the cell's address, a port
// mapping) and routability, and no others.
func TestRoutingChanged(t *testing.T) {
	base := func() *modelsv1.ActualLRP { return actual("web", 0, "i0", ordinary, 8080, 9090) }
	for _, c := range []struct {
		name    string
		change  func(a *modelsv1.ActualLRP)
		changed bool
	}{
		{"nothing", func(*modelsv1.ActualLRP) {}, false},
		{"instance", func(a *modelsv1.ActualLRP) { a.InstanceKey.InstanceGuid = "i1" }, true},
		{"address", func(a *modelsv1.ActualLRP) { a.NetInfo.Address = "10.0.0.9" }, true},
		{"host port", func(a *modelsv1.ActualLRP) { a.NetInfo.Ports[1].HostPort++ }, true},
		{"container port", func(a *modelsv1.ActualLRP) { a.NetInfo.Ports[0].ContainerPort = 8081 }, true},
		{"a port more", func(a *modelsv1.ActualLRP) {
			a.NetInfo.Ports = append(a.NetInfo.Ports, &modelsv1.PortMapping{ContainerPort: 7070, HostPort: 37070})
		}, true},
		{"a port fewer", func(a *modelsv1.ActualLRP) { a.NetInfo.Ports = a.NetInfo.Ports[:1] }, true},
		{"not routable", func(a *modelsv1.ActualLRP) { a.Routable = false }, true},
		{"crashed", func(a *modelsv1.ActualLRP) { a.State = modelsv1.ActualLRP_STATE_CRASHED }, true},
		{"the container's own address", func(a *modelsv1.ActualLRP) { a.NetInfo.InstanceAddress = "172.16.0.9" }, false},
		{"crash count", func(a *modelsv1.ActualLRP) { a.CrashCount = 3 }, false},
		{"cell", func(a *modelsv1.ActualLRP) { a.InstanceKey.CellId = "cell-b" }, false},
	} {
		b := base()
		c.change(b)
		if got := routingChanged(base(), b); got != c.changed {
			t.Errorf("%s: routingChanged = %v, want %v", c.name, got, c.changed)
		}
		if got := routingChanged(b, base()); got != c.changed {
			t.Errorf("%s, the other way: routingChanged = %v, want %v", c.name, got, c.changed)
		}
	}
	if routingChanged(nil, nil) {
		t.Error("two absent records differ")
	}
}
