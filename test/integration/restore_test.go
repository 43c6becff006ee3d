package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/backup"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/nsync"
	"github.com/gavel-sched/gavel/services/rep"
)

// startEtcdAt runs an embedded etcd on dir at fixed client and peer addresses (so that a
// restored member can take the stopped one's place); the caller closes it.
func startEtcdAt(t *testing.T, dir, client, peer string) *etcdembed.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e, err := etcdembed.Start(ctx, etcdembed.Config{Dir: dir, ClientAddr: client, PeerAddr: peer, UnsafeNoFsync: true, Quiet: true, FastElection: true})
	if err != nil {
		t.Fatalf("start etcd on %s: %v", dir, err)
	}
	return e
}

// TestBackupRestoreKeepsRunningWork is the acceptance test "Backup and restore, end to end":
// a cluster runs 20 LRPs on two process cells (real processes, each appending its pid to a
// file of its LRP when it starts); `gavel backup`'s Save takes a backup; 5 LRPs are desired and
// 3 removed; etcd is stopped, the backup restored into a new data directory and a new etcd
// started on it at the same address, while the BBS, auctioneer and reps keep running. The BBS
// re-lists (the restored revisions are marked compacted), and the cluster converges to the
// restored desired state: the 17 LRPs unchanged since the backup keep their instance guid and
// process (zero restarts), the 3 removed after the backup are desired again and run again, and
// the 5 desired after the backup are unknown to the restored store but not silently killed: the
// reps report them and the BBS records them as extra instances, which domain freshness decides —
// the 3 in domain "it" (fresh in the restored store) are retired by convergence, the 2 in domain
// "late" (created after the backup, so stale in the restored store) keep running, same process.
func TestBackupRestoreKeepsRunningWork(t *testing.T) {
	starts := t.TempDir() // <guid> files: one line per process start
	var cells []devcluster.Cell
	for i := range 2 {
		cfg := rep.Default()
		cfg.CellID, cfg.Zone = fmt.Sprintf("cell-%d", i), "z1"
		cfg.Backend = rep.BackendProcess
		cfg.WorkDir = t.TempDir()
		cfg.PreloadedRootfses = map[string]string{"x": t.TempDir()}
		cfg.Capacity = rep.Capacity{MemoryMB: 8192, DiskMB: 8192, Containers: 40}
		cfg.BulkInterval = rep.Duration(500 * time.Millisecond)
		cells = append(cells, devcluster.Cell{Config: cfg})
	}
	etcdDir, client, peer := filepath.Join(t.TempDir(), "etcd"), testkit.ReservedAddr(t), testkit.ReservedAddr(t) // reserved: etcd binds them again after the restore
	// Whichever etcd runs is closed after the cluster has stopped (cleanups run last first).
	var current *etcdembed.Server
	t.Cleanup(func() { _ = current.Close() })
	current = startEtcdAt(t, etcdDir, client, peer)
	c := startClusterWith(t, devcluster.Config{Cells: cells, EtcdEndpoints: []string{"http://" + client},
		ConfigureBBS: func(cfg *bbs.Config) { cfg.ConvergenceInterval = bbs.Duration(500 * time.Millisecond) }})
	ctx := context.Background()
	if _, err := c.BBS.UpsertDomain(ctx, &bbsv1.UpsertDomainRequest{Domain: "it", TtlSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	desire := func(guid, domain string) {
		d := desiredLRP(guid, "preloaded:x", 1, nil)
		d.Domain = domain
		d.Ports = nil
		d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/sh",
			Args: []string{"-c", fmt.Sprintf("echo $$ >> %s; exec sleep 600", filepath.Join(starts, guid))}}}}
		if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
			t.Fatalf("desire %s: %v", guid, err)
		}
	}
	// running returns guid → instance guid of every RUNNING instance.
	running := func() map[string]string {
		resp, err := c.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
		if err != nil {
			t.Fatalf("ActualLRPs: %v", err)
		}
		out := map[string]string{}
		for _, a := range resp.GetActualLrps() {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
				out[a.GetKey().GetProcessGuid()] = a.GetInstanceKey().GetInstanceGuid()
			}
		}
		return out
	}
	pids := func(guid string) []string {
		b, _ := os.ReadFile(filepath.Join(starts, guid))
		return strings.Fields(string(b))
	}
	waitRunning := func(what string, want ...string) map[string]string {
		var got map[string]string
		testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
			got = running()
			missing := 0
			for _, g := range want {
				if got[g] == "" || len(pids(g)) == 0 {
					missing++
				}
			}
			return missing == 0, fmt.Sprintf("%d of %d not running", missing, len(want))
		}, what)
		return got
	}
	var orig, added []string
	for i := range 20 {
		orig = append(orig, fmt.Sprintf("lrp-%02d", i))
		desire(orig[i], "it")
	}
	t.Log("cluster up; 20 LRPs desired")
	before := waitRunning("the 20 LRPs running", orig...)
	t.Log("20 LRPs running")
	beforePids := map[string][]string{}
	for _, g := range orig {
		beforePids[g] = pids(g)
	}

	file := filepath.Join(t.TempDir(), "gavel.backup")
	m, err := backup.Save(ctx, c.Etcd, file)
	if err != nil {
		t.Fatal(err)
	}
	if m.Layouts["bbs"] != bbs.LayoutVersion {
		t.Fatalf("backup manifest %+v", m)
	}

	if _, err := c.BBS.UpsertDomain(ctx, &bbsv1.UpsertDomainRequest{Domain: "late", TtlSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		added = append(added, fmt.Sprintf("new-%d", i))
		domain := "it"
		if i >= 3 {
			domain = "late"
		}
		desire(added[i], domain)
	}
	addedBefore := waitRunning("the 5 LRPs desired after the backup running", added...)
	retiredExtras, keptExtras := added[:3], added[3:]
	t.Log("5 more running")
	removed := orig[:3]
	for _, g := range removed {
		if _, err := c.BBS.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: g}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		r := running()
		n := 0
		for _, g := range removed {
			if r[g] != "" {
				n++
			}
		}
		return n == 0, fmt.Sprintf("%d removed LRPs still running", n)
	}, "the 3 removed LRPs gone")

	// Stop etcd, restore the backup into a new directory, start etcd on it at the same address.
	if err := current.Close(); err != nil {
		t.Fatal(err)
	}
	restoredDir := filepath.Join(t.TempDir(), "restored")
	if _, err := backup.Restore(file, backup.RestoreConfig{DataDir: restoredDir, PeerURLs: []string{"http://" + peer},
		KnownLayouts: map[string]int{"bbs": bbs.LayoutVersion, "nsync": nsync.LayoutVersion}}); err != nil {
		t.Fatal(err)
	}
	current = startEtcdAt(t, restoredDir, client, peer)
	t.Log("restored etcd started")

	// The restored desired state: the 20 of the backup. The 3 removed since run again; the 5
	// added since are reported as extra: those of the fresh domain are retired, those of the
	// stale one keep running as they were.
	after := waitRunning("the 20 LRPs of the backup running again", orig...)
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		r := running()
		var state []string
		for _, g := range retiredExtras {
			if r[g] != "" {
				state = append(state, g+" (fresh domain) still running")
			}
		}
		for _, g := range keptExtras {
			if r[g] != addedBefore[g] {
				state = append(state, fmt.Sprintf("%s (stale domain): instance %q, want the one running before the restore %q", g, r[g], addedBefore[g]))
			}
		}
		resp, err := c.BBS.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
		if err != nil {
			return false, err.Error()
		}
		if len(resp.GetDesiredLrps()) != 20 {
			state = append(state, fmt.Sprintf("%d desired", len(resp.GetDesiredLrps())))
		}
		return len(state) == 0, strings.Join(state, "; ")
	}, "the store as it was at the backup, with the stale domain's extras kept")
	for _, g := range keptExtras {
		if p := pids(g); len(p) != 1 {
			t.Errorf("%s (stale domain, reported as extra): process starts %v, want one", g, p)
		}
	}
	restarts := 0
	for _, g := range orig[3:] {
		if after[g] != before[g] {
			t.Errorf("%s: instance guid %s → %s", g, before[g], after[g])
		}
		if p := pids(g); len(p) != 1 || p[0] != beforePids[g][0] {
			restarts += len(p) - 1
			t.Errorf("%s: process starts %v, want only %v", g, p, beforePids[g])
		}
	}
	// The removed LRPs' restored records name containers their cells no longer hold: the reps
	// remove those records, and convergence places the instances again.
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		r := running()
		var state []string
		for _, g := range removed {
			if len(pids(g)) != 2 || r[g] == "" || r[g] == before[g] {
				state = append(state, fmt.Sprintf("%s: starts %v, instance %q (was %q)", g, pids(g), r[g], before[g]))
			}
		}
		return len(state) == 0, strings.Join(state, "; ")
	}, "the LRPs removed after the backup started again")
	// No duplicates: one instance record per LRP of the backup and per kept extra, none of the
	// retired extras.
	resp, err := c.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	records := map[string]int{}
	for _, a := range resp.GetActualLrps() {
		records[a.GetKey().GetProcessGuid()]++
	}
	for _, g := range orig {
		if records[g] != 1 {
			t.Errorf("%s has %d instance records, want 1", g, records[g])
		}
	}
	for _, g := range retiredExtras {
		if records[g] != 0 {
			t.Errorf("%s (desired after the backup, fresh domain) has %d instance records", g, records[g])
		}
	}
	for _, g := range keptExtras {
		if records[g] != 1 {
			t.Errorf("%s (desired after the backup, stale domain) has %d instance records, want 1", g, records[g])
		}
	}
	t.Logf("restarts of the 17 unchanged LRPs: %d", restarts)
}
