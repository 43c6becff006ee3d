package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/services/auctioneer"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/nsync"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/routeemitter"
	"github.com/gavel-sched/gavel/services/router"
)

// The rules and dashboard Gavel ships.
var (
	rulesDir  = filepath.Join("..", "..", "deployments", "prometheus")
	dashboard = filepath.Join("..", "..", "deployments", "grafana", "gavel-overview.json")
)

// lookPath finds a Prometheus binary or skips the test with one loud line.
func lookPath(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		testkit.SkipWithoutTool(t, name+" is not on PATH (apt-get install prometheus): Gavel's rules are not checked")
	}
	return path
}

// TestPrometheusRules: promtool accepts the shipped configuration and rules, and the rules'
// unit tests (gavel.rules_test.yml) pass.
func TestPrometheusRules(t *testing.T) {
	promtool := lookPath(t, "promtool")
	for _, args := range [][]string{
		{"check", "config", "--syntax-only", "prometheus.yml"}, // its certificates are compose's, under /pki
		{"check", "rules", "gavel.rules.yml"},
		{"test", "rules", "gavel.rules_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = rulesDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestPrometheusLoadsGavelRules runs a real Prometheus against a running cluster whose every
// service serves /metrics over mutual TLS (metrics_tls; the router's admin_tls), scraping as
// the identity spiffe://gavel/prometheus, with the shipped rules: every target is up, every rule group loads
// and evaluates without error, every Gavel metric the rules and the dashboard name is one the
// services export, every dashboard query is valid PromQL that Prometheus answers, and when a
// cell is cut off, GavelCellPresenceLost fires.
func TestPrometheusLoadsGavelRules(t *testing.T) {
	prometheus := lookPath(t, "prometheus")
	jobs := map[string]string{}
	for _, job := range []string{"bbs", "auctioneer", "rep", "nsync", "routeemitter", "router"} {
		jobs["gavel-"+job] = testkit.ReservedAddr(t)
	}
	cell := simCell("cell-0", "z1", nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)
	cell.Config.MetricsAddress, cell.Config.MetricsTLS = jobs["gavel-rep"], true
	doomed := simCell("cell-1", "z2", nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)
	doomed.Config.LeaseTTL = rep.Duration(2 * time.Second)
	c := startClusterWith(t, devcluster.Config{Cells: []devcluster.Cell{cell, doomed}, CellsPerHost: 1, Routing: true, Nsync: true, TLS: true,
		RouteEmitterAddress: "127.0.0.1:0", NsyncAddress: "127.0.0.1:0", RouterHTTPAddress: "127.0.0.1:0",
		RouterAdminAddress:    jobs["gavel-router"],
		ConfigureBBS:          func(c *bbs.Config) { c.MetricsAddress, c.MetricsTLS = jobs["gavel-bbs"], true },
		ConfigureAuctioneer:   func(c *auctioneer.Config) { c.MetricsAddress, c.MetricsTLS = jobs["gavel-auctioneer"], true },
		ConfigureNsync:        func(c *nsync.Config) { c.MetricsAddress, c.MetricsTLS = jobs["gavel-nsync"], true },
		ConfigureRouteEmitter: func(c *routeemitter.Config) { c.MetricsAddress, c.MetricsTLS = jobs["gavel-routeemitter"], true },
		ConfigureRouter:       func(c *router.Config) { c.AdminTLS = true },
	})
	// Some work, and one LRP no cell can take, so that the auction failure series exists.
	ctx := t.Context()
	for _, d := range []struct {
		guid, rootfs string
	}{{"web", "preloaded:cflinuxfs4"}, {"nowhere", "preloaded:no-such-rootfs"}} {
		if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: desiredLRP(d.guid, d.rootfs, 1, nil)}); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join(rulesDir, "gavel.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [%q]\nscrape_configs:\n", rules)
	scraper := c.PKI["prometheus"]
	for job, addr := range jobs {
		fmt.Fprintf(&cfg, "  - {job_name: %s, scheme: https, tls_config: {ca_file: %q, cert_file: %q, key_file: %q}, static_configs: [{targets: [%q]}]}\n",
			job, scraper.CAFile, scraper.CertFile, scraper.KeyFile, addr)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := testkit.ReservedAddr(t)
	cmd := exec.Command(prometheus, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+listen, "--log.level=warn")
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logFile.Name())
			t.Logf("prometheus's log:\n%s", out)
		}
	})
	api := func(path string, query url.Values, out any) error {
		resp, err := http.Get("http://" + listen + "/api/v1/" + path + "?" + query.Encode())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var body struct {
			Status string          `json:"status"`
			Error  string          `json:"error"`
			Data   json.RawMessage `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return err
		}
		if body.Status != "success" {
			return fmt.Errorf("%s: %s", path, body.Error)
		}
		return json.Unmarshal(body.Data, out)
	}

	// Every target up.
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		var targets struct {
			ActiveTargets []struct {
				Labels    map[string]string `json:"labels"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
			} `json:"activeTargets"`
		}
		if err := api("targets", nil, &targets); err != nil {
			return false, err.Error()
		}
		up := 0
		var state []string
		for _, tg := range targets.ActiveTargets {
			if tg.Health == "up" {
				up++
			}
			state = append(state, tg.Labels["job"]+"="+tg.Health+" "+tg.LastError)
		}
		return up == len(jobs), strings.Join(state, ", ")
	}, "every Gavel service scraped")

	// Every metric the rules and the dashboard name is exported by some service. The overload
	// refusals counter has no series until a BBS sheds (pkg/bbsclient's tests cover it).
	rulesText, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	dashText, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, m := range regexp.MustCompile(`(?:^|[^:a-z_])((?:gavel|grpc)_[a-z_]+)`).FindAllStringSubmatch(string(rulesText)+string(dashText), -1) {
		if !slices.Contains([]string{"grpc_code", "grpc_method", "grpc_service"}, m[1]) { // labels
			named = append(named, m[1])
		}
	}
	slices.Sort(named)
	named = slices.Compact(named)
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		var names []string
		if err := api("label/__name__/values", nil, &names); err != nil {
			return false, err.Error()
		}
		var missing []string
		for _, n := range named {
			if n == "gavel_bbs_client_overload_refusals_total" {
				continue
			}
			if !slices.ContainsFunc(names, func(have string) bool {
				return have == n || have == n+"_bucket" || strings.TrimSuffix(n, "_bucket") == have+"_bucket"
			}) {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0, "not exported: " + strings.Join(missing, " ")
	}, "every metric the rules and dashboard name exported")

	// Every rule group loaded and evaluated without error.
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		var rules struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name           string `json:"name"`
					Health         string `json:"health"`
					LastError      string `json:"lastError"`
					LastEvaluation string `json:"lastEvaluation"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := api("rules", nil, &rules); err != nil {
			return false, err.Error()
		}
		n, bad := 0, []string{}
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				n++
				if r.Health != "ok" {
					bad = append(bad, fmt.Sprintf("%s/%s: %s %s", g.Name, r.Name, r.Health, r.LastError))
				}
			}
		}
		want := len(regexp.MustCompile(`(?m)^\s+- (record|alert): `).FindAll(rulesText, -1))
		return len(rules.Groups) == 2 && n == want && len(bad) == 0, fmt.Sprintf("%d groups, %d rules of %d, unhealthy %v", len(rules.Groups), n, want, bad)
	}, "every rule loaded and evaluated")

	// A cell cut off from etcd: its lease expires, and the alert fires.
	if err := c.DisconnectHost(1); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		var alerts struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		}
		if err := api("alerts", nil, &alerts); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, a := range alerts.Alerts {
			if a.Labels["alertname"] == "GavelCellPresenceLost" && a.State == "firing" {
				return true, ""
			}
			seen = append(seen, a.Labels["alertname"]+"="+a.State)
		}
		return false, "alerts: " + strings.Join(seen, ", ")
	}, "GavelCellPresenceLost firing once a cell is cut off")

	// Every dashboard query parses and is answered.
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(dashText, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			var res json.RawMessage
			if err := api("query", url.Values{"query": {tg.Expr}}, &res); err != nil && qctx.Err() == nil {
				t.Errorf("dashboard panel %q: %s: %v", p.Title, tg.Expr, err)
			}
		}
	}
}
