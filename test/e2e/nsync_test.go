package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// poolCells is the placement pools proposal's nine-cell tag table. Cells 1–4 and 7–8 run real
// processes (the routed app moves between them); 5, 6 and 9 are simulated.
var poolCells = []struct {
	tags    string
	process bool
}{
	{"staging,skynet", true}, {"staging,skynet", true}, {"staging", true}, {"staging", true},
	{"production,skynet", false}, {"production,skynet", false}, {"production", true}, {"production", true},
	{"skynet", false},
}

// nsyncCluster is the BBS, the auctioneer, nine reps, nsync, the route-emitter and the router,
// all built binaries.
type nsyncCluster struct {
	*cluster
	nsync     nsyncv1.NsyncServiceClient
	nsyncArgs []string
	nsyncAddr string // the first nsync's API
	etcd      *clientv3.Client
	router    string // HTTP address
}

func startNsyncCluster(t *testing.T) *nsyncCluster {
	t.Helper()
	c := &nsyncCluster{cluster: &cluster{hello: binary(t, "hello")}}
	emb, etcdClient := etcdtest.Start(t)
	c.etcd = etcdClient
	etcd := strings.Join(emb.Endpoints(), ",")
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "cflinuxfs4")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	bbsAddr, auctioneerAddr, nsyncAddr, emitterAddr := testkit.ReservedAddr(t), testkit.ReservedAddr(t), testkit.ReservedAddr(t), testkit.ReservedAddr(t)
	c.bbsAddr, c.router = bbsAddr, testkit.ReservedAddr(t)
	c.procs = append(c.procs,
		startProc(t, "bbs", binary(t, "bbs"), "-listen", bbsAddr, "-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-auctioneer-address", auctioneerAddr,
			"-convergence-interval", "2s", "-unclaimed-timeout", "3s", "-drain-timeout", "1s"),
		startProc(t, "auctioneer", binary(t, "auctioneer"), "-listen", auctioneerAddr, "-insecure",
			"-bbs-address", bbsAddr, "-bbs-insecure", "-rep-insecure",
			"-etcd-endpoints", etcd, "-etcd-insecure", "-batch-interval", "20ms"))
	for i, cell := range poolCells {
		id := fmt.Sprintf("cell-%d", i+1)
		first, last := testkit.PortBlock(t, 60) // private to this rep among every test running
		args := []string{
			"--cell-id", id, "--zone", fmt.Sprintf("z%d", i%3), "--tags", cell.tags,
			"--preloaded-rootfses", fmt.Sprintf(`{"cflinuxfs4":%q}`, rootfs),
			"--memory-mb", "1024", "--disk-mb", "4096", "--containers", "20",
			"--listen", testkit.ReservedAddr(t), "--insecure", "--bbs-address", bbsAddr, "--bbs-insecure",
			"--etcd-endpoints", etcd, "--etcd-insecure",
			"--port-range", fmt.Sprintf("%d-%d", first, last), "--work-dir", filepath.Join(dir, id),
		}
		if cell.process {
			args = append(args, "--backend", "process")
		} else {
			args = append(args, "--backend", "sim", "--sim-start-latency", "50ms")
		}
		c.procs = append(c.procs, startProc(t, "rep "+id, binary(t, "rep"), args...))
	}
	c.nsyncAddr = nsyncAddr
	c.nsyncArgs = []string{"-listen", nsyncAddr, "-insecure", "-bbs-address", bbsAddr, "-bbs-insecure",
		"-etcd-endpoints", etcd, "-etcd-insecure", "-stacks", `{"cflinuxfs4":"preloaded:cflinuxfs4","cflinuxfs3":"preloaded:cflinuxfs3"}`,
		"-bulk-interval", "1s", "-domain-ttl", "5s", "-route-drain", "2s", "-restart-timeout", "60s", "-lock-ttl", "2s"}
	c.procs = append(c.procs,
		startProc(t, "nsync", binary(t, "nsync"), c.nsyncArgs...),
		startProc(t, "route-emitter", binary(t, "routeemitter"), "-listen", emitterAddr, "-insecure",
			"-bbs-address", bbsAddr, "-bbs-insecure", "-sync-interval", "5s"),
		startProc(t, "router", binary(t, "router"), "-http", c.router, "-https", "", "-admin", "",
			"-routeemitter-address", emitterAddr, "-routeemitter-insecure"))

	insecure := grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}}
	conn, err := grpcx.Dial(bbsAddr, insecure)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c.bbs = bbsv1.NewBBSServiceClient(conn)
	nconn, err := grpcx.Dial(nsyncAddr, insecure)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nconn.Close() })
	c.nsync = nsyncv1.NewNsyncServiceClient(nconn)
	aconn, err := grpcx.Dial(auctioneerAddr, insecure)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { aconn.Close() })
	c.waitFor(t, 30*time.Second, "the auctioneer to lead", func() (bool, string) {
		return testkit.Serving(aconn, testkit.AuctioneerService)
	})
	c.waitFor(t, 30*time.Second, "9 cells", func() (bool, string) {
		resp, err := c.bbs.Cells(context.Background(), &bbsv1.CellsRequest{})
		return err == nil && len(resp.GetCells()) == 9, fmt.Sprint(len(resp.GetCells()), err)
	})
	c.waitForNsync(t)
	return c
}

// waitForNsync waits until nsync answers.
func (c *nsyncCluster) waitForNsync(t *testing.T) {
	t.Helper()
	c.waitFor(t, 30*time.Second, "nsync to answer", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.nsync.PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
		return err == nil, fmt.Sprint(err)
	})
}

// webApp is the sample app as an nsync app, routed at host.
func webApp(guid, space, path, host string, instances int32) *nsyncv1.App {
	routes, err := structpb.NewValue([]any{map[string]any{"port": 8080, "routes": []any{host}}})
	if err != nil {
		panic(err)
	}
	return &nsyncv1.App{
		Guid: guid, Name: guid, SpaceGuid: space, Stack: "cflinuxfs4", Command: path,
		Instances: instances, MemoryMb: 64, DiskMb: 64, Ports: []uint32{8080}, Routes: routes,
		HealthCheck: &nsyncv1.HealthCheck{Type: nsyncv1.HealthCheck_TYPE_HTTP, HttpEndpoint: "/health", IntervalMs: 200},
	}
}

// cellsOf lists the cells of pg's running instances.
func cellsOf(running []*modelsv1.ActualLRP) []string {
	var out []string
	for _, a := range running {
		out = append(out, a.GetInstanceKey().GetCellId())
	}
	slices.Sort(out)
	return out
}

func within(t *testing.T, what string, cells []string, allowed ...int) {
	t.Helper()
	for _, c := range cells {
		ok := false
		for _, n := range allowed {
			ok = ok || c == fmt.Sprintf("cell-%d", n)
		}
		if !ok {
			t.Fatalf("%s runs on %v, want only cells %v", what, cells, allowed)
		}
	}
}

// stored is what nsync and the BBS hold: nsync's keys with their mod revisions and the BBS's
// desired LRPs and tasks with their modification tags.
func (c *nsyncCluster) stored(t *testing.T) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]string{}
	resp, err := c.etcd.Get(ctx, "/gavel/v1/nsync/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = fmt.Sprint(kv.ModRevision)
	}
	lrps, err := c.bbs.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range lrps.GetDesiredLrps() {
		out["lrp/"+d.GetProcessGuid()] = fmt.Sprint(d.GetModificationTag())
	}
	tasks, err := c.bbs.Tasks(ctx, &bbsv1.TasksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks.GetTasks() {
		out["task/"+task.GetTaskGuid()] = task.GetState().String()
	}
	return out
}

// TestNsyncEndToEnd runs the placement pools acceptance over built binaries: pools place apps,
// a rebinding applies at a zero-downtime restart (counted through the router), the default
// pool covers unbound spaces, an impossible pool leaves the old version serving with
// CELL_MISMATCH, bad input stores nothing, and nsync killed with SIGKILL loses nothing.
func TestNsyncEndToEnd(t *testing.T) {
	c := startNsyncCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, p := range []*nsyncv1.PlacementPool{
		{Name: "staging", Require: []string{"staging"}},
		{Name: "prod", Require: []string{"production"}, Disallow: []string{"skynet"}},
		{Name: "skynet-only", Require: []string{"skynet"}, Disallow: []string{"staging", "production"}},
		{Name: "nowhere", Require: []string{"alfalfa"}},
	} {
		if _, err := c.nsync.CreatePlacementPool(ctx, &nsyncv1.CreatePlacementPoolRequest{Pool: p}); err != nil {
			t.Fatal(err)
		}
	}
	bind := func(space, pool string) {
		t.Helper()
		if _, err := c.nsync.BindPlacementPool(ctx, &nsyncv1.BindPlacementPoolRequest{SpaceGuid: space, Pool: pool}); err != nil {
			t.Fatal(err)
		}
	}
	appInfo := func(guid string) *nsyncv1.AppInfo {
		t.Helper()
		resp, err := c.nsync.Apps(ctx, &nsyncv1.AppsRequest{Guids: []string{guid}})
		if err != nil || len(resp.GetApps()) != 1 {
			t.Fatalf("Apps %s: %v %v", guid, resp, err)
		}
		return resp.GetApps()[0]
	}
	const host = "web.e2e.local"
	routed := func(what string) {
		t.Helper()
		c.waitFor(t, 20*time.Second, what, func() (bool, string) {
			l := testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
			time.Sleep(50 * time.Millisecond)
			ok, failed, first := l.Finish()
			return ok > 0 && failed == 0, fmt.Sprintf("%d ok, %d failed (%s)", ok, failed, first)
		})
	}

	// A space bound to {require: [staging]} places its app only on cells 1–4.
	bind("space-a", "staging")
	if _, err := c.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: webApp("web", "space-a", c.hello, host, 2)}); err != nil {
		t.Fatal(err)
	}
	v1 := c.waitRunning(t, "web-v1", 2, 30*time.Second)
	within(t, "web v1 under staging", cellsOf(v1), 1, 2, 3, 4)
	routed("the router to route web")

	// Rebinding leaves the running app where it is until RestartApp.
	bind("space-a", "prod")
	if info := appInfo("web"); !info.GetRestartToApply() {
		t.Errorf("Apps after rebinding: %v, want restart_to_apply", info)
	}
	if now := c.waitRunning(t, "web-v1", 2, 5*time.Second); !slices.Equal(cellsOf(now), cellsOf(v1)) {
		t.Errorf("rebinding moved web from %v to %v", cellsOf(v1), cellsOf(now))
	}

	// RestartApp: v2 runs only on cells 7–8, without one failed request through the router.
	l := testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	rr, err := c.nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "web"})
	time.Sleep(500 * time.Millisecond)
	ok, failed, first := l.Finish()
	if err != nil {
		t.Fatalf("RestartApp: %v", err)
	}
	t.Logf("during the restart: %d requests answered, %d failed", ok, failed)
	if failed != 0 || ok == 0 {
		t.Errorf("restart under load: %d ok, %d failed (first: %s)", ok, failed, first)
	}
	if rr.GetProcessGuid() != "web-v2" {
		t.Fatalf("RestartApp answered %v", rr)
	}
	within(t, "web v2 under prod", cellsOf(c.waitRunning(t, "web-v2", 2, 10*time.Second)), 7, 8)
	if left := c.actualLRPs(t, "web-v1"); len(left) != 0 {
		t.Errorf("web-v1 still has instances after the restart: %v", left)
	}

	// The default pool applies to an unbound space (cell 9 is the only skynet-only cell).
	if _, err := c.nsync.SetDefaultPlacementPool(ctx, &nsyncv1.SetDefaultPlacementPoolRequest{Pool: "skynet-only"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: webApp("worker", "space-b", "/bin/worker", "worker.e2e.local", 3)}); err != nil {
		t.Fatal(err)
	}
	within(t, "worker of an unbound space", cellsOf(c.waitRunning(t, "worker-v1", 3, 30*time.Second)), 9)

	// A pool no cell satisfies: CELL_MISMATCH on the app, the old version keeps serving.
	bind("space-a", "nowhere")
	l = testkit.StartRouterLoad(c.router, host, 20000, 5*time.Millisecond)
	_, err = c.nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: "web"})
	ok, failed, first = l.Finish()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "alfalfa") {
		t.Fatalf("RestartApp under an impossible pool: %v", err)
	}
	if failed != 0 || ok == 0 {
		t.Errorf("while the new version failed to place: %d ok, %d failed (first: %s)", ok, failed, first)
	}
	info := appInfo("web")
	if info.GetPlacementError().GetCode() != modelsv1.PlacementError_CODE_CELL_MISMATCH || info.GetApp().GetVersion() != 2 || info.GetRunning() != 2 {
		t.Errorf("Apps after the failed restart: %v", info)
	}
	within(t, "web v2 after the failed restart", cellsOf(c.waitRunning(t, "web-v2", 2, 5*time.Second)), 7, 8)

	// Bad input: a clear error, nothing stored in nsync or the BBS.
	bad := func(f func(*nsyncv1.App)) func() error {
		return func() error {
			a := webApp("bad", "space-a", c.hello, "bad.e2e.local", 1)
			f(a)
			_, err := c.nsync.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: a})
			return err
		}
	}
	for _, tt := range []struct {
		name string
		call func() error
		code codes.Code
		want string
	}{
		{"unknown stack", bad(func(a *nsyncv1.App) { a.Stack = "lucid64" }), codes.InvalidArgument, `app.stack: unknown stack "lucid64" (known stacks: cflinuxfs3, cflinuxfs4)`},
		{"64-character pool tag", func() error {
			_, err := c.nsync.CreatePlacementPool(ctx, &nsyncv1.CreatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{Name: "long", Require: []string{strings.Repeat("x", 64)}}})
			return err
		}, codes.InvalidArgument, "pool.require[0]: must be shorter than 64 characters"},
		{"deleting a bound pool", func() error {
			_, err := c.nsync.DeletePlacementPool(ctx, &nsyncv1.DeletePlacementPoolRequest{Name: "nowhere"})
			return err
		}, codes.FailedPrecondition, `placement pool "nowhere" is bound to space(s) [space-a]`},
		{"bad docker reference", bad(func(a *nsyncv1.App) { a.Stack, a.DockerImage = "", "UPPER/Case:tag:tag" }), codes.InvalidArgument, "app.docker_image: is not a valid docker image reference"},
	} {
		before := c.stored(t)
		err := tt.call()
		if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %s mentioning %q", tt.name, err, tt.code, tt.want)
		}
		if after := c.stored(t); !maps.Equal(before, after) {
			t.Errorf("%s changed what is stored:\nbefore %v\nafter  %v", tt.name, before, after)
		}
	}

	// nsync killed with SIGKILL and started again loses no app or pool.
	c.kill(t, "nsync")
	c.procs = append(c.procs, startProc(t, "nsync (restarted)", binary(t, "nsync"), c.nsyncArgs...))
	c.waitForNsync(t)
	apps, err := c.nsync.Apps(ctx, &nsyncv1.AppsRequest{})
	if err != nil || len(apps.GetApps()) != 2 || apps.GetApps()[0].GetApp().GetGuid() != "web" || apps.GetApps()[0].GetApp().GetVersion() != 2 {
		t.Fatalf("Apps after SIGKILL: %v %v", apps, err)
	}
	pools, err := c.nsync.PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
	if err != nil || len(pools.GetPools()) != 4 || pools.GetDefaultPool() != "skynet-only" {
		t.Fatalf("PlacementPools after SIGKILL: %v %v", pools, err)
	}

	// The new nsync's bulk loop brings back an LRP removed behind its back.
	if _, err := c.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "worker-v1"}); err != nil {
		t.Fatal(err)
	}
	within(t, "worker desired again", cellsOf(c.waitRunning(t, "worker-v1", 3, 30*time.Second)), 9)
	routed("web still routed")
}

// TestNsyncBinaryMutualTLSAndBadConfig: the nsync binary serves its API over mutual TLS only, to
// identities with a role, and refuses a bad configuration before starting.
func TestNsyncBinaryMutualTLSAndBadConfig(t *testing.T) {
	bin := binary(t, "nsync")
	out, err := exec.Command(bin, "-insecure", "-bbs-insecure", "-etcd-insecure", "-stacks", `{"CFLinuxFS4":"preloaded:cflinuxfs4"}`).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `stack name "CFLinuxFS4" must be non-empty and lower case`) {
		t.Fatalf("want a refusal naming the stack, got %v: %s", err, out)
	}

	emb, _ := etcdtest.Start(t)
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "nsync", "admin", "client")
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ReservedAddr(t)
	c := &cluster{}
	c.procs = append(c.procs, startProc(t, "nsync", bin, "-listen", addr,
		"-tls-cert", pki["nsync"].CertFile, "-tls-key", pki["nsync"].KeyFile, "-tls-ca", pki["nsync"].CAFile,
		"-bbs-address", testkit.ReservedAddr(t), "-bbs-insecure", "-etcd-endpoints", strings.Join(emb.Endpoints(), ","), "-etcd-insecure"))
	conn, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: pki["admin"]})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := nsyncv1.NewNsyncServiceClient(conn)
	c.waitFor(t, 20*time.Second, "nsync over mTLS", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := client.CreatePlacementPool(ctx, &nsyncv1.CreatePlacementPoolRequest{Pool: &nsyncv1.PlacementPool{Name: "p", Require: []string{"staging"}}})
		return err == nil, fmt.Sprint(err)
	})
	plain := testkit.Dial(t, addr)
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	// A certificate of the CA whose identity has no role is refused, naming it and the call.
	other, err := grpcx.Dial(addr, grpcx.ClientConfig{TLS: pki["client"]})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, err = nsyncv1.NewNsyncServiceClient(other).PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "identity spiffe://gavel/client has no role") {
		t.Fatalf("an identity without a role: got %v, want PermissionDenied naming it", err)
	}
	if _, err := nsyncv1.NewNsyncServiceClient(plain).PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{}); err == nil {
		t.Fatal("a plaintext client reached the mTLS nsync")
	}
}
