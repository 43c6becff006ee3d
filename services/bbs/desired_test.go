package bbs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func lrp(guid string, instances int32) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid,
		Domain:      "apps",
		Rootfs:      "preloaded:cflinuxfs4",
		Instances:   instances,
		MemoryMb:    128,
		DiskMb:      256,
		Ports:       []uint32{8080},
		Labels:      map[string]string{"app": guid},
		Properties:  map[string]string{"network.app_guid": "g-" + guid},
		Routes:      map[string][]byte{"cf-router": []byte(`[{"port":8080,"routes":["` + guid + `.example.com"]}]`)},
		Action:      &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
	}
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v (%v), want %v", status.Code(err), err, code)
	}
}

func actuals(t *testing.T, env *bbstest.Env, guid string) []*modelsv1.ActualLRP {
	t.Helper()
	resp, err := env.Client.ActualLRPs(ctxT(t), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}})
	if err != nil {
		t.Fatalf("ActualLRPs: %v", err)
	}
	return resp.GetActualLrps()
}

func TestDesireLRPCreatesUnclaimedInstances(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	d := lrp("web", 3)
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatal(err)
	}
	got, err := env.Client.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	stored := got.GetDesiredLrp()
	if stored.GetModificationTag().GetEpoch() == "" {
		t.Fatal("modification tag not assigned")
	}
	stored.ModificationTag = nil
	if !proto.Equal(stored, d) {
		t.Fatalf("stored %v\nwant %v", stored, d)
	}
	as := actuals(t, env, "web")
	if len(as) != 3 {
		t.Fatalf("got %d actuals, want 3", len(as))
	}
	for i, a := range as {
		if a.GetKey().GetIndex() != int32(i) || a.GetState() != modelsv1.ActualLRP_STATE_UNCLAIMED || a.GetPresence() != modelsv1.ActualLRP_PRESENCE_ORDINARY {
			t.Fatalf("actual %d: %v", i, a)
		}
	}
	// Desiring the same guid again changes nothing.
	before, _ := env.Etcd.Get(ctx, "/gavel")
	_, err = env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 5)})
	wantCode(t, err, codes.AlreadyExists)
	after, _ := env.Etcd.Get(ctx, "/gavel")
	if before.Header.Revision != after.Header.Revision {
		t.Fatalf("a refused desire changed the store: revision %d -> %d", before.Header.Revision, after.Header.Revision)
	}
	if n := len(actuals(t, env, "web")); n != 3 {
		t.Fatalf("got %d actuals after refused desire", n)
	}
}

func TestListFilters(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	for i, spec := range []struct{ guid, domain, tier string }{{"a", "apps", "web"}, {"b", "apps", "db"}, {"c", "other", "web"}} {
		d := lrp(spec.guid, int32(i+1))
		d.Domain = spec.domain
		d.Labels = map[string]string{"tier": spec.tier, "env": fmt.Sprintf("e%d", i)}
		if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		filter  *bbsv1.Filter
		desired []string
		actual  int
	}{
		{"all", nil, []string{"a", "b", "c"}, 6},
		{"domain", &bbsv1.Filter{Domain: "apps"}, []string{"a", "b"}, 3},
		{"guids", &bbsv1.Filter{ProcessGuids: []string{"c", "a"}}, []string{"a", "c"}, 4},
		{"selector eq", &bbsv1.Filter{LabelSelector: "tier=web"}, []string{"a", "c"}, 4},
		{"selector ne and in", &bbsv1.Filter{LabelSelector: "tier!=db,env in (e0,e1,e2)"}, []string{"a", "c"}, 4},
		{"selector and domain", &bbsv1.Filter{Domain: "apps", LabelSelector: "tier"}, []string{"a", "b"}, 3},
		{"no match", &bbsv1.Filter{LabelSelector: "!tier"}, nil, 0},
		{"cell", &bbsv1.Filter{CellId: "cell-1"}, []string{"a", "b", "c"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dr, err := env.Client.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{Filter: tt.filter})
			if err != nil {
				t.Fatal(err)
			}
			var guids []string
			for _, d := range dr.GetDesiredLrps() {
				guids = append(guids, d.GetProcessGuid())
			}
			if fmt.Sprint(guids) != fmt.Sprint(tt.desired) {
				t.Fatalf("desired %v, want %v", guids, tt.desired)
			}
			si, err := env.Client.DesiredLRPSchedulingInfos(ctx, &bbsv1.DesiredLRPSchedulingInfosRequest{Filter: tt.filter})
			if err != nil {
				t.Fatal(err)
			}
			if len(si.GetSchedulingInfos()) != len(tt.desired) {
				t.Fatalf("scheduling infos %d, want %d", len(si.GetSchedulingInfos()), len(tt.desired))
			}
			ar, err := env.Client.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: tt.filter})
			if err != nil {
				t.Fatal(err)
			}
			if len(ar.GetActualLrps()) != tt.actual {
				t.Fatalf("actuals %d, want %d", len(ar.GetActualLrps()), tt.actual)
			}
			if dr.GetRevision() == 0 || ar.GetRevision() == 0 {
				t.Fatal("lists must return the revision they read")
			}
		})
	}
	idx := int32(1)
	ar, err := env.Client.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{"c"}}, Index: &idx})
	if err != nil || len(ar.GetActualLrps()) != 1 || ar.GetActualLrps()[0].GetKey().GetIndex() != 1 {
		t.Fatalf("index filter: %v %v", ar.GetActualLrps(), err)
	}
}

func TestUpdateDesiredLRP(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 2)}); err != nil {
		t.Fatal(err)
	}
	four := int32(4)
	note := "v2"
	resp, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{
		Instances:  &four,
		Annotation: &note,
		Routes:     &modelsv1.RoutesUpdate{Routes: map[string][]byte{"skydns": []byte(`{"host":"web.skydns.local"}`)}},
		Labels:     &modelsv1.LabelsUpdate{Labels: map[string]string{"app": "web", "v": "2"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	d := resp.GetDesiredLrp()
	if d.GetInstances() != 4 || d.GetAnnotation() != "v2" || string(d.GetRoutes()["skydns"]) != `{"host":"web.skydns.local"}` || len(d.GetRoutes()) != 1 || d.GetLabels()["v"] != "2" {
		t.Fatalf("update not applied: %v", d)
	}
	if d.GetModificationTag().GetIndex() != 1 {
		t.Fatalf("modification tag index %d, want 1", d.GetModificationTag().GetIndex())
	}
	if n := len(actuals(t, env, "web")); n != 4 {
		t.Fatalf("scale up: %d actuals, want 4", n)
	}
	one := int32(1)
	if _, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Instances: &one}}); err != nil {
		t.Fatal(err)
	}
	if n := len(actuals(t, env, "web")); n != 1 {
		t.Fatalf("scale down: %d actuals, want 1", n)
	}

	// A stale expected tag is a lost compare-and-swap.
	_, err = env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", ExpectedModificationTag: d.GetModificationTag(), Update: &modelsv1.DesiredLRPUpdate{Instances: &four}})
	wantCode(t, err, codes.Aborted)

	// Immutable fields.
	rootfs := "preloaded:other"
	for name, u := range map[string]*modelsv1.DesiredLRPUpdate{
		"rootfs":     {Rootfs: &rootfs},
		"ports":      {Ports: &modelsv1.PortsUpdate{Ports: []uint32{9090}}},
		"constraint": {PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{"gpu"}}},
	} {
		t.Run("immutable "+name, func(t *testing.T) {
			before, _ := env.Etcd.Get(ctx, "/gavel")
			_, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: u})
			wantCode(t, err, codes.InvalidArgument)
			after, _ := env.Etcd.Get(ctx, "/gavel")
			if before.Header.Revision != after.Header.Revision {
				t.Fatal("refused update changed the store")
			}
		})
	}
	// Repeating an immutable field with its stored value is fine.
	same := "preloaded:cflinuxfs4"
	if _, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Rootfs: &same, Ports: &modelsv1.PortsUpdate{Ports: []uint32{8080}}}}); err != nil {
		t.Fatal(err)
	}
	_, err = env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "nope", Update: &modelsv1.DesiredLRPUpdate{Instances: &one}})
	wantCode(t, err, codes.NotFound)
}

func TestRemoveDesiredLRP(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 3)}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"}); err != nil {
		t.Fatal(err)
	}
	_, err := env.Client.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
	wantCode(t, err, codes.NotFound)
	if n := len(actuals(t, env, "web")); n != 0 {
		t.Fatalf("%d actuals left", n)
	}
	_, err = env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"})
	wantCode(t, err, codes.NotFound)
	keys, _ := env.Etcd.Get(ctx, store.Root, clientPrefix()...)
	if len(keys.Kvs) != 1 || string(keys.Kvs[0].Key) != "/gavel/v1/layout/bbs" { // the layout version stays
		t.Fatalf("keys left in etcd: %v", keys.Kvs)
	}
}
