package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

func TestLinksCommand(t *testing.T) {
	env := bbstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lrp := func(guid string, l *modelsv1.Links) *modelsv1.DesiredLRP {
		return &modelsv1.DesiredLRP{
			ProcessGuid: guid, Domain: "apps", Rootfs: "preloaded:cflinuxfs4", Instances: 1, MemoryMb: 64, DiskMb: 64,
			Ports: []uint32{8080}, Links: l,
			Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/app"}}},
		}
	}
	for _, d := range []*modelsv1.DesiredLRP{
		lrp("db", &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "db", Type: "mysql", Port: 8080, Properties: map[string]string{"user": "admin"}}}}),
		lrp("web", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "db", Type: "mysql"}}}),
	} {
		if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
			t.Fatal(err)
		}
	}
	ik := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "db-0", CellId: "cell-1"}
	if _, err := env.Client.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "db", InstanceKey: ik}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: "db", InstanceKey: ik, NetInfo: &modelsv1.ActualLRPNetInfo{
		Address: "10.0.0.1", InstanceAddress: "10.0.0.1", Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 61000}},
	}}); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := runLinks(ctx, env.Client, []string{"web"}, &out); err != nil {
		t.Fatal(err)
	}
	want := "LINK  INDEX  ID    AZ  ADDRESS\ndb    0      db-0      10.0.0.1:61000\ndb properties: user=admin\n"
	if out.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := runLinks(ctx, env.Client, []string{"-json", "web"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"address": "10.0.0.1:61000"`) || !strings.Contains(out.String(), `"index": 0`) {
		t.Fatalf("json:\n%s", out.String())
	}
	if err := runLinks(ctx, env.Client, nil, &out); err == nil || err.Error() != linksUsage {
		t.Fatalf("without a guid: %v", err)
	}
}
