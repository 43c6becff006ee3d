package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/rep"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// env is a live dev cluster (mutual TLS, one simulated cell, routing) and the CLI's global
// flags for it.
type env struct {
	c    *devcluster.Cluster
	args []string
}

// startCluster runs the cluster for the test, with nsync when withNsync is set.
func startCluster(t *testing.T, withNsync bool) *env {
	t.Helper()
	cfg := rep.Default()
	cfg.CellID, cfg.Zone, cfg.Tags = "cell-1", "z1", []string{"staging"}
	cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": "/var/gavel/rootfs/cflinuxfs4"} // the sim backend never reads it
	cfg.Backend = rep.BackendSim
	cfg.Capacity = rep.Capacity{MemoryMB: 1024, DiskMB: 4096, Containers: 10}
	cfg.Sim.StartLatency = rep.Duration(50 * time.Millisecond)
	cfg.Metrics.SampleInterval = rep.Duration(time.Hour) // no sample before the golden listings: their CPU, MEMORY and DISK read "-"
	c := devcluster.New(devcluster.Config{
		Dir:                 t.TempDir(),
		BBSAddress:          "127.0.0.1:0",
		AuctioneerAddress:   "127.0.0.1:0",
		UnsafeNoFsync:       true,
		Cells:               []devcluster.Cell{{Config: cfg}},
		Routing:             true,
		RouteEmitterAddress: "127.0.0.1:0",
		RouterHTTPAddress:   "127.0.0.1:0",
		RouterAdminAddress:  "127.0.0.1:0",
		Nsync:               withNsync,
		NsyncAddress:        "127.0.0.1:0",
		TLS:                 true,
		Logger:              logtest.New(t),
	})
	testkit.Start(t, "cluster", c)
	admin := c.PKI["admin"]
	e := &env{c: c, args: []string{"--bbs", c.BBSAddress, "--route-emitter", c.RouteEmitterAddress,
		"--tls-cert", admin.CertFile, "--tls-key", admin.KeyFile, "--tls-ca", admin.CAFile}}
	if withNsync {
		e.args = append(e.args, "--nsync", c.NsyncAddress)
	}
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		resp, err := c.BBS.Cells(context.Background(), &bbsv1.CellsRequest{})
		return err == nil && len(resp.GetCells()) == 1, fmt.Sprint(resp, err)
	}, "the cell registered")
	return e
}

// result is one CLI run.
type result struct {
	stdout, stderr string
	code           int
}

// run runs the CLI in-process with the cluster's flags and the admin identity.
func (e *env) run(t *testing.T, args ...string) result {
	t.Helper()
	return e.runFor(t, time.Minute, args...)
}

// runFor runs the CLI like run, interrupting it after d (streams run until interrupted).
func (e *env) runFor(t *testing.T, d time.Duration, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	// Interrupted like Ctrl-C (a cancel, not a deadline the server would enforce first).
	ctx, cancel := context.WithCancel(context.Background())
	defer time.AfterFunc(d, cancel).Stop()
	defer cancel()
	err := execute(ctx, append(append([]string(nil), e.args...), args...), strings.NewReader(""), &out, &errOut)
	if err != nil {
		fmt.Fprintln(&errOut, "gavel:", humanError(err))
	}
	return result{stdout: out.String(), stderr: errOut.String(), code: exitCode(err)}
}

// ok runs the CLI and fails the test unless it exits 0.
func (e *env) ok(t *testing.T, args ...string) result {
	t.Helper()
	r := e.run(t, args...)
	if r.code != 0 {
		t.Fatalf("gavel %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// Normalisations of what differs between runs: guids, times, revisions, ephemeral ports.
var normalize = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`), "<GUID>"},
	{regexp.MustCompile(`"\d{4}-\d\d-\d\dT[0-9:.]+Z"`), `"<TIME>"`},
	{regexp.MustCompile(`"(revision|version)": "\d+"`), `"$1": "<N>"`},
	{regexp.MustCompile(`"tableId": "[0-9a-f]+"`), `"tableId": "<ID>"`},
	{regexp.MustCompile(`127\.0\.0\.1:[1-5]\d{4}\b`), "127.0.0.1:<PORT>"},
	{regexp.MustCompile(`revision \d+`), "revision <N>"},
}

// golden compares got with testdata/golden/name (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	for _, n := range normalize {
		got = n.re.ReplaceAllString(got, n.with)
	}
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/gavel -run %s -update)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// TestCommands drives every command against a live cluster: golden tables and JSON, --wait,
// routes kept byte for byte from a YAML file to the router and back, exit codes.
func TestCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a whole cluster")
	}
	nowFunc = func() time.Time { return time.Time{} } // every age reads 0s
	t.Cleanup(func() { nowFunc = time.Now })
	e := startCluster(t, false)

	start, err := e.c.BBS.Cells(context.Background(), &bbsv1.CellsRequest{})
	if err != nil {
		t.Fatal(err)
	}

	// desire-lrp --wait reaches RUNNING, printing progress.
	r := e.ok(t, "desire-lrp", "testdata/web.yaml", "--wait")
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if last := lines[len(lines)-1]; last != "1/1 RUNNING" {
		t.Fatalf("desire-lrp --wait ended with %q, want 1/1 RUNNING:\n%s", last, r.stderr)
	}
	if !strings.HasPrefix(lines[0], "desired LRP web (1 instances) at revision ") {
		t.Fatalf("desire-lrp said %q", lines[0])
	}
	// One instance at a time, so host ports are handed out in index order.
	if r := e.ok(t, "scale", "web", "2", "--wait"); !strings.HasSuffix(r.stderr, "2/2 RUNNING\n") {
		t.Fatalf("scale --wait:\n%s", r.stderr)
	}

	// The routes documents, written as JSON in the YAML file, reach the router and come back
	// byte for byte.
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		eps := e.c.Router.Endpoints("web.example.com")
		return len(eps) == 2, fmt.Sprint(eps)
	}, "web.example.com routed")
	r = e.ok(t, "lrp", "web", "-o", "json")
	for _, want := range []string{
		`"cf-router": [{"port": 8080, "routes": ["web.example.com"], "route_to_instances": true}]`,
		`"skydns": {"host":  "web.skydns.local", "ttl": 30}`,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("lrp -o json does not print %s byte for byte:\n%s", want, r.stdout)
		}
	}
	d, err := e.c.BBS.DesiredLRPByProcessGuid(context.Background(), &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(d.GetDesiredLrp().GetRoutes()["skydns"]); got != `{"host":  "web.skydns.local", "ttl": 30}` {
		t.Fatalf("stored skydns routes %q", got)
	}

	// The event stream from before the desire: one line per event, or one JSON document per
	// revision with the routes documents as written.
	since := fmt.Sprint(start.GetRevision())
	r = e.runFor(t, 2*time.Second, "events", "--since", since, "web")
	for _, want := range []string{"\tdesired_lrp_created\tweb\n", "\tactual_lrp_created\tweb/0 UNCLAIMED \n",
		"\tactual_lrp_changed\tweb/0 RUNNING cell-1\n", "\tdesired_lrp_changed\tweb instances 2\n", "\tactual_lrp_changed\tweb/1 RUNNING cell-1\n"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("events: exit %d, no %q in:\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}
	r = e.runFor(t, 2*time.Second, "events", "--since", since, "-o", "json", "web")
	if r.code != 0 || !strings.Contains(r.stdout, `"desiredLrpCreated": {`) ||
		!strings.Contains(r.stdout, `"skydns": {"host":  "web.skydns.local", "ttl": 30}`) {
		t.Fatalf("events -o json: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}

	e.ok(t, "set-domain", "examples")
	e.ok(t, "desire-task", "testdata/task.json")
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		resp, err := e.c.BBS.TaskByGuid(context.Background(), &bbsv1.TaskByGuidRequest{TaskGuid: "migrate"})
		return err == nil && resp.GetTask().GetState() == modelsv1.Task_STATE_COMPLETED, fmt.Sprint(resp, err)
	}, "the task completed")
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		r := e.run(t, "routes")
		return strings.Contains(r.stdout, "1.web.example.com"), r.stdout + r.stderr
	}, "the route table")

	for _, tt := range []struct{ name, args string }{
		{"lrps.txt", "lrps"},
		{"lrps-wide.txt", "lrps -o wide"},
		{"lrps.json", "lrps -o json"},
		{"lrp.txt", "lrp web"},
		{"lrp.json", "lrp web -o json"},
		{"lrp.yaml", "lrp web -o yaml"},
		{"actual-lrps.txt", "actual-lrps"},
		{"actual-lrps.json", "actual-lrps -o json"},
		{"tasks.txt", "tasks"},
		{"tasks.json", "tasks -o json"},
		{"task.txt", "task migrate"},
		{"cells.txt", "cells"},
		{"cells.json", "cells -o json"},
		{"cell-state.txt", "cell-state cell-1"},
		{"cell-state.json", "cell-state cell-1 -o json"},
		{"tags.txt", "tags"},
		{"tags.json", "tags -o json"},
		{"domains.txt", "domains"},
		{"domains.json", "domains -o json"},
		{"routes.txt", "routes"},
		{"routes.json", "routes -o json"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, tt.name, e.ok(t, strings.Fields(tt.args)...).stdout)
		})
	}

	// --watch prints a list again only when it changes; completion asks the BBS.
	r = e.runFor(t, 1500*time.Millisecond, "lrps", "--watch", "--interval", "100ms")
	if r.code != 0 || strings.Count(r.stdout, "PROCESS_GUID") != 1 || !strings.Contains(r.stdout, "web") {
		t.Fatalf("lrps --watch of an unchanged list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, tt := range []struct{ args []string }{{[]string{"__complete", "lrp", ""}}, {[]string{"__complete", "cell-state", ""}}} {
		r := e.ok(t, tt.args...)
		want := map[string]string{"lrp": "web\n", "cell-state": "cell-1\n"}[tt.args[1]]
		if !strings.HasPrefix(r.stdout, want) {
			t.Fatalf("gavel %s: %q, want %q first", strings.Join(tt.args, " "), r.stdout, want)
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if r := e.ok(t, "completion", shell); !strings.Contains(r.stdout, "gavel") {
			t.Fatalf("completion %s: %q", shell, r.stdout)
		}
	}

	// update-lrp and scale, with --wait.
	e.ok(t, "update-lrp", "web", "--routes", "testdata/routes.yaml", "--label", "app=web", "--label", "tier=front")
	r = e.ok(t, "scale", "web", "3", "--wait")
	if !strings.HasSuffix(strings.TrimSpace(r.stderr), "3/3 RUNNING") {
		t.Fatalf("scale --wait:\n%s", r.stderr)
	}
	r = e.ok(t, "lrp", "web", "-o", "json")
	if !strings.Contains(r.stdout, `"cf-router": [{"port": 8080, "routes": ["www.example.com"]}]`) || strings.Contains(r.stdout, "skydns") ||
		!strings.Contains(r.stdout, `"tier": "front"`) {
		t.Fatalf("after update-lrp:\n%s", r.stdout)
	}
	e.ok(t, "retire-actual-lrp", "web", "2")

	// A placement that no cell can satisfy: CELL_MISMATCH is printed, with its exit code.
	r = e.run(t, "desire-lrp", "testdata/gpu.yaml", "--wait", "--timeout", "30s")
	if r.code != exitCellMismatch {
		t.Fatalf("desire-lrp gpu --wait: exit %d, want %d\n%s", r.code, exitCellMismatch, r.stderr)
	}
	if !strings.Contains(r.stderr, `index 0: CELL_MISMATCH: found no compatible cell: 0/1 cell eligible (1 lacks tag "gpu")`) {
		t.Fatalf("the placement error is not printed:\n%s", r.stderr)
	}

	// Errors: human messages from status details, and exit codes.
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"desire-lrp", "testdata/invalid.yaml"}, exitUsage, "invalid request\n  desired_lrp.process_guid: is required\n  desired_lrp.memory_mb: must not be negative, got -5"},
		{[]string{"desire-lrp", "testdata/web.yaml"}, exitConflict, `already exists: desire lrp web: desired lrp "web" already exists`},
		{[]string{"lrp", "nope"}, exitNotFound, `not found: desired lrp "nope" not found`},
		{[]string{"scale", "web", "many"}, exitUsage, `instance count "many"`},
		{[]string{"lrps", "-o", "xml"}, exitUsage, `output format "xml"`},
		{[]string{"--tls-cert", e.c.PKI["read-only"].CertFile, "--tls-key", e.c.PKI["read-only"].KeyFile, "remove-lrp", "web"}, exitDenied,
			"permission denied: identity spiffe://gavel/read-only (role read-only) may not call /gavel.bbs.v1.BBSService/RemoveDesiredLRP"},
	} {
		r := e.run(t, tt.args...)
		if r.code != tt.code || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("gavel %s: exit %d, stderr:\n%s\nwant exit %d and %q", strings.Join(tt.args, " "), r.code, r.stderr, tt.code, tt.want)
		}
	}

	// Links: a consumer's resolution, and a consumed provider is removed only with --force.
	e.ok(t, "desire-lrp", "testdata/db.yaml", "--wait")
	e.ok(t, "desire-lrp", "testdata/app.yaml", "--wait")
	r = e.ok(t, "links", "app")
	if !strings.HasPrefix(r.stdout, "LINK  INDEX  ID") || !strings.Contains(r.stdout, "db properties: user=admin") {
		t.Fatalf("links app:\n%s", r.stdout)
	}
	if r = e.ok(t, "links", "app", "-o", "json"); !strings.Contains(r.stdout, `"address": "127.0.0.1:61`) {
		t.Fatalf("links app -o json:\n%s", r.stdout)
	}
	if r = e.run(t, "remove-lrp", "db"); r.code != exitConflict || !strings.Contains(r.stderr, `provides links consumed by "app"`) {
		t.Fatalf("remove-lrp of a consumed provider: exit %d\n%s", r.code, r.stderr)
	}
	e.ok(t, "remove-lrp", "db", "--force")

	// Tasks and LRPs go away.
	e.ok(t, "delete-task", "migrate")
	if r := e.run(t, "task", "migrate"); r.code != exitNotFound {
		t.Fatalf("task after delete-task: exit %d", r.code)
	}
	e.ok(t, "remove-lrp", "web")
	if r := e.run(t, "lrp", "web"); r.code != exitNotFound {
		t.Fatalf("lrp after remove-lrp: exit %d", r.code)
	}
}

// The nsync commands: pools, bind, push, scale, stop, over mutual TLS as the admin identity.
func TestNsyncCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a whole cluster")
	}
	e := startCluster(t, true)
	e.ok(t, "pools", "create", "staging", "--require", "staging")
	e.ok(t, "pools", "bind", "space-a", "staging")
	if r := e.ok(t, "pools"); !strings.Contains(r.stdout, "staging") || !strings.Contains(r.stdout, "space-a") {
		t.Fatalf("pools:\n%s", r.stdout)
	}
	e.ok(t, "app", "push", "testdata/nsync-app.yaml")
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		r := e.run(t, "apps")
		return r.code == 0 && strings.Contains(r.stdout, "1/1"), r.stdout + r.stderr
	}, "the app runs")
	r := e.ok(t, "apps", "-o", "json")
	var apps struct {
		Apps []struct {
			App struct {
				Guid string `json:"guid"`
			} `json:"app"`
			Running             int `json:"running"`
			PlacementConstraint struct {
				Require []string `json:"require"`
			} `json:"placementConstraint"`
		} `json:"apps"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &apps); err != nil || len(apps.Apps) != 1 || apps.Apps[0].App.Guid != "web-app" ||
		apps.Apps[0].Running != 1 || fmt.Sprint(apps.Apps[0].PlacementConstraint.Require) != "[staging]" {
		t.Fatalf("apps -o json:\n%s", r.stdout)
	}
	e.ok(t, "app", "scale", "web-app", "2")
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		r := e.run(t, "apps")
		return r.code == 0 && strings.Contains(r.stdout, "2/2"), r.stdout + r.stderr
	}, "the app scaled")
	// -o wide: a row per instance with its CPU, memory and disk (none sampled yet here: "-").
	r = e.ok(t, "apps", "-o", "wide")
	if lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n"); len(lines) != 3 ||
		!strings.HasSuffix(strings.Join(strings.Fields(lines[0]), " "), "PLACEMENT INSTANCE CPU MEMORY DISK NOTE") ||
		!strings.HasPrefix(lines[1], "web-app") || !strings.HasSuffix(strings.Join(strings.Fields(lines[1]), " "), "#0 running - - -") ||
		strings.Join(strings.Fields(lines[2]), " ") != "#1 running - - -" {
		t.Fatalf("apps -o wide: want the app's row with instance 0 and a row of instance 1:\n%s", r.stdout)
	}
	// logs, top and exec take an app's guid for the LRP serving it.
	if r := e.ok(t, "logs", "web-app", "--index", "1"); !strings.Contains(r.stdout, "[CELL/1] OUT container created") {
		t.Fatalf("logs web-app --index 1: want its lifecycle lines:\n%s", r.stdout)
	}
	if r := e.ok(t, "top", "web-app"); len(strings.Split(strings.TrimSpace(r.stdout), "\n")) != 3 {
		t.Fatalf("top web-app: want a header and two instances:\n%s", r.stdout)
	}
	if r := e.run(t, "logs", "no-such-app"); r.code != exitNotFound {
		t.Fatalf("logs no-such-app: exit %d, want %d\n%s", r.code, exitNotFound, r.stderr)
	}
	testDeployCommands(t, e)
	if r := e.run(t, "pools", "delete", "staging"); r.code != exitConflict || !strings.Contains(r.stderr, "space-a") {
		t.Fatalf("pools delete of a bound pool: exit %d\n%s", r.code, r.stderr)
	}
	if r := e.run(t, "pools", "create", "wide", "--require", strings.Repeat("t", 64)); r.code != exitUsage {
		t.Fatalf("pools create with a 64-character tag: exit %d\n%s", r.code, r.stderr)
	}
	e.ok(t, "app", "stop", "--delete", "web-app")
	e.ok(t, "pools", "delete", "staging", "--force")
}

// Routes documents keep their bytes from a file to the stored value.
func TestRoutesFromFiles(t *testing.T) {
	tests := []struct {
		name, src string
		want      map[string]string
	}{
		{"json file", `{"processGuid": "a", "routes": {"cf-router": [ {"port": 8080,  "routes": ["x"]} ], "s": {"h":1}}}`,
			map[string]string{"cf-router": `[ {"port": 8080,  "routes": ["x"]} ]`, "s": `{"h":1}`}},
		{"yaml flow json", "processGuid: a\nroutes:\n  cf-router: [{\"port\": 8080, \"routes\": [\"x\"]}]\n",
			map[string]string{"cf-router": `[{"port": 8080, "routes": ["x"]}]`}},
		{"yaml string of json", "processGuid: a\nroutes:\n  cf-router: '[{\"port\":8080}]'\n",
			map[string]string{"cf-router": `[{"port":8080}]`}},
		{"yaml block", "processGuid: a\nroutes:\n  cf-router:\n    - port: 8080\n      routes: [x.example.com]\n      ssl: true\n",
			map[string]string{"cf-router": `[{"port":8080,"routes":["x.example.com"],"ssl":true}]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			routes, body, err := splitDocument([]byte(tt.src), "routes")
			if err != nil {
				t.Fatal(err)
			}
			if len(routes) != len(tt.want) {
				t.Fatalf("routes %q, want %q", routes, tt.want)
			}
			for k, v := range tt.want {
				if string(routes[k]) != v {
					t.Errorf("routes[%s] = %q, want %q", k, routes[k], v)
				}
			}
			if strings.Contains(string(body), "routes") {
				t.Errorf("body still holds routes: %s", body)
			}
		})
	}
	if _, _, err := splitDocument([]byte("routes:\n  a: 'not json'\n"), "routes"); err == nil {
		t.Error("a string routes document that is not JSON was accepted")
	}
}

// The shipped examples parse, and their routes documents are kept as written.
func TestExamplesParse(t *testing.T) {
	for _, path := range []string{"../../examples/lrp.yaml", "../../examples/hello-compose.yaml"} {
		var d modelsv1.DesiredLRP
		routes, err := readDocument(path, &d, "routes")
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d.GetProcessGuid() == "" || !strings.HasPrefix(string(routes["cf-router"]), `[{"port": 8080, "routes": [`) {
			t.Fatalf("%s: %v routes %q", path, &d, routes)
		}
	}
}

// testDeployCommands rolls web-app (2 instances) out through the CLI: a rolling push with
// --wait, a canary paused then promoted, promote without a paused deployment, a crashing
// version that fails and reverts (exit 1), and the deployment list.
func testDeployCommands(t *testing.T, e *env) {
	t.Helper()
	base, err := os.ReadFile("testdata/nsync-app.yaml")
	if err != nil {
		t.Fatal(err)
	}
	version := func(name, extra string) string {
		p := filepath.Join(t.TempDir(), name+".yaml")
		if err := os.WriteFile(p, []byte(strings.Replace(string(base), "instances: 1", "instances: 2", 1)+extra), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	r := e.ok(t, "app", "push", "--wait", version("v2", "env: {RELEASE: two}\n"))
	if !strings.Contains(r.stderr, "SUCCEEDED: 2/2 new healthy, 0 old left") {
		t.Errorf("push --wait progress:\n%s", r.stderr)
	}
	r = e.ok(t, "app", "push", "--canaries", "1", "--wait", version("v3", "env: {RELEASE: three}\n"))
	if !strings.Contains(r.stderr, "PAUSED") {
		t.Errorf("canary push --wait:\n%s", r.stderr)
	}
	if r := e.ok(t, "apps"); !strings.Contains(r.stdout, "web-app-d2 v2→v3 paused: 1/1 new healthy") {
		t.Errorf("apps during a paused canary:\n%s", r.stdout)
	}
	e.ok(t, "app", "promote", "--wait", "web-app")
	if r := e.run(t, "app", "promote", "web-app"); r.code != exitConflict {
		t.Errorf("promote without a paused deployment: exit %d, want %d\n%s", r.code, exitConflict, r.stderr)
	}
	crash := version("v4", "env: {RELEASE: four}\nhealth_check: {type: TYPE_PORT, timeout_ms: 1}\n")
	if r := e.run(t, "app", "push", "--wait", "--progress-deadline", "20s", crash); r.code != exitError || !strings.Contains(r.stderr, "crashed") || !strings.Contains(r.stderr, "revert") {
		t.Errorf("push of a crashing version: exit %d, want %d\n%s", r.code, exitError, r.stderr)
	}
	r = e.ok(t, "app", "deployments", "web-app")
	for _, want := range []string{"web-app-d1", "SUCCEEDED", "FAILED", "revert of web-app-d3"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("app deployments lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := e.run(t, "app", "push", "--strategy", "sideways", version("v5", "")); r.code != exitUsage {
		t.Errorf("push --strategy sideways: exit %d, want %d", r.code, exitUsage)
	}
}
