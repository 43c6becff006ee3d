package rep_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/rep/internal/presence"
)

const (
	ordinary   = modelsv1.ActualLRP_PRESENCE_ORDINARY
	evacuating = modelsv1.ActualLRP_PRESENCE_EVACUATING
)

func cellOf(t *testing.T, env *bbstest.Env, id string) *modelsv1.CellPresence {
	t.Helper()
	resp, err := env.Client.Cells(ctxT(t), &bbsv1.CellsRequest{})
	if err != nil {
		t.Fatalf("Cells: %v", err)
	}
	for _, c := range resp.GetCells() {
		if c.GetCellId() == id {
			return c
		}
	}
	return nil
}

// TestPresence: the cell appears in the BBS with every field, comes back under a new lease when
// its lease is revoked behind the rep's back, and disappears when the rep stops.
func TestPresence(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env)
	want := &modelsv1.CellPresence{
		CellId:            r.cfg.CellID,
		RepAddress:        r.svc.Addr().String(),
		Zone:              "z1",
		Capacity:          &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 4096, Containers: 10},
		PlacementTags:     []string{"skynet", "staging"},
		PreloadedRootfses: r.cfg.PreloadedRootfses,
		RootfsProviders:   []string{"docker"},
		Address:           "127.0.0.1",
	}
	var got *modelsv1.CellPresence
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		got = cellOf(t, env, r.cfg.CellID)
		return proto.Equal(got, want), fmt.Sprint(got)
	}, "cell in BBS Cells")

	key := presence.CellKey(r.cfg.CellID)
	kv, err := env.Etcd.Get(ctxT(t), key)
	if err != nil || len(kv.Kvs) != 1 {
		t.Fatalf("get %s: %v %v", key, kv, err)
	}
	oldLease := kv.Kvs[0].Lease
	if _, err := env.Etcd.Revoke(ctxT(t), clientv3.LeaseID(oldLease)); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		kv, err := env.Etcd.Get(ctxT(t), key)
		if err != nil || len(kv.Kvs) != 1 {
			return false, fmt.Sprint(kv, err)
		}
		return kv.Kvs[0].Lease != oldLease, fmt.Sprintf("lease %x", kv.Kvs[0].Lease)
	}, "presence re-registered under a new lease")
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		got = cellOf(t, env, r.cfg.CellID)
		return proto.Equal(got, want), fmt.Sprint(got)
	}, "cell back in BBS Cells")

	// A deleted key (lease intact) is written again too.
	if _, err := env.Etcd.Delete(ctxT(t), key); err != nil {
		t.Fatalf("delete: %v", err)
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		kv, err := env.Etcd.Get(ctxT(t), key)
		return err == nil && len(kv.Kvs) == 1, fmt.Sprint(kv, err)
	}, "presence rewritten after deletion")

	r.stop()
	kv, err = env.Etcd.Get(ctxT(t), key)
	if err != nil || len(kv.Kvs) != 0 {
		t.Fatalf("presence after stop: %v %v, want it revoked", kv, err)
	}
}

// TestStateReflectsReservations: State reports capacity, what the cell supports, what it holds
// and what is left.
func TestStateReflectsReservations(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) { c.Sim.StartLatency = rep.Duration(3 * time.Second) })
	d := desiredLRP("web", 2)
	desire(t, env, d)
	tw := desireTask(t, env, "job-1")
	resp := perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0), lrpWork(d, 1)}, []*repv1.TaskWork{tw})
	if len(resp.GetFailedLrps()) != 0 || len(resp.GetFailedTasks()) != 0 {
		t.Fatalf("Perform refused %v", resp)
	}
	st := state(t, r)
	if st.GetCellId() != r.cfg.CellID || st.GetZone() != "z1" || st.GetEvacuating() {
		t.Fatalf("state identity %v", st)
	}
	if !proto.Equal(st.GetTotalResources(), &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 4096, Containers: 10}) {
		t.Fatalf("total %v", st.GetTotalResources())
	}
	wantAvail := &modelsv1.CellCapacity{MemoryMb: 1024 - 2*128 - 64, DiskMb: 4096 - 2*256 - 128, Containers: 7}
	if !proto.Equal(st.GetAvailableResources(), wantAvail) {
		t.Fatalf("available %v, want %v", st.GetAvailableResources(), wantAvail)
	}
	if !slices.Equal(st.GetPlacementTags(), []string{"skynet", "staging"}) || !slices.Equal(st.GetPreloadedRootfses(), []string{"cflinuxfs4"}) ||
		!slices.Equal(st.GetRootfsProviders(), []string{"docker"}) || len(st.GetNotes()) == 0 {
		t.Fatalf("state support %v", st)
	}
	// Both instances are starting (3 s of start latency); the task counts as starting only until
	// its container exists, which races with this State call.
	if n := st.GetStartingContainerCount(); len(st.GetLrps()) != 2 || len(st.GetTasks()) != 1 || n < 2 || n > 3 {
		t.Fatalf("held %v / %v, starting %d", st.GetLrps(), st.GetTasks(), st.GetStartingContainerCount())
	}
	for _, l := range st.GetLrps() {
		if l.GetKey().GetProcessGuid() != "web" || l.GetInstanceGuid() == "" || l.GetRootfs() != "preloaded:cflinuxfs4" || l.GetResources().GetMemoryMb() != 128 {
			t.Fatalf("held lrp %v", l)
		}
	}
	if st.GetTasks()[0].GetTaskGuid() != "job-1" || st.GetTasks()[0].GetDomain() != "jobs" {
		t.Fatalf("held task %v", st.GetTasks()[0])
	}
	// The summary the auctioneer asks for: the same capacity, support and starting count, the
	// instances counted per process guid, no lists.
	sum, err := r.client.State(ctxT(t), &repv1.StateRequest{Summary: true})
	if err != nil {
		t.Fatalf("State summary: %v", err)
	}
	if len(sum.GetLrps()) != 0 || len(sum.GetTasks()) != 0 || !maps.Equal(sum.GetLrpInstances(), map[string]int32{"web": 2}) ||
		!proto.Equal(sum.GetAvailableResources(), wantAvail) || sum.GetStartingContainerCount() < 2 ||
		!slices.Equal(sum.GetPlacementTags(), st.GetPlacementTags()) || !slices.Equal(sum.GetPreloadedRootfses(), st.GetPreloadedRootfses()) {
		t.Fatalf("summary %v, want the state with {web: 2} instead of the lists", sum)
	}
	if len(st.GetLrpInstances()) != 0 {
		t.Fatalf("full state carries counts %v", st.GetLrpInstances())
	}
	// Once running, the instances are no longer starting; the finished task frees its room.
	waitRunning(t, env, r, "web", 0)
	waitRunning(t, env, r, "web", 1)
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		st = state(t, r)
		return len(st.GetTasks()) == 0 && st.GetStartingContainerCount() == 0 && st.GetAvailableResources().GetContainers() == 8, fmt.Sprint(st)
	}, "task released")
}

// TestLRPRunsAndStops: a performed instance ends RUNNING in the BBS with the sim's net info;
// StopLRPInstance stops it and removes the record, also for a record without a container.
func TestLRPRunsAndStops(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env)
	d := desiredLRP("web", 2)
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	a := waitRunning(t, env, r, "web", 0)
	net := a.GetNetInfo()
	if net.GetAddress() != "127.0.0.1" || net.GetInstanceAddress() != "127.0.0.1" || len(net.GetPorts()) != 1 ||
		net.GetPorts()[0].GetContainerPort() != 8080 || net.GetPorts()[0].GetHostPort() < 61000 || net.GetPorts()[0].GetHostPort() > 61999 {
		t.Fatalf("net info %v", net)
	}
	if !a.GetRoutable() || a.GetZone() != "z1" {
		t.Fatalf("record %v, want routable in z1", a)
	}
	st := state(t, r)
	if len(st.GetLrps()) != 1 || st.GetLrps()[0].GetInstanceGuid() != a.GetInstanceKey().GetInstanceGuid() {
		t.Fatalf("state lrps %v, want the running instance", st.GetLrps())
	}

	if _, err := r.client.StopLRPInstance(ctxT(t), &repv1.StopLRPInstanceRequest{Key: a.GetKey(), InstanceKey: a.GetInstanceKey()}); err != nil {
		t.Fatalf("StopLRPInstance: %v", err)
	}
	if got := actual(t, env, "web", 0, ordinary); got != nil {
		t.Fatalf("record after stop: %v", got)
	}
	if st := state(t, r); len(st.GetLrps()) != 0 || st.GetAvailableResources().GetContainers() != 10 {
		t.Fatalf("state after stop: %v", st)
	}

	// A record naming this cell whose container is unknown is removed too.
	ghost := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ghost", CellId: r.cfg.CellID}
	if _, err := env.Client.ClaimActualLRP(ctxT(t), &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 1, InstanceKey: ghost}); err != nil {
		t.Fatalf("claim: %v", err)
	}
	key1 := &modelsv1.ActualLRPKey{ProcessGuid: "web", Index: 1, Domain: "apps"}
	if _, err := r.client.StopLRPInstance(ctxT(t), &repv1.StopLRPInstanceRequest{Key: key1, InstanceKey: ghost}); err != nil {
		t.Fatalf("StopLRPInstance of an unknown container: %v", err)
	}
	if got := actual(t, env, "web", 1, ordinary); got != nil {
		t.Fatalf("record after stop: %v", got)
	}
	// Another cell's instance is refused; bad input is InvalidArgument.
	other := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "x", CellId: "elsewhere"}
	if _, err := r.client.StopLRPInstance(ctxT(t), &repv1.StopLRPInstanceRequest{Key: key1, InstanceKey: other}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stop of another cell's instance: %v, want FailedPrecondition", err)
	}
	if _, err := r.client.StopLRPInstance(ctxT(t), &repv1.StopLRPInstanceRequest{Key: key1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("stop without instance key: %v, want InvalidArgument", err)
	}
}

// TestPerformRefusals: work beyond capacity, with an unknown rootfs, or duplicated is
// returned as failed; the rest is taken.
func TestPerformRefusals(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) {
		c.Capacity = rep.Capacity{MemoryMB: 1024, DiskMB: 4096, Containers: 3}
	})
	big := func(guid string, mem int32) *repv1.LRPInstance {
		return &repv1.LRPInstance{Key: &modelsv1.ActualLRPKey{ProcessGuid: guid, Domain: "apps"},
			Resources: &modelsv1.Resources{MemoryMb: mem, DiskMb: 10}, Rootfs: "preloaded:cflinuxfs4"}
	}
	resp := perform(t, r, []*repv1.LRPInstance{big("a", 512), big("b", 512), big("c", 512)}, nil)
	if len(resp.GetFailedLrps()) != 1 || resp.GetFailedLrps()[0].GetKey().GetProcessGuid() != "c" {
		t.Fatalf("failed %v, want only c (no memory left)", resp.GetFailedLrps())
	}

	r2 := startRep(t, env, func(c *rep.Config) {
		c.Capacity = rep.Capacity{MemoryMB: 1024, DiskMB: 4096, Containers: 1}
	})
	unsupported := big("old", 1)
	unsupported.Rootfs = "preloaded:lucid64"
	noProvider := big("oci", 1)
	noProvider.Rootfs = "oci:///library/redis#7"
	docker := big("redis", 1)
	docker.Rootfs = "docker:///library/redis#7"
	resp = perform(t, r2, []*repv1.LRPInstance{unsupported, noProvider, docker, big("one-too-many", 1)},
		[]*repv1.TaskWork{{TaskGuid: "t", Domain: "jobs", Rootfs: "preloaded:cflinuxfs4", Resources: &modelsv1.Resources{}}})
	var failed []string
	for _, l := range resp.GetFailedLrps() {
		failed = append(failed, l.GetKey().GetProcessGuid())
	}
	if !slices.Equal(failed, []string{"old", "oci", "one-too-many"}) || len(resp.GetFailedTasks()) != 1 {
		t.Fatalf("failed %v / %v, want old, oci, one-too-many and the task (no container left)", failed, resp.GetFailedTasks())
	}

	if _, err := r.client.Perform(ctxT(t), &repv1.PerformRequest{Lrps: []*repv1.LRPInstance{{Rootfs: "nope"}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Perform of bad input: %v, want InvalidArgument", err)
	}
}

// TestTaskCompletes: a performed task ends COMPLETED with the sim's result; a cancelled one is
// stopped.
func TestTaskCompletes(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) { c.Sim.StartLatency = rep.Duration(1500 * time.Millisecond) })
	perform(t, r, nil, []*repv1.TaskWork{desireTask(t, env, "job-ok"), desireTask(t, env, "job-cancel")})
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		tk := task(t, env, "job-cancel")
		return tk.GetState() == modelsv1.Task_STATE_RUNNING && tk.GetCellId() == r.cfg.CellID, fmt.Sprint(tk)
	}, "job-cancel RUNNING")
	if _, err := env.Client.CancelTask(ctxT(t), &bbsv1.CancelTaskRequest{TaskGuid: "job-cancel"}); err != nil {
		t.Fatalf("BBS CancelTask: %v", err)
	}
	if _, err := r.client.CancelTask(ctxT(t), &repv1.CancelTaskRequest{TaskGuid: "job-cancel"}); err != nil {
		t.Fatalf("rep CancelTask: %v", err)
	}
	for _, tw := range state(t, r).GetTasks() {
		if tw.GetTaskGuid() == "job-cancel" {
			t.Fatal("cancelled task still held")
		}
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		tk := task(t, env, "job-ok")
		return tk.GetState() == modelsv1.Task_STATE_COMPLETED, fmt.Sprint(tk)
	}, "job-ok COMPLETED")
	if tk := task(t, env, "job-ok"); tk.GetFailed() || tk.GetResult() != "sim" || tk.GetCellId() != r.cfg.CellID {
		t.Fatalf("completed task %v, want success with result \"sim\"", tk)
	}
	if tk := task(t, env, "job-cancel"); !tk.GetFailed() || tk.GetResult() != "" {
		t.Fatalf("cancelled task %v, want it failed by the cancel", tk)
	}
	testkit.EventuallyState(t, 5*time.Second, func() (bool, string) {
		st := state(t, r)
		return len(st.GetTasks()) == 0, fmt.Sprint(st.GetTasks())
	}, "tasks released")
}

// TestCrashReported: a simulated crash is reported to the BBS as a crash.
func TestCrashReported(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) { c.Sim.CrashRate = 1 })
	d := desiredLRP("flaky", 1)
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		a := actual(t, env, "flaky", 0, ordinary)
		return a.GetCrashCount() == 1 && a.GetCrashReason() == "simulated crash" && a.GetState() == modelsv1.ActualLRP_STATE_UNCLAIMED, fmt.Sprint(a)
	}, "crash recorded")
	testkit.EventuallyState(t, 5*time.Second, func() (bool, string) {
		st := state(t, r)
		return len(st.GetLrps()) == 0, fmt.Sprint(st.GetLrps())
	}, "crashed container released")
}

// writeHook writes an executable sh script.
func writeHook(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hook.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHooks: on_create hooks get the container spec as JSON on stdin, with the LRP's properties;
// on_destroy hooks run after the stop; a failing on_create hook fails the container.
func TestHooks(t *testing.T) {
	env := bbstest.Start(t)
	out := t.TempDir()
	create := writeHook(t, `cat > "`+out+`/create-$GAVEL_CONTAINER_GUID.json"`)
	destroy := writeHook(t, `cat > "`+out+`/destroy-$GAVEL_CONTAINER_GUID.json"`)
	r := startRep(t, env, func(c *rep.Config) {
		c.Hooks.OnCreate = []string{create}
		c.Hooks.OnDestroy = []string{destroy}
	})
	d := desiredLRP("hooked", 1)
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	a := waitRunning(t, env, r, "hooked", 0)
	guid := a.GetInstanceKey().GetInstanceGuid()

	b, err := os.ReadFile(filepath.Join(out, "create-"+guid+".json"))
	if err != nil {
		t.Fatalf("on_create hook output: %v", err)
	}
	var spec struct {
		Guid        string            `json:"guid"`
		Kind        string            `json:"kind"`
		ProcessGuid string            `json:"process_guid"`
		Index       int32             `json:"index"`
		Properties  map[string]string `json:"properties"`
		Ports       []uint32          `json:"ports"`
		Env         []struct{ Name, Value string }
		Action      struct {
			Run struct{ Path string } `json:"run"`
		} `json:"action"`
		RootfsPath string `json:"rootfs_path"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("hook stdin %s: %v", b, err)
	}
	env2 := map[string]string{}
	for _, e := range spec.Env {
		env2[e.Name] = e.Value
	}
	if spec.Guid != guid || spec.Kind != "lrp" || spec.ProcessGuid != "hooked" || spec.Index != 0 ||
		!maps.Equal(spec.Properties, d.GetProperties()) || !slices.Equal(spec.Ports, []uint32{8080}) ||
		spec.Action.Run.Path != "/bin/app" || spec.RootfsPath != r.cfg.PreloadedRootfses["cflinuxfs4"] ||
		env2["GREETING"] != "hello" || env2["INSTANCE_INDEX"] != "0" || env2["INSTANCE_GUID"] != guid ||
		env2["CF_INSTANCE_INDEX"] != "0" || env2["CF_INSTANCE_GUID"] != guid {
		t.Fatalf("hook stdin %s", b)
	}

	if _, err := r.client.StopLRPInstance(ctxT(t), &repv1.StopLRPInstanceRequest{Key: a.GetKey(), InstanceKey: a.GetInstanceKey()}); err != nil {
		t.Fatalf("StopLRPInstance: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, "destroy-"+guid+".json")); err != nil {
		t.Fatalf("on_destroy hook did not run: %v", err)
	}

	failing := writeHook(t, `echo "no network for you" >&2; exit 3`)
	r2 := startRep(t, env, func(c *rep.Config) { c.Hooks.OnCreate = []string{failing} })
	d2 := desiredLRP("unhooked", 1)
	desire(t, env, d2)
	perform(t, r2, []*repv1.LRPInstance{lrpWork(d2, 0)}, nil)
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		a := actual(t, env, "unhooked", 0, ordinary)
		return a.GetCrashCount() == 1 && strings.Contains(a.GetCrashReason(), "on_create hook") &&
			strings.Contains(a.GetCrashReason(), "no network for you"), fmt.Sprint(a)
	}, "failed hook reported as crash")
}

// TestTaskHookGetsProperties: a task's container spec, as an on_create hook reads it, carries
// the task's definition: its properties (which a networking hook needs), result file and action.
func TestTaskHookGetsProperties(t *testing.T) {
	env := bbstest.Start(t)
	out := t.TempDir()
	create := writeHook(t, `cat > "`+out+`/create-$GAVEL_CONTAINER_GUID.json"`)
	r := startRep(t, env, func(c *rep.Config) { c.Hooks.OnCreate = []string{create} })
	def := taskDefinition()
	def.Properties = map[string]string{"network.app_guid": "app-job", "network.network_id": "net-1"}
	if _, err := env.Client.DesireTask(ctxT(t), &bbsv1.DesireTaskRequest{TaskGuid: "job", Domain: "jobs", Definition: def}); err != nil {
		t.Fatalf("DesireTask: %v", err)
	}
	perform(t, r, nil, []*repv1.TaskWork{{TaskGuid: "job", Domain: "jobs",
		Resources: &modelsv1.Resources{MemoryMb: def.GetMemoryMb(), DiskMb: def.GetDiskMb()}, Rootfs: def.GetRootfs()}})
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		tk := task(t, env, "job")
		return tk.GetState() == modelsv1.Task_STATE_COMPLETED, fmt.Sprint(tk)
	}, "job COMPLETED")

	b, err := os.ReadFile(filepath.Join(out, "create-job.json"))
	if err != nil {
		t.Fatalf("on_create hook output: %v", err)
	}
	var spec struct {
		Kind       string            `json:"kind"`
		TaskGuid   string            `json:"task_guid"`
		Domain     string            `json:"domain"`
		Properties map[string]string `json:"properties"`
		ResultFile string            `json:"result_file"`
		Action     struct {
			Run struct{ Path string } `json:"run"`
		} `json:"action"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("hook stdin %s: %v", b, err)
	}
	tests := []struct {
		field     string
		got, want any
	}{
		{"kind", spec.Kind, "task"},
		{"task_guid", spec.TaskGuid, "job"},
		{"domain", spec.Domain, "jobs"},
		{"properties", spec.Properties, def.GetProperties()},
		{"result_file", spec.ResultFile, "/tmp/result"},
		{"action.run.path", spec.Action.Run.Path, "/bin/migrate"},
	}
	for _, tt := range tests {
		if fmt.Sprint(tt.got) != fmt.Sprint(tt.want) {
			t.Errorf("hook stdin %s = %v, want %v", tt.field, tt.got, tt.want)
		}
	}
}

// TestBulk: the bulk loop removes a record naming this cell without a container, fails a task
// without a container, stops a container whose slot another container holds, and reports a
// running container whose slot has no record at all (the BBS records it again).
func TestBulk(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env, func(c *rep.Config) { c.BulkInterval = rep.Duration(200 * time.Millisecond) })
	desire(t, env, desiredLRP("orphan", 1))
	ghost := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ghost", CellId: r.cfg.CellID}
	if _, err := env.Client.ClaimActualLRP(ctxT(t), &bbsv1.ClaimActualLRPRequest{ProcessGuid: "orphan", InstanceKey: ghost}); err != nil {
		t.Fatalf("claim: %v", err)
	}
	desireTask(t, env, "lost-task")
	if _, err := env.Client.StartTask(ctxT(t), &bbsv1.StartTaskRequest{TaskGuid: "lost-task", CellId: r.cfg.CellID}); err != nil {
		t.Fatalf("start task: %v", err)
	}
	d := desiredLRP("lost", 1)
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	a := waitRunning(t, env, r, "lost", 0)
	if _, err := env.Client.RemoveActualLRP(ctxT(t), &bbsv1.RemoveActualLRPRequest{ProcessGuid: "lost", InstanceKey: a.GetInstanceKey()}); err != nil {
		t.Fatalf("remove behind the rep's back: %v", err)
	}
	// The slot of "lost" is taken by another container before the bulk loop looks: the rep
	// cannot report its own, and stops it.
	other := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "other", CellId: "cell-elsewhere"}
	if _, err := env.Client.StartActualLRP(ctxT(t), &bbsv1.StartActualLRPRequest{ProcessGuid: "lost", InstanceKey: other,
		NetInfo: a.GetNetInfo(), Domain: d.GetDomain()}); err != nil {
		t.Fatalf("another container takes the slot: %v", err)
	}

	testkit.EventuallyState(t, 5*time.Second, func() (bool, string) {
		got := actual(t, env, "orphan", 0, ordinary)
		return got == nil, fmt.Sprint(got)
	}, "orphaned record removed")
	testkit.EventuallyState(t, 5*time.Second, func() (bool, string) {
		tk := task(t, env, "lost-task")
		return tk.GetState() == modelsv1.Task_STATE_COMPLETED && tk.GetFailed() && tk.GetFailureReason() == "container vanished", fmt.Sprint(tk)
	}, "vanished task failed")
	testkit.EventuallyState(t, 5*time.Second, func() (bool, string) {
		st := state(t, r)
		return len(st.GetLrps()) == 0, fmt.Sprint(st.GetLrps())
	}, "orphaned container stopped")
	if got := actual(t, env, "lost", 0, ordinary); got.GetInstanceKey().GetInstanceGuid() != "other" {
		t.Fatalf("stopping the orphaned container wrote %v", got)
	}

	// A running container whose record is gone altogether (a store restored from an older
	// backup) is reported, not stopped: the BBS records it again, same container.
	k := desiredLRP("kept", 1)
	desire(t, env, k)
	perform(t, r, []*repv1.LRPInstance{lrpWork(k, 0)}, nil)
	ka := waitRunning(t, env, r, "kept", 0)
	if _, err := env.Client.RemoveActualLRP(ctxT(t), &bbsv1.RemoveActualLRPRequest{ProcessGuid: "kept", InstanceKey: ka.GetInstanceKey()}); err != nil {
		t.Fatalf("remove behind the rep's back: %v", err)
	}
	testkit.EventuallyState(t, 5*time.Second, func() (bool, string) {
		got := actual(t, env, "kept", 0, ordinary)
		return got.GetState() == modelsv1.ActualLRP_STATE_RUNNING && proto.Equal(got.GetInstanceKey(), ka.GetInstanceKey()), fmt.Sprint(got)
	}, "running container reported again")
	if st := state(t, r); len(st.GetLrps()) != 1 {
		t.Fatalf("cell holds %v, want the kept instance", st.GetLrps())
	}
}

// TestEvacuate: a draining cell takes no new work, hands its running instance over as an
// EVACUATING copy, and stops it once the replacement runs.
func TestEvacuate(t *testing.T) {
	env := bbstest.Start(t)
	r := startRep(t, env)
	d := desiredLRP("mover", 1)
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	running := waitRunning(t, env, r, "mover", 0)

	done := make(chan error, 1)
	go func() {
		_, err := r.client.Evacuate(ctxT(t), &repv1.EvacuateRequest{})
		done <- err
	}()
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		e := actual(t, env, "mover", 0, evacuating)
		return e.GetState() == modelsv1.ActualLRP_STATE_RUNNING && proto.Equal(e.GetInstanceKey(), running.GetInstanceKey()) &&
			proto.Equal(e.GetNetInfo(), running.GetNetInfo()), fmt.Sprint(e)
	}, "EVACUATING copy")
	if o := actual(t, env, "mover", 0, ordinary); o.GetState() != modelsv1.ActualLRP_STATE_UNCLAIMED {
		t.Fatalf("ordinary record %v, want it UNCLAIMED for a replacement", o)
	}
	st := state(t, r)
	if !st.GetEvacuating() || len(st.GetLrps()) != 1 {
		t.Fatalf("state while evacuating %v", st)
	}
	if resp := perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil); len(resp.GetFailedLrps()) != 1 {
		t.Fatalf("evacuating cell took work: %v", resp)
	}

	// The replacement runs elsewhere; the rep then lets its copy go.
	repl := &modelsv1.ActualLRPInstanceKey{InstanceGuid: "replacement", CellId: "cell-elsewhere"}
	if _, err := env.Client.ClaimActualLRP(ctxT(t), &bbsv1.ClaimActualLRPRequest{ProcessGuid: "mover", InstanceKey: repl}); err != nil {
		t.Fatalf("claim replacement: %v", err)
	}
	if _, err := env.Client.StartActualLRP(ctxT(t), &bbsv1.StartActualLRPRequest{ProcessGuid: "mover", InstanceKey: repl, NetInfo: running.GetNetInfo(), Routable: true}); err != nil {
		t.Fatalf("start replacement: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Evacuate: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Evacuate did not return after the replacement ran")
	}
	if e := actual(t, env, "mover", 0, evacuating); e != nil {
		t.Fatalf("evacuating copy after hand-over: %v", e)
	}
	if o := actual(t, env, "mover", 0, ordinary); !proto.Equal(o.GetInstanceKey(), repl) || o.GetState() != modelsv1.ActualLRP_STATE_RUNNING {
		t.Fatalf("ordinary record %v, want the replacement running", o)
	}
	if st := state(t, r); len(st.GetLrps()) != 0 {
		t.Fatalf("instances after evacuation: %v", st.GetLrps())
	}
}

// countingBBS counts the rep's claims and desired-LRP reads; with stripDesired it answers
// claims as a BBS that does not send the desired LRP would.
type countingBBS struct {
	bbsv1.BBSServiceClient
	stripDesired bool
	// claims counts claims, claimCalls the calls that carried them, fetches desired-LRP reads.
	claims, claimCalls, fetches atomic.Int32
}

func (c *countingBBS) ClaimActualLRP(ctx context.Context, in *bbsv1.ClaimActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.ClaimActualLRPResponse, error) {
	c.claims.Add(1)
	c.claimCalls.Add(1)
	resp, err := c.BBSServiceClient.ClaimActualLRP(ctx, in, opts...)
	if c.stripDesired && resp != nil {
		resp.DesiredLrp = nil
	}
	return resp, err
}

// ClaimActualLRPs counts each claim of a batch (the rep batches the claims that queue behind
// one in flight) and strips the desired LRPs of its results as ClaimActualLRP does.
func (c *countingBBS) ClaimActualLRPs(ctx context.Context, in *bbsv1.ClaimActualLRPsRequest, opts ...grpc.CallOption) (*bbsv1.ClaimActualLRPsResponse, error) {
	c.claims.Add(int32(len(in.GetClaims())))
	c.claimCalls.Add(1)
	resp, err := c.BBSServiceClient.ClaimActualLRPs(ctx, in, opts...)
	if c.stripDesired {
		for _, r := range resp.GetResults() {
			if r.GetResponse() != nil {
				r.Response.DesiredLrp = nil
			}
		}
	}
	return resp, err
}

func (c *countingBBS) DesiredLRPByProcessGuid(ctx context.Context, in *bbsv1.DesiredLRPByProcessGuidRequest, opts ...grpc.CallOption) (*bbsv1.DesiredLRPByProcessGuidResponse, error) {
	c.fetches.Add(1)
	return c.BBSServiceClient.DesiredLRPByProcessGuid(ctx, in, opts...)
}

// TestClaimBringsTheRunInfo: an instance runs after one BBS call before its container (the
// claim, which brings the desired LRP back); against a BBS that does not send it, the rep reads
// the desired LRP itself and the instance runs all the same.
func TestClaimBringsTheRunInfo(t *testing.T) {
	for _, strip := range []bool{false, true} {
		t.Run(fmt.Sprintf("strip=%v", strip), func(t *testing.T) {
			env := bbstest.Start(t)
			client := &countingBBS{BBSServiceClient: env.Client, stripDesired: strip}
			r := startRepWith(t, env, client)
			d := desiredLRP("web", 2)
			desire(t, env, d)
			perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0), lrpWork(d, 1)}, nil)
			waitRunning(t, env, r, "web", 0)
			waitRunning(t, env, r, "web", 1)
			want := int32(0)
			if strip {
				want = 2
			}
			if c, f := client.claims.Load(), client.fetches.Load(); c != 2 || f != want {
				t.Fatalf("%d claims and %d desired-LRP reads, want 2 and %d", c, f, want)
			}
		})
	}
}

// TestOnePerformIsClaimedInOneCall: the instances one Perform hands a rep are claimed in one
// BBS call, a batch of them all, not the first alone and the rest behind it; each runs.
func TestOnePerformIsClaimedInOneCall(t *testing.T) {
	env := bbstest.Start(t)
	client := &countingBBS{BBSServiceClient: env.Client}
	r := startRepWith(t, env, client)
	d := desiredLRP("web", 4)
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0), lrpWork(d, 1), lrpWork(d, 2), lrpWork(d, 3)}, nil)
	for i := range int32(4) {
		waitRunning(t, env, r, "web", i)
	}
	if c, calls := client.claims.Load(), client.claimCalls.Load(); c != 4 || calls != 1 {
		t.Fatalf("%d claims in %d calls, want 4 in 1", c, calls)
	}
}

// TestPresenceLapseStopsNewWork: a rep cut off from etcd (its presence connection closed, as a
// partitioned host's) says in State that its presence lapsed and refuses new work at once,
// although its lease has most of its TTL to run and the BBS still lists the cell; a healthy
// rep does neither.
func TestPresenceLapseStopsNewWork(t *testing.T) {
	env := bbstest.Start(t)
	presenceEtcd, err := etcdx.NewClient(etcdx.Config{Endpoints: env.Etcd.Endpoints()}, logtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { presenceEtcd.Close() })
	r := startRepEtcd(t, env, presenceEtcd, env.Client, func(c *rep.Config) { c.LeaseTTL = rep.Duration(30 * time.Second) })
	d := desiredLRP("web", 2)
	desire(t, env, d)
	if st := state(t, r); st.GetPresenceLapsed() {
		t.Fatalf("a registered rep reports its presence lapsed: %v", st)
	}
	if resp := perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil); len(resp.GetFailedLrps()) != 0 {
		t.Fatalf("a healthy rep refused work: %v", resp)
	}
	// Cut the presence connection, as a network would: closing the client instead ends its
	// watch before its connection, and the rep's revoke after the loss could still get through
	// and remove the cell at once.
	if err := presenceEtcd.ActiveConnection().Close(); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyState(t, 5*time.Second, func() (bool, string) {
		st := state(t, r)
		return st.GetPresenceLapsed(), fmt.Sprint(st)
	}, "presence lapsed")
	if resp := perform(t, r, []*repv1.LRPInstance{lrpWork(d, 1)}, nil); len(resp.GetFailedLrps()) != 1 {
		t.Fatalf("a rep whose presence lapsed took work: %v", resp)
	}
	cells, err := env.Client.Cells(ctxT(t), &bbsv1.CellsRequest{})
	if err != nil || len(cells.GetCells()) != 1 {
		t.Fatalf("the BBS should still list the cell while its lease runs: %v, %v", cells, err)
	}
}
