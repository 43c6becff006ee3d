package bbs_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// domNames lists the fresh domains with their TTLs, e.g. "apps:0".
func domNames(t *testing.T, env *bbstest.Env) []string {
	t.Helper()
	resp, err := env.Client.Domains(ctxT(t), &bbsv1.DomainsRequest{})
	if err != nil {
		t.Fatalf("Domains: %v", err)
	}
	if resp.GetRevision() == 0 {
		t.Fatal("Domains must return the revision it read")
	}
	var out []string
	for _, d := range resp.GetDomains() {
		out = append(out, fmt.Sprintf("%s:%d", d.GetName(), d.GetTtlSeconds()))
	}
	return out
}

func domUpsert(t *testing.T, env *bbstest.Env, name string, ttl int64) {
	t.Helper()
	if _, err := env.Client.UpsertDomain(ctxT(t), &bbsv1.UpsertDomainRequest{Domain: name, TtlSeconds: ttl}); err != nil {
		t.Fatalf("UpsertDomain %s: %v", name, err)
	}
}

// domLease is the etcd lease a domain's record is attached to.
func domLease(t *testing.T, env *bbstest.Env, name string) clientv3.LeaseID {
	t.Helper()
	resp, err := env.Etcd.Get(ctxT(t), store.DomainKey(name))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("domain %s in etcd: %v %v", name, resp, err)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

func TestDomainTTL(t *testing.T) {
	t.Parallel()
	env := bbstest.Start(t)
	ctx := ctxT(t)
	if got := domNames(t, env); len(got) != 0 {
		t.Fatalf("domains of a new BBS: %v", got)
	}
	domUpsert(t, env, "apps", 0)
	domUpsert(t, env, "temp", 2)
	// A TTL domain upserted without a TTL stays for good and leaves its lease behind.
	domUpsert(t, env, "sticky", 2)
	stickyLease := domLease(t, env, "sticky")
	domUpsert(t, env, "sticky", 0)
	if l := domLease(t, env, "sticky"); l != 0 {
		t.Fatalf("sticky still on lease %x", l)
	}
	if ttl, err := env.Etcd.TimeToLive(ctx, stickyLease); err != nil || ttl.TTL != -1 {
		t.Fatalf("the replaced lease was not revoked: %v %v", ttl, err)
	}
	if got, want := fmt.Sprint(domNames(t, env)), "[apps:0 sticky:0 temp:2]"; got != want {
		t.Fatalf("domains %s, want %s", got, want)
	}

	start := time.Now()
	for {
		got := fmt.Sprint(domNames(t, env))
		if got == "[apps:0 sticky:0]" {
			break
		}
		if got != "[apps:0 sticky:0 temp:2]" {
			t.Fatalf("domains %s while waiting for temp to expire", got)
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("domain with a 2s TTL still listed after 10s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("temp expired after %v, before its TTL", d)
	}
}

func TestDomainRefresh(t *testing.T) {
	t.Parallel()
	env := bbstest.Start(t)
	ctx := ctxT(t)
	domUpsert(t, env, "fresh", 2)
	first := domLease(t, env, "fresh")
	if first == 0 {
		t.Fatal("domain with a TTL is not on a lease")
	}
	// A refresh moves the record onto a new lease of the full TTL and revokes the first one
	// (UpsertDomain returns once the BBS's cache has the record, so the second call sees the
	// first lease): the domain outlives its first TTL without the test waiting that long.
	domUpsert(t, env, "fresh", 2)
	last := domLease(t, env, "fresh")
	if last == first {
		t.Fatal("refresh kept the first lease")
	}
	if ttl, err := env.Etcd.TimeToLive(ctx, first); err != nil || ttl.TTL != -1 {
		t.Fatalf("first lease still alive after the refresh: %v %v", ttl, err)
	}
	if ttl, err := env.Etcd.TimeToLive(ctx, last); err != nil || ttl.GrantedTTL != 2 || ttl.TTL <= 0 {
		t.Fatalf("the refreshed domain's lease: %v %v, want a live lease granted for 2s", ttl, err)
	}
	if got := fmt.Sprint(domNames(t, env)); got != "[fresh:2]" {
		t.Fatalf("refreshed domain: %s", got)
	}
	// Left alone, it expires.
	testkit.Eventually(t, 10*time.Second, func() bool { return len(domNames(t, env)) == 0 }, "domain expired after its last refresh")
}

func TestDomainValidation(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	for name, req := range map[string]*bbsv1.UpsertDomainRequest{
		"empty":        {Domain: ""},
		"space":        {Domain: "my apps"},
		"slash":        {Domain: "apps/x"},
		"unicode":      {Domain: "äpps"},
		"too long":     {Domain: strings.Repeat("a", 129)},
		"negative ttl": {Domain: "apps", TtlSeconds: -1},
	} {
		t.Run(name, func(t *testing.T) {
			before := storeRevision(t, env)
			_, err := env.Client.UpsertDomain(ctx, req)
			wantCode(t, err, codes.InvalidArgument)
			if storeRevision(t, env) != before {
				t.Fatal("refused upsert changed the store")
			}
		})
	}
	// The longest and the most varied valid names are accepted.
	domUpsert(t, env, strings.Repeat("a", 128), 0)
	domUpsert(t, env, "cf-apps_v2.example", 0)
	if got := domNames(t, env); len(got) != 2 {
		t.Fatalf("domains %v", got)
	}
}

// domRegisterCell writes a rep's presence under a fresh lease, as a rep does.
func domRegisterCell(t testing.TB, env *bbstest.Env, cell *modelsv1.CellPresence) clientv3.LeaseID {
	t.Helper()
	ctx := ctxT(t)
	lease, err := env.Etcd.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(cell)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Etcd.Put(ctx, store.CellKey(cell.GetCellId()), string(b), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	return lease.ID
}

func domCells(t *testing.T, env *bbstest.Env) ([]*modelsv1.CellPresence, string) {
	t.Helper()
	resp, err := env.Client.Cells(ctxT(t), &bbsv1.CellsRequest{})
	if err != nil {
		t.Fatalf("Cells: %v", err)
	}
	if resp.GetRevision() == 0 {
		t.Fatal("Cells must return the revision it read")
	}
	var ids []string
	for _, c := range resp.GetCells() {
		ids = append(ids, c.GetCellId())
	}
	return resp.GetCells(), fmt.Sprint(ids)
}

func domTags(t *testing.T, env *bbstest.Env) string {
	t.Helper()
	resp, err := env.Client.Tags(ctxT(t), &bbsv1.TagsRequest{})
	if err != nil {
		t.Fatalf("Tags: %v", err)
	}
	return fmt.Sprint(resp.GetTags())
}

func TestCellsAndTags(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	if _, ids := domCells(t, env); ids != "[]" {
		t.Fatalf("cells of a new BBS: %s", ids)
	}
	if got := domTags(t, env); got != "[]" {
		t.Fatalf("tags of a new BBS: %s", got)
	}
	cells := map[string]*modelsv1.CellPresence{
		"cell-b": {
			CellId: "cell-b", RepAddress: "10.0.0.2:1800", Zone: "z2", Address: "10.0.0.2",
			Capacity:          &modelsv1.CellCapacity{MemoryMb: 4096, DiskMb: 8192, Containers: 100},
			PlacementTags:     []string{"Staging", "skynet"},
			PreloadedRootfses: map[string]string{"cflinuxfs4": "/var/vcap/rootfs/cflinuxfs4"},
			RootfsProviders:   []string{"docker"},
		},
		"cell-a": {CellId: "cell-a", RepAddress: "10.0.0.1:1800", Zone: "z1", PlacementTags: []string{"staging"}},
		"cell-c": {CellId: "cell-c", RepAddress: "10.0.0.3:1800", Zone: "z1", PlacementTags: []string{"GPU", "skynet"}},
	}
	leases := map[string]clientv3.LeaseID{}
	for _, id := range []string{"cell-b", "cell-a", "cell-c"} {
		leases[id] = domRegisterCell(t, env, cells[id])
	}
	registered := storeRevision(t, env)
	testkit.Eventually(t, 10*time.Second, func() bool { _, ids := domCells(t, env); return ids == "[cell-a cell-b cell-c]" }, "cells listed")
	if resp, err := env.Client.Cells(ctx, &bbsv1.CellsRequest{}); err != nil || resp.GetRevision() < registered {
		t.Fatalf("Cells revision %d, want at least %d (the last registration) (%v)", resp.GetRevision(), registered, err)
	}
	listed, _ := domCells(t, env)
	for _, c := range listed {
		if !proto.Equal(c, cells[c.GetCellId()]) {
			t.Fatalf("listed %v\nwant %v", c, cells[c.GetCellId()])
		}
	}
	if got, want := domTags(t, env), "[gpu skynet staging]"; got != want {
		t.Fatalf("tags %s, want %s", got, want)
	}

	// A rep whose lease ends disappears, and so do the tags only it carried.
	if _, err := env.Etcd.Revoke(ctx, leases["cell-c"]); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { _, ids := domCells(t, env); return ids == "[cell-a cell-b]" }, "cell-c removed")
	if got, want := domTags(t, env), "[skynet staging]"; got != want {
		t.Fatalf("tags %s, want %s", got, want)
	}
	if _, err := env.Etcd.Revoke(ctx, leases["cell-b"]); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { _, ids := domCells(t, env); return ids == "[cell-a]" }, "cell-b removed")
	if got, want := domTags(t, env), "[staging]"; got != want {
		t.Fatalf("tags %s, want %s", got, want)
	}
}

func TestResolveLinks(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	plain := lrp("plain", 1)
	provider := lrp("db", 1)
	provider.Links = &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "db", Type: "postgres", Port: 8080}}}
	for _, d := range []*modelsv1.DesiredLRP{plain, provider} {
		if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
			t.Fatal(err)
		}
	}
	for _, guid := range []string{"plain", "db"} {
		resp, err := env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: guid})
		if err != nil {
			t.Fatalf("ResolveLinks %s: %v", guid, err)
		}
		if len(resp.GetLinks()) != 0 {
			t.Fatalf("ResolveLinks %s: %v, want none", guid, resp.GetLinks())
		}
	}
	_, err := env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "nope"})
	wantCode(t, err, codes.NotFound)
	_, err = env.Client.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: "bad guid"})
	wantCode(t, err, codes.InvalidArgument)
}
