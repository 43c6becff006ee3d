package bbs_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// portRoutes is a cf-router document of one HTTP route and TCP/UDP routes on the given
// "tcp:62000"-style ports.
func portRoutes(guid string, ports ...string) map[string][]byte {
	entries := []string{fmt.Sprintf(`{"port":8080,"routes":["%s.example.com"]}`, guid)}
	for _, p := range ports {
		proto, port, _ := strings.Cut(p, ":")
		entries = append(entries, fmt.Sprintf(`{"port":9000,"protocol":"%s","incoming_port":%s}`, proto, port))
	}
	return map[string][]byte{"cf-router": []byte("[" + strings.Join(entries, ",") + "]")}
}

func desireWithPorts(ctx context.Context, env *bbstest.Env, guid string, ports ...string) error {
	d := lrp(guid, 1)
	d.Routes = portRoutes(guid, ports...)
	_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
	return err
}

func updatePorts(ctx context.Context, env *bbstest.Env, guid string, ports ...string) error {
	_, err := env.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: guid,
		Update: &modelsv1.DesiredLRPUpdate{Routes: &modelsv1.RoutesUpdate{Routes: portRoutes(guid, ports...)}}})
	return err
}

// wantOwned checks err is AlreadyExists naming the owner, and that nothing was written.
func wantOwned(t *testing.T, env *bbstest.Env, before int64, err error, owner string) {
	t.Helper()
	if status.Code(err) != codes.AlreadyExists || !strings.Contains(status.Convert(err).Message(), fmt.Sprintf("owned by desired lrp %q", owner)) {
		t.Fatalf("got %v, want AlreadyExists naming owner %q", err, owner)
	}
	if after := storeRevision(t, env); after != before {
		t.Fatalf("refused request changed the store: revision %d -> %d", before, after)
	}
}

// TestIncomingPortOwnership: each (protocol, incoming_port) has one owner LRP; a conflicting
// desire or update is AlreadyExists naming the owner; an update moves the ports it owns and a
// removal frees them.
func TestIncomingPortOwnership(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	if err := desireWithPorts(ctx, env, "a", "tcp:62000", "udp:62000"); err != nil {
		t.Fatal(err)
	}
	// Another LRP cannot take a's TCP port, even beside a free one.
	before := storeRevision(t, env)
	wantOwned(t, env, before, desireWithPorts(ctx, env, "b", "tcp:62500", "tcp:62000"), "a")
	wantOwned(t, env, before, desireWithPorts(ctx, env, "b", "udp:62000"), "a")
	if err := desireWithPorts(ctx, env, "b", "tcp:62500"); err != nil {
		t.Fatal(err)
	}
	// a re-stating its own ports is fine; b cannot take a's port by update.
	if err := updatePorts(ctx, env, "a", "tcp:62000", "udp:62000"); err != nil {
		t.Fatalf("a keeps its own ports: %v", err)
	}
	before = storeRevision(t, env)
	wantOwned(t, env, before, updatePorts(ctx, env, "b", "tcp:62500", "tcp:62000"), "a")

	// a moves tcp 62000 → 62001: 62000 is free, 62001 is a's.
	if err := updatePorts(ctx, env, "a", "tcp:62001", "udp:62000"); err != nil {
		t.Fatal(err)
	}
	if err := desireWithPorts(ctx, env, "c", "tcp:62000"); err != nil {
		t.Fatalf("the port a moved away from is still held: %v", err)
	}
	before = storeRevision(t, env)
	wantOwned(t, env, before, desireWithPorts(ctx, env, "d", "tcp:62001"), "a")

	// Removing a frees its ports.
	if _, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := desireWithPorts(ctx, env, "d", "tcp:62001", "udp:62000"); err != nil {
		t.Fatalf("the ports of the removed lrp are still held: %v", err)
	}
	// An update dropping every TCP route frees them too.
	if err := updatePorts(ctx, env, "d"); err != nil {
		t.Fatal(err)
	}
	if err := desireWithPorts(ctx, env, "e", "tcp:62001", "udp:62000"); err != nil {
		t.Fatalf("ports dropped by an update are still held: %v", err)
	}
}

// TestIncomingPortRace: LRPs desired at once through two BBS instances all ask for one TCP
// port; exactly one wins, every other gets AlreadyExists naming the winner.
func TestIncomingPortRace(t *testing.T) {
	env := bbstest.Start(t)
	other := bbstest.StartOn(t, env.Etcd)
	ctx := ctxT(t)
	const racers = 12
	errs := make([]error, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			e := env
			if i%2 == 1 {
				e = other
			}
			errs[i] = desireWithPorts(ctx, e, fmt.Sprintf("racer-%d", i), "tcp:63000")
		}()
	}
	close(start)
	wg.Wait()
	winner := ""
	for i, err := range errs {
		if err == nil {
			if winner != "" {
				t.Fatalf("both %s and racer-%d own tcp port 63000", winner, i)
			}
			winner = fmt.Sprintf("racer-%d", i)
		}
	}
	if winner == "" {
		t.Fatalf("nobody won the port: %v", errs)
	}
	for i, err := range errs {
		if err != nil && (status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), fmt.Sprintf("%q", winner))) {
			t.Fatalf("racer-%d: %v, want AlreadyExists naming %s", i, err, winner)
		}
	}
	// Exactly one desired LRP exists among the racers.
	resp, err := env.Client.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetDesiredLrps()); n != 1 {
		t.Fatalf("%d desired lrps stored, want only the winner", n)
	}
}
