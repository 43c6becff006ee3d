package bbs_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

func linkLRP(guid, domain string, instances int32, l *modelsv1.Links) *modelsv1.DesiredLRP {
	d := lrp(guid, instances)
	d.Domain = domain
	d.Links = l
	return d
}

func linkDesire(t *testing.T, env *bbstest.Env, d *modelsv1.DesiredLRP) {
	t.Helper()
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatalf("desire %s: %v", d.GetProcessGuid(), err)
	}
}

// linkNext reads events until a LinksChanged for guid and returns it.
func linkNext(t *testing.T, s *evEventStream, guid string) *bbsv1.LinksChanged {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range s.recv().GetEvents() {
			if lc := e.GetLinksChanged(); lc != nil && lc.GetProcessGuid() == guid {
				return lc
			}
		}
	}
	t.Fatalf("no LinksChanged for %s", guid)
	return nil
}

// webAddrs is the addresses ResolveLinks gives web's link db.
func webAddrs(t *testing.T, env *bbstest.Env) string {
	t.Helper()
	resp, err := env.Client.ResolveLinks(ctxT(t), &bbsv1.ResolveLinksRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatalf("ResolveLinks web: %v", err)
	}
	return addrs(resp.GetLinks()["db"])
}

func addrs(rl *modelsv1.ResolvedLink) string {
	var out []string
	for _, n := range rl.GetNodes() {
		out = append(out, n.GetAddress())
	}
	return strings.Join(out, ",")
}

func TestLinksDesireResolveFollowAndRemove(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	lrpRegisterCell(t, env, "cell-1", "z1")
	lrpRegisterCell(t, env, "cell-2", "z2")

	db := linkLRP("db", "apps", 2, &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{
		Name: "db", Type: "mysql", Port: 8080, Properties: map[string]string{"user": "admin"},
	}}})
	linkDesire(t, env, db)
	linkDesire(t, env, linkLRP("web", "apps", 1, &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "db", Type: "mysql"}}}))

	resp, err := env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if rl := resp.GetLinks()["db"]; rl == nil || len(rl.GetNodes()) != 0 || rl.GetProperties()["user"] != "admin" {
		t.Fatalf("before any provider runs: %v, want empty nodes and the properties", resp.GetLinks())
	}

	events := evSubscribe(t, env, 0, &bbsv1.Filter{CellId: "cell-9"})
	ik0, ik1 := lrpInstKey("db-0", "cell-1"), lrpInstKey("db-1", "cell-2")
	lrpClaim(t, env, "db", 0, ik0)
	lrpStart(t, env, "db", 0, ik0, lrpNetInfo(61000))
	linkNext(t, events, "web")
	if got := webAddrs(t, env); got != "10.0.0.1:61000" {
		t.Fatalf("LinksChanged after db/0 ran: %s", got)
	}
	lrpClaim(t, env, "db", 1, ik1)
	lrpStart(t, env, "db", 1, ik1, lrpNetInfo(61001))
	linkNext(t, events, "web")
	if got := webAddrs(t, env); got != "10.0.0.1:61000,10.0.0.1:61001" {
		t.Fatalf("LinksChanged after db/1 ran: %s", got)
	}
	resp, err = env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	n := resp.GetLinks()["db"].GetNodes()
	if len(n) != 2 || n[1].GetId() != "db-1" || n[1].GetIndex() != 1 || n[1].GetAz() != "z2" || n[1].GetName() != "db" {
		t.Fatalf("nodes %v", n)
	}
	lrpCrash(t, env, "db", 0, ik0, "boom")
	linkNext(t, events, "web")
	if got := webAddrs(t, env); got != "10.0.0.1:61001" {
		t.Fatalf("LinksChanged after db/0 crashed: %s", got)
	}

	// A provider others consume is not removed unless forced.
	rev := lrpRevision(t, env)
	_, err = env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "db"})
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(status.Convert(err).Message(), `desired lrp "db" provides links consumed by "web"`) {
		t.Fatalf("message %q does not name the consumer", status.Convert(err).Message())
	}
	lrpWantRevision(t, env, rev, "refused remove")
	if _, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "db", Force: true}); err != nil {
		t.Fatal(err)
	}
	lc := linkNext(t, events, "web")
	if len(lc.GetErrors()) != 1 || lc.GetErrors()[0] != `link "db": no provider of type "mysql" in domain "apps"` {
		t.Fatalf("LinksChanged after forced removal: %v", lc)
	}
	_, err = env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "web"})
	wantCode(t, err, codes.FailedPrecondition)
	// The broken consumer may be scaled to zero, not up.
	_, err = env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Instances: ptr[int32](3)}})
	wantCode(t, err, codes.InvalidArgument)
	if _, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Instances: ptr[int32](0)}}); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestLinksColocatedPerInstance(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	lrpRegisterCell(t, env, "cell-1", "z1")
	lrpRegisterCell(t, env, "cell-2", "z1")
	linkDesire(t, env, linkLRP("metron", "apps", 2, &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "metron", Type: "metron", As: "node_metron", Port: 8080}}}))
	linkDesire(t, env, linkLRP("node", "apps", 2, &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "metron", Type: "metron", From: "node_metron", Colocated: true}}}))
	for i, cell := range []string{"cell-1", "cell-2"} {
		ik := lrpInstKey("metron-"+cell, cell)
		lrpClaim(t, env, "metron", int32(i), ik)
		lrpStart(t, env, "metron", int32(i), ik, lrpNetInfo(uint32(62000+i)))
		nik := lrpInstKey("node-"+cell, cell)
		lrpClaim(t, env, "node", int32(i), nik)
	}
	resp, err := env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "node", CellId: "cell-2"})
	if err != nil {
		t.Fatal(err)
	}
	if nd := resp.GetLinks()["metron"].GetNode(); nd.GetId() != "metron-cell-2" || nd.GetAddress() != "10.0.0.1:62001" {
		t.Fatalf("colocated node on cell-2: %v", resp.GetLinks())
	}
	if len(resp.GetInstances()) != 2 || resp.GetInstances()[0].GetLinks()["metron"].GetNode().GetId() != "metron-cell-1" ||
		resp.GetInstances()[1].GetCellId() != "cell-2" || resp.GetInstances()[1].GetLinks()["metron"].GetNode().GetId() != "metron-cell-2" {
		t.Fatalf("per instance: %v", resp.GetInstances())
	}
}

func TestLinksBadInputStoresNothing(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	linkDesire(t, env, linkLRP("mysql-a", "apps", 0, &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "db", Type: "mysql"}}}))
	linkDesire(t, env, linkLRP("mysql-b", "apps", 0, &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "db", Type: "mysql", As: "db-b"}}}))
	linkDesire(t, env, linkLRP("nats", "other", 0, &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "nats", Type: "nats"}}}))

	tests := []struct {
		name  string
		links *modelsv1.Links
		want  string
	}{
		{"unresolvable", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "cache", Type: "redis"}}},
			`desired_lrp.links.consumes[0]: link "cache": no provider of type "redis" in domain "apps"`},
		{"ambiguous type", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "db", Type: "mysql"}}},
			`desired_lrp.links.consumes[0]: link "db": 2 providers of type "mysql" in domain "apps": lrp "mysql-a" link "db", lrp "mysql-b" link "db" as "db-b"; set from to choose one`},
		{"cross-domain unshared", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "nats", From: "other.nats"}}},
			`desired_lrp.links.consumes[0]: link "nats": provider "nats" in domain "other" is not shared`},
		{"duplicate link name", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "db", From: "db"}, {Name: "db", From: "db-b"}}},
			`desired_lrp.links.consumes[1].name: duplicates the name "db" of desired_lrp.links.consumes[0]`},
		{"custom without nodes", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "ext", Custom: &modelsv1.ResolvedLink{}}}},
			`desired_lrp.links.consumes[0]: link "ext": custom link has no nodes`},
		{"every failure listed", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "cache", Type: "redis"}, {Name: "nats", From: "other.nats"}}},
			`desired_lrp.links.consumes[0]: link "cache": no provider of type "redis" in domain "apps"; desired_lrp.links.consumes[1]: link "nats": provider "nats" in domain "other" is not shared`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rev := lrpRevision(t, env)
			_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: linkLRP("web", "apps", 1, tt.links)})
			wantCode(t, err, codes.InvalidArgument)
			if msg := status.Convert(err).Message(); !strings.Contains(msg, tt.want) {
				t.Fatalf("message %q\ndoes not contain %q", msg, tt.want)
			}
			lrpWantRevision(t, env, rev, tt.name)
		})
	}
	// Resolving by from picks one of two providers of a type; an optional missing link is fine.
	linkDesire(t, env, linkLRP("web", "apps", 0, &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{
		{Name: "db", From: "db-b"}, {Name: "cache", Type: "redis", Optional: true},
	}}))
	resp, err := env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "web"})
	if err != nil || len(resp.GetLinks()) != 1 || resp.GetLinks()["db"] == nil {
		t.Fatalf("resolve web: %v %v", resp.GetLinks(), err)
	}
}

// TestLinksSecondProviderMakesConsumersAmbiguous: desiring a second provider of a type that a
// consumer finds by type is accepted (docs/links.md, LinkConsume.type); the consumer's
// LinksChanged event lists both candidates, ResolveLinks is FailedPrecondition and scaling it up
// InvalidArgument, until the extra provider goes and the consumer resolves again.
func TestLinksSecondProviderMakesConsumersAmbiguous(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	mysql := func(guid string) *modelsv1.DesiredLRP {
		return linkLRP(guid, "apps", 0, &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "db", Type: "mysql"}}})
	}
	linkDesire(t, env, mysql("mysql-a"))
	linkDesire(t, env, linkLRP("web", "apps", 1, &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "db", Type: "mysql"}}}))
	events := evSubscribe(t, env, 0, &bbsv1.Filter{ProcessGuids: []string{"web"}})
	events.waitBookmark()

	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: mysql("mysql-b")}); err != nil {
		t.Fatalf("desire a second mysql provider: %v, want it accepted", err)
	}
	const ambiguous = `link "db": 2 providers of type "mysql" in domain "apps": lrp "mysql-a" link "db", lrp "mysql-b" link "db"; set from to choose one`
	if lc := linkNext(t, events, "web"); len(lc.GetErrors()) != 1 || lc.GetErrors()[0] != ambiguous {
		t.Fatalf("LinksChanged after the second provider: %v, want the error %q", lc.GetErrors(), ambiguous)
	}
	_, err := env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "web"})
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(status.Convert(err).Message(), ambiguous) {
		t.Fatalf("ResolveLinks: %q does not list the candidates", status.Convert(err).Message())
	}
	rev := lrpRevision(t, env)
	_, err = env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Instances: ptr[int32](2)}})
	wantCode(t, err, codes.InvalidArgument)
	wantBadRequestField(t, err, "desired_lrp.links.consumes[0]")
	lrpWantRevision(t, env, rev, "refused scale-up of an ambiguous consumer")

	// The extra provider is not consumed by anyone (web resolves to neither): it goes unforced.
	if _, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "mysql-b"}); err != nil {
		t.Fatalf("remove the second provider: %v", err)
	}
	if lc := linkNext(t, events, "web"); len(lc.GetErrors()) != 0 {
		t.Fatalf("LinksChanged after the second provider went: %v, want no errors", lc.GetErrors())
	}
	if _, err := env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "web"}); err != nil {
		t.Fatalf("ResolveLinks once unambiguous: %v", err)
	}
}
