package routeemitter_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/routeemitter"
)

// TestRoutingRules checks the table rules against the routing proposal's examples, with a real
// BBS: several ports, index-specific routes, TLS-only and TCP/UDP routes, routable=false,
// refused documents next to good ones, and other providers ignored.
func TestRoutingRules(t *testing.T) {
	env := bbstest.Start(t)
	c := env.Client

	// The proposal's multiple-ports and index-specific examples.
	desire(t, c, lrp("web", 2, []uint32{4000, 5000}, cfRouter(
		`[{"port": 4000, "routes": ["foo.com", "bar.com"]}, {"port": 5000, "routes": ["admin.foo.com"], "route_to_instances": true}]`)))
	run(t, c, "web", 0, "web-0", true, netInfo(4000, 61000, 5000, 62000))
	run(t, c, "web", 1, "web-1", true, netInfo(4000, 61001, 5000, 62001))

	// The proposal's TCP/UDP/ssl example ("hostnames" is accepted for "routes").
	desire(t, c, lrp("net", 1, []uint32{4000, 5000}, cfRouter(
		`[{"port": 4000, "protocol": "tcp", "incoming_port": 62312}, {"port": 4000, "protocol": "udp", "incoming_port": 43218},
		  {"port": 5000, "hostnames": ["Admin.Secure.com"], "ssl": true}]`)))
	run(t, c, "net", 0, "net-0", true, netInfo(4000, 61100, 5000, 62100))

	// Instance 1 is running but not routable (readiness failing).
	desire(t, c, lrp("ready", 2, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["ready.com"]}]`)))
	run(t, c, "ready", 0, "ready-0", true, netInfo(8080, 61200))
	run(t, c, "ready", 1, "ready-1", false, netInfo(8080, 61201))

	// Malformed cf-router documents are refused by the BBS at desire (the table still ignores
	// any it finds, see its unit tests), and a provider the route-emitter does not know never
	// disturbs the good LRPs.
	for i, doc := range []string{
		`{"port": 8080, "routes": ["notalist.com"]}`,                           // not an array
		`[{"port": "8080", "routes": ["wrongtype.com"]}]`,                      // wrong type
		`[{"routes": ["noport.com"]}]`,                                         // missing port
		`[{"port": 8080, "protocol": "sctp", "incoming_port": 1000}]`,          // unknown protocol
		`[{"port": 8080, "protocol": "tcp"}]`,                                  // tcp without incoming_port
		`[{"port": 8080, "routes": ["ok.bad.com"]}, {"port": 8080, "ssl": 1}]`, // one bad entry refuses all
	} {
		guid := fmt.Sprintf("bad-%d", i)
		_, err := c.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp(guid, 1, []uint32{8080}, cfRouter(doc))})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `routes["cf-router"]`) {
			t.Fatalf("desire with cf-router document %s: %v, want InvalidArgument naming it", doc, err)
		}
	}
	desire(t, c, lrp("dns-only", 1, []uint32{5000}, map[string][]byte{"skydns": []byte(`[{"port":5000,"host":"x.skydns.local"}]`)}))
	run(t, c, "dns-only", 0, "dns-0", true, netInfo(5000, 61400))
	desire(t, c, lrp("good", 1, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["good.com"]}]`)))
	run(t, c, "good", 0, "good-0", true, netInfo(8080, 61500))

	e := startEmitter(t, env.Addr)
	wantExactly(t, e, map[string]string{
		"http:foo.com":          "web/0/web-0@127.0.0.1:61000 web/1/web-1@127.0.0.1:61001",
		"http:bar.com":          "web/0/web-0@127.0.0.1:61000 web/1/web-1@127.0.0.1:61001",
		"http:admin.foo.com":    "web/0/web-0@127.0.0.1:62000 web/1/web-1@127.0.0.1:62001",
		"http:0.admin.foo.com":  "web/0/web-0@127.0.0.1:62000",
		"http:1.admin.foo.com":  "web/1/web-1@127.0.0.1:62001",
		"tcp:62312":             "net/0/net-0@127.0.0.1:61100",
		"udp:43218":             "net/0/net-0@127.0.0.1:61100",
		"http:admin.secure.com": "[tls] net/0/net-0@127.0.0.1:62100",
		"http:ready.com":        "ready/0/ready-0@127.0.0.1:61200",
		"http:good.com":         "good/0/good-0@127.0.0.1:61500",
	})
	resp := table(t, e)
	if resp.GetTableId() != e.svc.TableID() || resp.GetVersion() == 0 {
		t.Fatalf("table id %q version %d, want %q and a version", resp.GetTableId(), resp.GetVersion(), e.svc.TableID())
	}
	for i := 1; i < len(resp.GetRoutes()); i++ {
		a, b := resp.GetRoutes()[i-1], resp.GetRoutes()[i]
		if a.GetProtocol() > b.GetProtocol() || (a.GetProtocol() == b.GetProtocol() && a.GetHostname() >= b.GetHostname() && a.GetIncomingPort() >= b.GetIncomingPort()) {
			t.Fatalf("routes out of order: %v before %v", a, b)
		}
	}
	if ep := resp.GetRoutes()[0].GetEndpoints()[0]; ep.GetContainerPort() == 0 || ep.GetPort() == 0 {
		t.Fatalf("endpoint without ports: %v", ep)
	}

	// The same rules apply to changes that arrive as events.
	start(t, c, "ready", 1, "ready-1", true, netInfo(8080, 61201))
	desire(t, c, lrp("late", 1, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["good.com"], "ssl": true}]`)))
	run(t, c, "late", 0, "late-0", true, netInfo(8080, 61600))
	waitRoutes(t, e, map[string]string{
		"http:ready.com": "ready/0/ready-0@127.0.0.1:61200 ready/1/ready-1@127.0.0.1:61201",
		// Two LRPs share a hostname: endpoints merged; TLS-only because one of them asks.
		"http:good.com": "[tls] good/0/good-0@127.0.0.1:61500 late/0/late-0@127.0.0.1:61600",
	})
}

// TestRoutesFollowChanges drives an LRP through route updates, a crash and restart, evacuation
// and removal, and checks that a watcher's copy of the table follows every version exactly.
func TestRoutesFollowChanges(t *testing.T) {
	env := bbstest.Start(t)
	c := env.Client
	ctx := ctxT(t)
	e := startEmitter(t, env.Addr)
	w := watch(t, e, "", 0)
	m := newMirror()
	m.apply(t, w.next(t))
	if m.snaps != 1 || m.tableID != e.svc.TableID() {
		t.Fatalf("first message is not a snapshot of %s: %+v", e.svc.TableID(), m)
	}

	desire(t, c, lrp("app", 2, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["app.com"]}]`)))
	run(t, c, "app", 0, "a0", true, netInfo(8080, 61000))
	run(t, c, "app", 1, "a1", true, netInfo(8080, 61001))
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61000 app/1/a1@127.0.0.1:61001"})

	// New routes take effect; the old hostname goes.
	if _, err := c.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "app", Update: &modelsv1.DesiredLRPUpdate{
		Routes: &modelsv1.RoutesUpdate{Routes: cfRouter(`[{"port": 8080, "routes": ["new.app.com"], "route_to_instances": true}]`)},
	}}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, e, map[string]string{
		"http:app.com":       "",
		"http:new.app.com":   "app/0/a0@127.0.0.1:61000 app/1/a1@127.0.0.1:61001",
		"http:1.new.app.com": "app/1/a1@127.0.0.1:61001",
	})

	// A crashed instance leaves the table and returns when started again.
	if _, err := c.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{ProcessGuid: "app", Index: 1, InstanceKey: instanceKey("a1"), ErrorMessage: "oom"}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, e, map[string]string{"http:new.app.com": "app/0/a0@127.0.0.1:61000", "http:1.new.app.com": ""})
	run(t, c, "app", 1, "a1-again", true, netInfo(8080, 61002))
	waitRoutes(t, e, map[string]string{
		"http:new.app.com":   "app/0/a0@127.0.0.1:61000 app/1/a1-again@127.0.0.1:61002",
		"http:1.new.app.com": "app/1/a1-again@127.0.0.1:61002",
	})

	// Evacuation: the evacuating copy keeps routing until it is removed, next to its replacement.
	// Evacuating itself (ordinary copy UNCLAIMED, evacuating copy RUNNING) changes no route.
	before := table(t, e).GetVersion()
	if _, err := c.EvacuateRunningActualLRP(ctx, &bbsv1.EvacuateRunningActualLRPRequest{ProcessGuid: "app", Index: 0, InstanceKey: instanceKey("a0"), NetInfo: netInfo(8080, 61000)}); err != nil {
		t.Fatal(err)
	}
	rev, err := env.Etcd.Get(ctx, "/gavel")
	if err != nil {
		t.Fatal(err)
	}
	waitStats(t, e, "the evacuation event", func(s routeemitter.Stats) bool { return s.Revision >= rev.Header.Revision })
	if v := table(t, e).GetVersion(); v != before {
		t.Fatalf("evacuation moved the table from v%d to v%d", before, v)
	}
	waitRoutes(t, e, map[string]string{"http:0.new.app.com": "app/0/a0@127.0.0.1:61000"})
	run(t, c, "app", 0, "a0-new", true, netInfo(8080, 61003))
	waitRoutes(t, e, map[string]string{"http:0.new.app.com": "app/0/a0@127.0.0.1:61000 app/0/a0-new@127.0.0.1:61003"})
	if _, err := c.RemoveEvacuatingActualLRP(ctx, &bbsv1.RemoveEvacuatingActualLRPRequest{ProcessGuid: "app", Index: 0, InstanceKey: instanceKey("a0")}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, e, map[string]string{
		"http:0.new.app.com": "app/0/a0-new@127.0.0.1:61003",
		"http:new.app.com":   "app/0/a0-new@127.0.0.1:61003 app/1/a1-again@127.0.0.1:61002",
	})

	// The watcher's copy matches the table at every version it has seen.
	final := table(t, e)
	m.follow(t, w, final.GetVersion())
	if got, want := render(m.list()), render(final.GetRoutes()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("watcher's table %v, RoutingTable %v", got, want)
	}
	if m.snaps != 1 || m.deltas == 0 {
		t.Fatalf("watcher saw %d snapshots and %d deltas", m.snaps, m.deltas)
	}

	// Removing the desired LRP removes its routes.
	if _, err := c.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "app"}); err != nil {
		t.Fatal(err)
	}
	wantExactly(t, e, map[string]string{})
	m.follow(t, w, table(t, e).GetVersion())
	if len(m.routes) != 0 {
		t.Fatalf("watcher keeps %d routes", len(m.routes))
	}
}

// TestWatchResume checks that a watcher resuming with its table_id and version gets only the
// later deltas, and that after a route-emitter restart (a new table_id) it gets a snapshot.
func TestWatchResume(t *testing.T) {
	env := bbstest.Start(t)
	c := env.Client
	e := startEmitter(t, env.Addr)
	desire(t, c, lrp("app", 3, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["app.com"]}]`)))
	run(t, c, "app", 0, "a0", true, netInfo(8080, 61000))
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61000"})

	w := watch(t, e, "", 0)
	m := newMirror()
	m.apply(t, w.next(t))
	w.cancel()
	held := m.version

	run(t, c, "app", 1, "a1", true, netInfo(8080, 61001))
	run(t, c, "app", 2, "a2", true, netInfo(8080, 61002))
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61000 app/1/a1@127.0.0.1:61001 app/2/a2@127.0.0.1:61002"})
	now := table(t, e)

	w = watch(t, e, m.tableID, held)
	first := w.next(t)
	if first.GetSnapshot() || first.GetVersion() != held+1 {
		t.Fatalf("resume from v%d sent snapshot=%v v%d, want the delta v%d", held, first.GetSnapshot(), first.GetVersion(), held+1)
	}
	m.apply(t, first)
	m.follow(t, w, now.GetVersion())
	if m.snaps != 1 || fmt.Sprint(render(m.list())) != fmt.Sprint(render(now.GetRoutes())) {
		t.Fatalf("resumed copy %v (snapshots %d), table %v", render(m.list()), m.snaps, render(now.GetRoutes()))
	}
	// Resuming at the current version sends nothing until the next change: the first message
	// is the delta of a change made after the watch began (the stream is ordered, so anything
	// sent at the resume would come first).
	w.cancel()
	w = watch(t, e, m.tableID, m.version)
	desire(t, c, lrp("other", 1, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["other.com"]}]`)))
	run(t, c, "other", 0, "o0", true, netInfo(8080, 61009))
	if msg := w.next(t); msg.GetSnapshot() || msg.GetVersion() != m.version+1 {
		t.Fatalf("a watcher resumed at the current v%d was first sent snapshot=%v v%d, want the next change's delta v%d",
			m.version, msg.GetSnapshot(), msg.GetVersion(), m.version+1)
	}
	w.cancel()

	// A restarted route-emitter has a new table id: the same resume gets a snapshot.
	e.stop()
	e2 := startEmitter(t, env.Addr)
	if e2.svc.TableID() == m.tableID {
		t.Fatal("a restarted route-emitter kept its table id")
	}
	w = watch(t, e2, m.tableID, m.version)
	snap := w.next(t)
	if !snap.GetSnapshot() || snap.GetTableId() != e2.svc.TableID() {
		t.Fatalf("resume against a new table sent snapshot=%v table %s", snap.GetSnapshot(), snap.GetTableId())
	}
	if got := render(snap.GetUpserts()); got["http:app.com"] != "app/0/a0@127.0.0.1:61000 app/1/a1@127.0.0.1:61001 app/2/a2@127.0.0.1:61002" {
		t.Fatalf("snapshot %v", got)
	}
}

// TestBBSOutageRestartAndCompaction cuts the route-emitter off from its BBS. First the stream is
// resumed from its revision and the changes made meanwhile arrive; then the BBS is replaced by a
// fresh one and etcd is compacted past that revision, so the resume fails with OUT_OF_RANGE and
// the route-emitter lists again. Watchers see deltas throughout, never a second snapshot.
func TestBBSOutageRestartAndCompaction(t *testing.T) {
	_, cli := etcdtest.Start(t)
	small := func(c *bbs.Config) { c.EventRing = 5 }
	b1 := startBBS(t, cli, "127.0.0.1:0", small)
	p := newProxy(t, b1.addr)
	e := startEmitter(t, p.addr)
	desire(t, b1.client, lrp("app", 3, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["app.com"]}]`)))
	run(t, b1.client, "app", 0, "a0", true, netInfo(8080, 61000))
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61000"})
	w := watch(t, e, "", 0)
	m := newMirror()
	m.apply(t, w.next(t))

	// Outage: changes made while the route-emitter cannot reach the BBS arrive after it.
	p.down()
	run(t, b1.client, "app", 1, "a1", true, netInfo(8080, 61001))
	p.up(t, b1.addr)
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61000 app/1/a1@127.0.0.1:61001"})
	if s := e.svc.Stats(); s.OutOfRange != 0 || s.Lists != 1 {
		t.Fatalf("a short outage re-listed: %+v", s)
	}

	// Restart: the BBS is replaced while the route-emitter is cut off, and enough happens (and
	// is compacted) that its revision can no longer be replayed.
	p.down()
	b1.stop()
	b2 := startBBS(t, cli, "127.0.0.1:0", small)
	t.Cleanup(e.stop) // before b2 stops, which would otherwise wait for the event stream
	ctx := ctxT(t)
	if _, err := b2.client.CrashActualLRP(ctx, &bbsv1.CrashActualLRPRequest{ProcessGuid: "app", Index: 0, InstanceKey: instanceKey("a0"), ErrorMessage: "gone"}); err != nil {
		t.Fatal(err)
	}
	run(t, b2.client, "app", 2, "a2", true, netInfo(8080, 61002))
	desire(t, b2.client, lrp("other", 1, []uint32{9090}, cfRouter(`[{"port": 9090, "protocol": "tcp", "incoming_port": 7000}]`)))
	run(t, b2.client, "other", 0, "o0", true, netInfo(9090, 61100))
	for i := range 10 { // fill the new BBS's event ring
		desire(t, b2.client, lrp(fmt.Sprintf("filler-%d", i), 0, nil, nil))
	}
	rev, err := cli.Get(ctx, "/gavel")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, rev.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	p.up(t, b2.addr)
	waitStats(t, e, "OUT_OF_RANGE then a second listing", func(s routeemitter.Stats) bool { return s.OutOfRange >= 1 && s.Lists >= 2 })
	wantExactly(t, e, map[string]string{
		"http:app.com": "app/1/a1@127.0.0.1:61001 app/2/a2@127.0.0.1:61002",
		"tcp:7000":     "other/0/o0@127.0.0.1:61100",
	})
	m.follow(t, w, table(t, e).GetVersion())
	if m.snaps != 1 || fmt.Sprint(render(m.list())) != fmt.Sprint(render(table(t, e).GetRoutes())) {
		t.Fatalf("watcher copy %v after %d snapshots", render(m.list()), m.snaps)
	}

	// The stream works again after the re-list.
	run(t, b2.client, "app", 0, "a0-again", true, netInfo(8080, 61003))
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0-again@127.0.0.1:61003 app/1/a1@127.0.0.1:61001 app/2/a2@127.0.0.1:61002"})
}

// TestPeriodicSync checks that full listings repeat every sync_interval without changing an
// unchanged table's version.
func TestPeriodicSync(t *testing.T) {
	env := bbstest.Start(t)
	desire(t, env.Client, lrp("app", 1, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["app.com"]}]`)))
	run(t, env.Client, "app", 0, "a0", true, netInfo(8080, 61000))
	e := startEmitter(t, env.Addr, func(c *routeemitter.Config) { c.SyncInterval = routeemitter.Duration(100 * time.Millisecond) })
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61000"})
	v := table(t, e).GetVersion()
	lists := e.svc.Stats().Lists
	waitStats(t, e, "three more listings", func(s routeemitter.Stats) bool { return s.Lists >= lists+3 })
	if got := table(t, e).GetVersion(); got != v {
		t.Fatalf("periodic listings of an unchanged BBS moved the version %d -> %d", v, got)
	}
	start(t, env.Client, "app", 0, "a0", true, netInfo(8080, 61005))
	waitRoutes(t, e, map[string]string{"http:app.com": "app/0/a0@127.0.0.1:61005"})
}

// TestNotSyncedYet checks that a route-emitter that cannot reach its BBS serves no empty table:
// RoutingTable is Unavailable and WatchRoutes waits.
func TestNotSyncedYet(t *testing.T) {
	env := bbstest.Start(t)
	p := newProxy(t, env.Addr)
	p.down()
	e := startEmitter(t, p.addr)
	_, err := e.client.RoutingTable(ctxT(t), &routeemitterv1.RoutingTableRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("RoutingTable before sync = %v, want Unavailable", err)
	}
	w := watch(t, e, "", 0)
	// A route the route-emitter can learn only once it reaches the BBS: the watcher's first
	// message must be a snapshot holding it, so nothing (an empty table) was sent before.
	desire(t, env.Client, lrp("app", 1, []uint32{8080}, cfRouter(`[{"port": 8080, "routes": ["app.com"]}]`)))
	run(t, env.Client, "app", 0, "a0", true, netInfo(8080, 61000))
	p.up(t, env.Addr)
	if m := w.next(t); !m.GetSnapshot() || render(m.GetUpserts())["http:app.com"] != "app/0/a0@127.0.0.1:61000" {
		t.Fatalf("first message %v, want the snapshot of the first sync, with app.com", m)
	}
	table(t, e)
}

func TestConfig(t *testing.T) {
	if err := routeemitter.Default().Validate(); err == nil {
		t.Fatal("the default config has no TLS and should not validate")
	}
	cfg := routeemitter.Default()
	path := t.TempDir() + "/re.json"
	doc := `{"listen_address": "127.0.0.1:9999", "tls": {"insecure": true}, "bbs_address": "bbs:8889",
		"bbs_tls": {"insecure": true}, "sync_interval": "15s", "log": {"level": "debug", "format": "json"}, "watch_queue": 8}`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cfg.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.ListenAddress != "127.0.0.1:9999" || cfg.BBSAddress != "bbs:8889" || time.Duration(cfg.SyncInterval) != 15*time.Second ||
		cfg.Log.Level != "debug" || cfg.WatchQueue != 8 || cfg.WatchHistory != routeemitter.Default().WatchHistory {
		t.Fatalf("loaded %+v", cfg)
	}
	bad := cfg
	bad.ListenAddress, bad.BBSAddress, bad.SyncInterval, bad.WatchQueue, bad.BBSTLS.Insecure = "", "", 0, 0, false
	err := bad.Validate()
	for _, want := range []string{"listen_address", "bbs_address", "sync_interval", "watch_queue", "bbs_tls"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	if err := os.WriteFile(path, []byte(`{"sync_interval": 60}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cfg.LoadFile(path); err == nil {
		t.Error("a numeric duration was accepted")
	}
}
