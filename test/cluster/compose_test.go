//go:build cluster

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// composeDeployment is deployments/docker/compose.yaml brought up as shipped, under its own
// project name, image tag, certificate directory and /24 (GAVEL_NET), with every published port
// an ephemeral one on 127.0.0.1, so it coexists with TestCluster and with a hand-run deployment.
type composeDeployment struct {
	t       *testing.T
	root    string   // the repository
	cmd     []string // "docker compose" or "docker-compose"
	project string
	env     []string // GAVEL_* variables compose.yaml reads
	cli     string   // the gavel CLI built for the host
	pki     string
}

// composeCommand is the compose implementation present: the docker CLI plugin or docker-compose.
func composeCommand() ([]string, error) {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}, nil
	}
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}, nil
	}
	return nil, fmt.Errorf("neither `docker compose` nor docker-compose is installed")
}

// compose runs a compose subcommand on the project and returns its trimmed combined output.
func (c *composeDeployment) compose(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	full := append(append(c.cmd[1:len(c.cmd):len(c.cmd)], "-p", c.project, "-f", filepath.Join(c.root, "deployments/docker/compose.yaml")), args...)
	cmd := exec.CommandContext(ctx, c.cmd[0], full...)
	cmd.Env = append(os.Environ(), c.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", strings.Join(c.cmd, " "), strings.Join(full, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// run runs a command in the repository and fails the test if it fails.
func (c *composeDeployment) run(name string, args ...string) {
	c.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = c.root
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// port is the 127.0.0.1 address compose published a service's container port on.
func (c *composeDeployment) port(service, port string) string {
	c.t.Helper()
	out, err := c.compose("port", service, port)
	if err != nil || !strings.HasPrefix(out, "127.0.0.1:") {
		c.t.Fatalf("%s's port %s: %v %q", service, port, err, out)
	}
	return out
}

// gavel runs the host's CLI with the admin identity.
func (c *composeDeployment) gavel(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.cli, args...)
	cmd.Env = append(os.Environ(), "GAVEL_TLS_CERT="+filepath.Join(c.pki, "admin.crt"),
		"GAVEL_TLS_KEY="+filepath.Join(c.pki, "admin.key"), "GAVEL_TLS_CA="+filepath.Join(c.pki, "ca.crt"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("gavel %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// scrapeTLS reads https://addr/metrics as spiffe://gavel/prometheus, as the deployment's
// Prometheus does (every /metrics is served over mutual TLS).
func (c *composeDeployment) scrapeTLS(addr string) (string, error) {
	tc, err := tlsx.Config{CertFile: filepath.Join(c.pki, "prometheus.crt"), KeyFile: filepath.Join(c.pki, "prometheus.key"),
		CAFile: filepath.Join(c.pki, "ca.crt"), ServerName: "localhost"}.ClientTLS()
	if err != nil {
		return "", err
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	resp, err := client.Get("https://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET https://%s/metrics: %s", addr, resp.Status)
	}
	return string(body), err
}

// prometheusUp reports whether the Prometheus at addr has want targets, every one up, and
// Gavel's rule groups loaded.
func prometheusUp(addr string, want int) (bool, string) {
	var targets struct {
		Data struct {
			ActiveTargets []struct {
				ScrapeURL string `json:"scrapeUrl"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	var rules struct {
		Data struct {
			Groups []struct{ Name string } `json:"groups"`
		} `json:"data"`
	}
	for path, out := range map[string]any{"targets": &targets, "rules": &rules} {
		resp, err := http.Get("http://" + addr + "/api/v1/" + path)
		if err != nil {
			return false, err.Error()
		}
		err = json.NewDecoder(resp.Body).Decode(out)
		resp.Body.Close()
		if err != nil {
			return false, err.Error()
		}
	}
	var state []string
	up := 0
	for _, tg := range targets.Data.ActiveTargets {
		if tg.Health == "up" && strings.HasPrefix(tg.ScrapeURL, "https://") {
			up++
		}
		state = append(state, tg.ScrapeURL+" "+tg.Health+" "+tg.LastError)
	}
	return up == want && len(targets.Data.ActiveTargets) == want && len(rules.Data.Groups) > 0,
		fmt.Sprintf("%d/%d targets up, %d rule groups: %s", up, want, len(rules.Data.Groups), strings.Join(state, "; "))
}

// get fetches http://addr/ with a Host header through the router.
func get(addr, host string) (bool, string) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	req.Host = host
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return false, err.Error()
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, fmt.Sprintf("%s %s", resp.Status, body)
}

// TestCompose brings up deployments/docker/compose.yaml itself (mTLS on every hop, nsync included)
// with the image and certificates the Makefile makes, desires the sample app through the CLI,
// pushes an app through nsync, reaches both through the router, reads per-RPC histograms on
// every service's /metrics over mutual TLS, and sees the deployment's Prometheus scrape all ten
// over mutual TLS with Gavel's rules loaded, all through ports published on 127.0.0.1; `down -v`
// always follows.
func TestCompose(t *testing.T) {
	start := time.Now()
	cmd, err := composeCommand()
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	id := randomHex(4)
	c := &composeDeployment{t: t, root: root, cmd: cmd, project: "gavel-compose-" + id, pki: filepath.Join(t.TempDir(), "pki")}
	image := "gavel-compose-test:" + id

	promImage := "gavel-compose-test-prometheus:" + id
	c.run("make", "image", "IMAGE="+image, "PROMETHEUS_IMAGE="+promImage)
	t.Cleanup(func() { _, _ = docker("rmi", "-f", image, promImage) })
	c.cli = filepath.Join(t.TempDir(), "gavel")
	c.run("go", "build", "-o", c.cli, "./cmd/gavel")
	// A /24 of its own: 10.150-199.x (TestCluster takes 10.200-249.x; compose.yaml's default
	// 172.29.0 stays free for a deployment run by hand).
	net := fmt.Sprintf("10.%d.%d", 150+mrand.IntN(50), mrand.IntN(256))
	c.run("make", "compose-certs", "COMPOSE_NET="+net, "COMPOSE_PKI="+c.pki)
	c.env = []string{"GAVEL_IMAGE=" + image, "GAVEL_NET=" + net, "GAVEL_PKI=" + c.pki,
		"GAVEL_BBS0_PORT=", "GAVEL_BBS1_PORT=", "GAVEL_NSYNC_PORT=", "GAVEL_ROUTER_PORT=", "GAVEL_ROUTER_ADMIN_PORT=",
		"GAVEL_PROMETHEUS_IMAGE=" + promImage, "GAVEL_PROMETHEUS_PORT="}
	t.Logf("image, CLI and certificates ready after %s; project %s on %s.0/24 with %s", time.Since(start).Round(time.Millisecond), c.project, net, strings.Join(cmd, " "))

	t.Cleanup(func() {
		if t.Failed() {
			if out, err := c.compose("logs", "--no-color", "--tail", "30"); err == nil {
				t.Logf("last log lines:\n%s", out)
			}
		}
		if out, err := c.compose("down", "-v", "--remove-orphans"); err != nil {
			t.Errorf("down -v: %v\n%s", err, out)
		}
	})
	if out, err := c.compose("up", "-d"); err != nil {
		t.Fatalf("up -d: %v\n%s", err, out)
	}
	up := time.Now()

	bbs := c.port("bbs-0", "8889") + "," + c.port("bbs-1", "8889")
	nsync := c.port("nsync", "8895")
	router := c.port("router", "8080")
	metrics := map[string]string{"router": c.port("router", "8081")}
	for _, s := range []string{"bbs-0", "bbs-1", "auctioneer-0", "auctioneer-1", "rep-z1", "rep-z2", "rep-z3", "nsync", "routeemitter"} {
		metrics[s] = c.port(s, "9090")
	}

	testkit.EventuallyState(t, waitLong, func() (bool, string) {
		out, err := c.gavel("--bbs", bbs, "cells")
		if err != nil {
			return false, err.Error()
		}
		return strings.Count(out, "cell-z") == 3, out
	}, "the 3 cells to register at the BBS")
	t.Logf("3 cells present %s after up", time.Since(up).Round(time.Millisecond))

	out, err := c.gavel("--bbs", bbs, "desire-lrp", filepath.Join(root, "examples/hello-compose.yaml"), "--wait", "--timeout", "90s")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gavel desire-lrp --wait:\n%s", out)
	testkit.EventuallyState(t, waitLong, func() (bool, string) { return get(router, "hello.example.com") }, "hello.example.com through the router")

	app, err := os.ReadFile(filepath.Join(root, "examples/app.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	appFile := filepath.Join(t.TempDir(), "app.yaml")
	if err := os.WriteFile(appFile, []byte(strings.ReplaceAll(string(app), "@HELLO@", "/bin/hello")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.gavel("--nsync", nsync, "app", "push", appFile); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("gavel app push:\n%s", out)
	}
	testkit.EventuallyState(t, waitLong, func() (bool, string) { return get(router, "hello-app.gavel.local") }, "the nsync app through the router")
	if out, err := c.gavel("--nsync", nsync, "apps"); err != nil || !strings.Contains(out, "hello-app") {
		t.Fatalf("gavel apps: %v\n%s", err, out)
	}
	t.Logf("both apps answer through the router %s after up", time.Since(up).Round(time.Millisecond))

	// Per-RPC histograms (go-grpc-middleware) on every service, and the calls of this flow
	// counted: the CLI's DesireLRP at a BBS, the app push at nsync and nsync's DesireLRP as a
	// client, the auctions, the placement at a rep, the reps' StartActualLRP and the router's
	// route stream.
	want := map[string][]*regexp.Regexp{
		"router": {regexp.MustCompile(`grpc_client_started_total\{grpc_method="WatchRoutes"[^}]*\} [1-9]`)},
		"nsync": {handled("server", "gavel.nsync.v1.NsyncService", "DeployApp"),
			handled("client", "gavel.bbs.v1.BBSService", "DesireLRP")},
	}
	testkit.EventuallyState(t, waitLong, perRPCMetrics(c.scrapeTLS, metrics, want, desireFlow()), "per-RPC histograms on every service's /metrics (mutual TLS)")

	// The deployment's Prometheus scrapes all ten over mutual TLS and has loaded Gavel's rules.
	prom := c.port("prometheus", "9090")
	testkit.EventuallyState(t, waitLong, func() (bool, string) { return prometheusUp(prom, len(metrics)) }, "Prometheus scraping every service over mutual TLS")
	t.Logf("compose deployment checked %s after the start (%s after up)", time.Since(start).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
}
