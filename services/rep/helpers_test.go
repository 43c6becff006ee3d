package rep_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
)

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// repEnv is a running rep with the sim backend and a gRPC client to it.
type repEnv struct {
	svc    *rep.Service
	cfg    rep.Config
	client repv1.RepServiceClient
	stop   func() // stops the rep and waits for it
}

var cellSeq atomic.Int32

// startRep runs a sim-backend rep against env's BBS and etcd until the test ends.
func startRep(t testing.TB, env *bbstest.Env, configure ...func(*rep.Config)) *repEnv {
	t.Helper()
	return startRepWith(t, env, env.Client, configure...)
}

// startRepWith is startRep with the rep reaching the BBS through client.
func startRepWith(t testing.TB, env *bbstest.Env, client bbsv1.BBSServiceClient, configure ...func(*rep.Config)) *repEnv {
	t.Helper()
	return startRepEtcd(t, env, env.Etcd, client, configure...)
}

// startRepEtcd is startRepWith with the rep keeping its presence through presenceEtcd.
func startRepEtcd(t testing.TB, env *bbstest.Env, presenceEtcd *clientv3.Client, client bbsv1.BBSServiceClient, configure ...func(*rep.Config)) *repEnv {
	t.Helper()
	svc, cfg := newRep(t, env, presenceEtcd, client, configure...)
	return attach(t, svc, cfg, testkit.Start(t, "rep", svc))
}

// newRep builds, without starting it, a sim-backend rep against env's BBS (through client)
// and etcd (presenceEtcd).
func newRep(t testing.TB, env *bbstest.Env, presenceEtcd *clientv3.Client, client bbsv1.BBSServiceClient, configure ...func(*rep.Config)) (*rep.Service, rep.Config) {
	t.Helper()
	cfg := rep.Default()
	cfg.CellID = fmt.Sprintf("cell-%d", cellSeq.Add(1))
	cfg.Zone = "z1"
	cfg.Tags = []string{"Staging", "skynet"}
	cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": t.TempDir()}
	cfg.SupportedRootfsProviders = []string{"docker"}
	cfg.Capacity = rep.Capacity{MemoryMB: 1024, DiskMB: 4096, Containers: 10}
	cfg.Backend = rep.BackendSim
	cfg.ListenAddress = "127.0.0.1:0"
	cfg.CellAddress = "127.0.0.1"
	cfg.BBSAddress = env.Addr
	cfg.BBSTLS = tlsx.Config{Insecure: true}
	cfg.TLS = tlsx.Config{Insecure: true}
	cfg.EtcdTLS = tlsx.Config{Insecure: true}
	cfg.LeaseTTL = rep.Duration(2 * time.Second)
	cfg.WorkDir = t.TempDir()
	cfg.Sim.StartLatency = rep.Duration(100 * time.Millisecond)
	cfg.EvacuationTimeout = rep.Duration(20 * time.Second)
	for _, f := range configure {
		f(&cfg)
	}
	svc, err := rep.New(cfg, logtest.New(t), presenceEtcd, client)
	if err != nil {
		t.Fatalf("new rep: %v", err)
	}
	return svc, cfg
}

// attach is the repEnv of svc, started as run, with a gRPC client to it.
func attach(t testing.TB, svc *rep.Service, cfg rep.Config, run *testkit.Running) *repEnv {
	t.Helper()
	conn := testkit.Dial(t, svc.Addr().String())
	t.Cleanup(func() { conn.Close() })
	stop := func() {
		if err := run.Stop(); err != nil {
			t.Errorf("rep stopped with error: %v", err)
		}
	}
	return &repEnv{svc: svc, cfg: cfg, client: repv1.NewRepServiceClient(conn), stop: stop}
}

func runAction(path string) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path}}}
}

func desiredLRP(guid string, instances int32) *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: guid,
		Domain:      "apps",
		Rootfs:      "preloaded:cflinuxfs4",
		Instances:   instances,
		MemoryMb:    128,
		DiskMb:      256,
		Ports:       []uint32{8080},
		Env:         []*modelsv1.EnvironmentVariable{{Name: "GREETING", Value: "hello"}},
		Properties:  map[string]string{"network.app_guid": "app-" + guid, "network.network_id": "net-1"},
		Action:      runAction("/bin/app"),
	}
}

func desire(t testing.TB, env *bbstest.Env, d *modelsv1.DesiredLRP) {
	t.Helper()
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatalf("desire %s: %v", d.GetProcessGuid(), err)
	}
}

// lrpWork is the Perform item of index of d.
func lrpWork(d *modelsv1.DesiredLRP, index int32) *repv1.LRPInstance {
	return &repv1.LRPInstance{
		Key:                 &modelsv1.ActualLRPKey{ProcessGuid: d.GetProcessGuid(), Index: index, Domain: d.GetDomain()},
		Resources:           &modelsv1.Resources{MemoryMb: d.GetMemoryMb(), DiskMb: d.GetDiskMb()},
		Rootfs:              d.GetRootfs(),
		PlacementConstraint: d.GetPlacementConstraint(),
	}
}

func perform(t testing.TB, r *repEnv, lrps []*repv1.LRPInstance, tasks []*repv1.TaskWork) *repv1.PerformResponse {
	t.Helper()
	resp, err := r.client.Perform(ctxT(t), &repv1.PerformRequest{Lrps: lrps, Tasks: tasks})
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	return resp
}

func state(t *testing.T, r *repEnv) *repv1.StateResponse {
	t.Helper()
	resp, err := r.client.State(ctxT(t), &repv1.StateRequest{})
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	return resp
}

// actual returns the record of guid/index with presence p, or nil.
func actual(t *testing.T, env *bbstest.Env, guid string, index int32, p modelsv1.ActualLRP_Presence) *modelsv1.ActualLRP {
	t.Helper()
	resp, err := env.Client.ActualLRPs(ctxT(t), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}, Index: &index})
	if err != nil {
		t.Fatalf("ActualLRPs: %v", err)
	}
	for _, a := range resp.GetActualLrps() {
		if a.GetPresence() == p {
			return a
		}
	}
	return nil
}

// waitRunning waits until guid/index runs on r's cell and returns the record.
func waitRunning(t *testing.T, env *bbstest.Env, r *repEnv, guid string, index int32) *modelsv1.ActualLRP {
	t.Helper()
	var got *modelsv1.ActualLRP
	ctx := ctxT(t)
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		got = actual(t, env, guid, index, modelsv1.ActualLRP_PRESENCE_ORDINARY)
		if got.GetState() == modelsv1.ActualLRP_STATE_RUNNING && got.GetInstanceKey().GetCellId() == r.cfg.CellID {
			return true, ""
		}
		// What the cell holds says, on a failure, whether the rep still has the instance and
		// whether it is starting.
		held, err := r.client.State(ctx, &repv1.StateRequest{})
		return false, fmt.Sprintf("record %v; the cell holds %v starting %d (%v)", got, held.GetLrps(), held.GetStartingContainerCount(), err)
	}, fmt.Sprintf("%s/%d RUNNING on %s", guid, index, r.cfg.CellID))
	return got
}

func task(t *testing.T, env *bbstest.Env, guid string) *modelsv1.Task {
	t.Helper()
	resp, err := env.Client.TaskByGuid(ctxT(t), &bbsv1.TaskByGuidRequest{TaskGuid: guid})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		t.Fatalf("TaskByGuid %s: %v", guid, err)
	}
	return resp.GetTask()
}

func taskDefinition() *modelsv1.TaskDefinition {
	return &modelsv1.TaskDefinition{
		Rootfs:     "preloaded:cflinuxfs4",
		Action:     runAction("/bin/migrate"),
		MemoryMb:   64,
		DiskMb:     128,
		ResultFile: "/tmp/result",
	}
}

func desireTask(t *testing.T, env *bbstest.Env, guid string) *repv1.TaskWork {
	t.Helper()
	def := taskDefinition()
	if _, err := env.Client.DesireTask(ctxT(t), &bbsv1.DesireTaskRequest{TaskGuid: guid, Domain: "jobs", Definition: def}); err != nil {
		t.Fatalf("DesireTask %s: %v", guid, err)
	}
	return &repv1.TaskWork{TaskGuid: guid, Domain: "jobs", Resources: &modelsv1.Resources{MemoryMb: def.GetMemoryMb(), DiskMb: def.GetDiskMb()}, Rootfs: def.GetRootfs()}
}
