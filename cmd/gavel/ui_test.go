package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/services/rep"
)

// liveBound is the bound: a desire appears on the open page within a second.
const liveBound = time.Second

// chromium finds a Chromium or Chrome binary, or skips the test with one loud line.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testkit.SkipWithoutTool(t, "no chromium, chromium-browser or google-chrome on PATH: the console's browser tests need one (Debian: apt-get install chromium)")
	return ""
}

// startConsoleCluster runs a TLS dev cluster with two simulated cells in two zones, the
// routing tier and nsync.
func startConsoleCluster(t *testing.T) *env {
	t.Helper()
	cell := func(id, zone string, tags []string, mem int32) devcluster.Cell {
		cfg := rep.Default()
		cfg.CellID, cfg.Zone, cfg.Tags = id, zone, tags
		cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": "/var/gavel/rootfs/cflinuxfs4"} // the sim backend never reads it
		cfg.Backend = rep.BackendSim
		cfg.Capacity = rep.Capacity{MemoryMB: mem, DiskMB: 4096, Containers: 10}
		cfg.Sim.StartLatency = rep.Duration(50 * time.Millisecond)
		return devcluster.Cell{Config: cfg}
	}
	c := devcluster.New(devcluster.Config{
		Dir:                 t.TempDir(),
		BBSAddress:          "127.0.0.1:0",
		AuctioneerAddress:   "127.0.0.1:0",
		UnsafeNoFsync:       true,
		Cells:               []devcluster.Cell{cell("cell-1", "z1", []string{"staging"}, 1024), cell("cell-2", "z2", nil, 512)},
		Routing:             true,
		RouteEmitterAddress: "127.0.0.1:0",
		RouterHTTPAddress:   "127.0.0.1:0",
		RouterAdminAddress:  "127.0.0.1:0",
		Nsync:               true,
		NsyncAddress:        "127.0.0.1:0",
		TLS:                 true,
		Logger:              logtest.New(t),
	})
	testkit.Start(t, "cluster", c)
	admin := c.PKI["admin"]
	e := &env{c: c, args: []string{"--bbs", c.BBSAddress, "--route-emitter", c.RouteEmitterAddress, "--nsync", c.NsyncAddress,
		"--tls-cert", admin.CertFile, "--tls-key", admin.KeyFile, "--tls-ca", admin.CAFile}}
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		resp, err := c.BBS.Cells(context.Background(), &bbsv1.CellsRequest{})
		return err == nil && len(resp.GetCells()) == 2, fmt.Sprint(resp, err)
	}, "both cells registered")
	return e
}

// startUI runs `gavel ui --listen 127.0.0.1:0` with identity's certificate until the test
// ends, and returns the URL it prints.
func (e *env) startUI(t *testing.T, identity string) string {
	t.Helper()
	id := e.c.PKI[identity]
	args := []string{"--bbs", e.c.BBSAddress, "--route-emitter", e.c.RouteEmitterAddress, "--nsync", e.c.NsyncAddress,
		"--tls-cert", id.CertFile, "--tls-key", id.KeyFile, "--tls-ca", id.CAFile, "ui", "--listen", "127.0.0.1:0"}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := execute(ctx, args, strings.NewReader(""), pw, logWriter{t})
		pw.CloseWithError(fmt.Errorf("gavel ui returned: %v", err))
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gavel ui: %v", err)
		}
	})
	first, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("gavel ui printed no URL: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	u := regexp.MustCompile(`http://\S+/`).FindString(first)
	if u == "" || !strings.Contains(first, "role "+identity) {
		t.Fatalf("gavel ui printed %q, want its URL and role %s", first, identity)
	}
	return strings.TrimSuffix(u, "/")
}

// logWriter sends the console's logs to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// newBrowser starts a headless Chromium for the test.
func newBrowser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1200, 760))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser, which lives as long as ctx
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// browseLimit only stops a hung test: it is no assertion.
const browseLimit = 30 * time.Second

// browse runs browser steps in order.
func browse(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browseLimit)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v\nthe page:\n%s", what, err, pageText(ctx))
	}
}

// pageText is the open page's text, for a failure's message.
func pageText(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil {
		return err.Error()
	}
	return text
}

// value runs one browser action and returns its value.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browseLimit)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// screenshot saves the viewport into docs/images with -update (the operator guide shows
// them).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if !*update {
		return
	}
	png := value(t, ctx, "screenshot "+name, chromedp.CaptureScreenshot())
	path := filepath.Join("..", "..", "docs", "images", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConsole drives `gavel ui` in a real headless Chromium against a TLS dev cluster of two
// cells: the cells page draws each cell's and zone's bars; an LRP desired with the CLI appears
// on the open LRPs page within a second without a reload; a CELL_MISMATCH shows its reason in
// words with the per-reason cell counts; admin scales from the page (click, confirm) and the
// BBS stores the new count; admin restarts an nsync app from the apps page and nsync brings up
// its next version; a read-only console shows no action button, and requests crafted with the
// read-only certificate are refused by the BBS and by nsync (PermissionDenied), as the page says.
// With -update it saves the screenshots docs/operations.md shows.
func TestConsole(t *testing.T) {
	path := chromium(t)
	e := startConsoleCluster(t)
	adminURL := e.startUI(t, "admin")
	ctx := newBrowser(t, path)

	t.Run("cells page shows each cell's bars", func(t *testing.T) {
		browse(t, ctx, "cells page", chromedp.Navigate(adminURL+"/cells"), chromedp.WaitVisible(chromedp.CSS(`#cell-cell-2 meter`)))
		meters := value(t, ctx, "meters", chromedp.Evaluate[int](`document.querySelectorAll('.cell meter').length`))
		zones := value(t, ctx, "zones", chromedp.Evaluate[int](`document.querySelectorAll('.zone').length`))
		if meters != 6 || zones != 2 {
			t.Fatalf("%d meters on the cells, %d zones: want 3 bars (memory, disk, containers) on each of 2 cells, 2 zones", meters, zones)
		}
		known := value(t, ctx, "cells' use", chromedp.Evaluate[int](`[...document.querySelectorAll('.cell .num')].filter(n => !n.textContent.startsWith('?')).length`))
		if known != 6 {
			t.Fatalf("%d of 6 bars show a known use (each rep's State)", known)
		}
	})

	t.Run("a desired LRP appears live", func(t *testing.T) {
		browse(t, ctx, "LRPs page", chromedp.Navigate(adminURL+"/lrps"), chromedp.WaitVisible(chromedp.CSS(`body[data-live="1"]`)))
		e.ok(t, "desire-lrp", "testdata/web.yaml")
		wctx, cancel := context.WithTimeout(ctx, liveBound)
		defer cancel()
		if err := chromedp.Do(wctx, chromedp.WaitVisible(chromedp.CSS(`#lrp-web`))); err != nil {
			t.Fatalf("the LRP desired with the CLI is not on the open page within %s: %v", liveBound, err)
		}
		// The instance's placement follows: running on a cell.
		browse(t, ctx, "instance running", chromedp.WaitVisible(chromedp.CSS(`#lrp-web .state.running`)))
	})

	t.Run("a CELL_MISMATCH shows its reason", func(t *testing.T) {
		lrp := filepath.Join(t.TempDir(), "old.yaml")
		if err := os.WriteFile(lrp, []byte("processGuid: old-stack\ndomain: examples\nrootfs: preloaded:lucid64\ninstances: 2\nmemoryMb: 64\ndiskMb: 64\naction:\n  run:\n    path: /bin/old\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		e.ok(t, "desire-lrp", lrp)
		browse(t, ctx, "placement error", chromedp.WaitVisible(chromedp.CSS(`#lrp-old-stack .problem[data-code="CELL_MISMATCH"]`)))
		words := value(t, ctx, "placement words", chromedp.Text(chromedp.CSS(`#lrp-old-stack .problem b`)))
		reasons := value(t, ctx, "placement reasons", chromedp.Text(chromedp.CSS(`#lrp-old-stack .reasons`)))
		if !strings.Contains(words, "No cell can run it") || !strings.Contains(reasons, `2 lack rootfs "preloaded:lucid64"`) {
			t.Fatalf("placement shown as %q with reasons %q: want it in words and the per-reason cell count", words, reasons)
		}
		screenshot(t, ctx, "console-lrps.png")
	})

	t.Run("admin scales from the page", func(t *testing.T) {
		browse(t, ctx, "scale", chromedp.Navigate(adminURL+"/lrps/web"), chromedp.WaitVisible(chromedp.CSS(`#scale`)),
			chromedp.SetValue(chromedp.CSS(`#instances`), "3"), chromedp.Click(chromedp.CSS(`#scale`)),
			chromedp.WaitVisible(chromedp.CSS(`#confirm`)), chromedp.Click(chromedp.CSS(`#confirm`)),
			chromedp.WaitVisible(chromedp.CSS(`#done`)))
		resp, err := e.c.BBS.DesiredLRPByProcessGuid(context.Background(), &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
		if err != nil || resp.GetDesiredLrp().GetInstances() != 3 {
			t.Fatalf("after scaling from the page the BBS has %d instances (%v), want 3", resp.GetDesiredLrp().GetInstances(), err)
		}
		browse(t, ctx, "three running", chromedp.WaitVisible(chromedp.CSS(`.instance[data-index="2"] .state.running`)))
		screenshot(t, ctx, "console-lrp.png")
		browse(t, ctx, "cells page", chromedp.Navigate(adminURL+"/cells"), chromedp.WaitVisible(chromedp.CSS(`#cell-cell-2 meter`)))
		screenshot(t, ctx, "console-cells.png")
		browse(t, ctx, "events page", chromedp.Navigate(adminURL+"/events"), chromedp.WaitVisible(chromedp.CSS(`#lines li`)))
		screenshot(t, ctx, "console-events.png")
	})

	t.Run("admin restarts an app from the page", func(t *testing.T) {
		app := &nsyncv1.App{Guid: "shop", Name: "shop", SpaceGuid: "space-a", Stack: "cflinuxfs4", Command: "/bin/shop",
			Instances: 1, MemoryMb: 64, DiskMb: 64, Ports: []uint32{8080}}
		if _, err := e.c.Nsync.DesireApp(context.Background(), &nsyncv1.DesireAppRequest{App: app}); err != nil {
			t.Fatal(err)
		}
		browse(t, ctx, "apps page", chromedp.Navigate(adminURL+"/apps"), chromedp.WaitVisible(chromedp.CSS(`#app-shop a[href="/lrps/shop-v1"]`)))
		testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
			counts := value(t, ctx, "app counts", chromedp.Evaluate[string](`document.querySelector('#app-shop .counts').textContent`))
			return strings.HasPrefix(strings.TrimSpace(counts), "1 / 1"), counts
		}, "the apps page shows the app's instance running (live, without a reload)")
		screenshot(t, ctx, "console-apps.png")
		browse(t, ctx, "restart", chromedp.Click(chromedp.CSS(`#restart-shop`)),
			chromedp.WaitVisible(chromedp.CSS(`#confirm`)), chromedp.Click(chromedp.CSS(`#confirm`)),
			chromedp.WaitVisible(chromedp.CSS(`#done`)))
		testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
			resp, err := e.c.Nsync.Apps(context.Background(), &nsyncv1.AppsRequest{Guids: []string{"shop"}})
			if err != nil || len(resp.GetApps()) != 1 {
				return false, fmt.Sprint(resp, err)
			}
			return resp.GetApps()[0].GetApp().GetVersion() == 2, fmt.Sprint(resp.GetApps()[0])
		}, "the app restarted to version 2 after the page's restart")
	})

	t.Run("read-only sees no actions and is refused", func(t *testing.T) {
		roURL := e.startUI(t, "read-only")
		for _, page := range []string{"/lrps/web", "/lrps", "/apps", "/tasks", "/cells"} {
			browse(t, ctx, "read-only "+page, chromedp.Navigate(roURL+page), chromedp.WaitVisible(chromedp.CSS(`#main`)))
			actions := value(t, ctx, "action controls", chromedp.Evaluate[int](`document.querySelectorAll('#main button, #main a.act, #main form').length`))
			if actions != 0 {
				t.Fatalf("read-only %s shows %d action controls, want none", page, actions)
			}
		}
		// A crafted request (the console's own token, the read-only certificate): the BBS refuses.
		token := value(t, ctx, "token", chromedp.AttributeValue(chromedp.CSS(`meta[name="csrf"]`), "content")).Value
		resp, err := http.PostForm(roURL+"/act", url.Values{"csrf": {token}, "action": {"scale"}, "guid": {"web"}, "instances": {"7"}})
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "refused by the BBS: PermissionDenied") {
			t.Fatalf("crafted scale as read-only: %s\n%s\nwant 403 and the BBS's PermissionDenied", resp.Status, body)
		}
		resp, err = http.PostForm(roURL+"/act", url.Values{"csrf": {token}, "action": {"restart"}, "guid": {"shop"}})
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "refused by nsync: PermissionDenied") {
			t.Fatalf("crafted restart as read-only: %s\n%s\nwant 403 and nsync's PermissionDenied", resp.Status, body)
		}
		// The same through the browser: the confirmation page, reached by its URL, shows the refusal.
		browse(t, ctx, "refusal", chromedp.Navigate(roURL+"/confirm?action=scale&guid=web&instances=7"), chromedp.Click(chromedp.CSS(`#confirm`)),
			chromedp.WaitVisible(chromedp.CSS(`#error`)))
		refusal := value(t, ctx, "refusal", chromedp.Text(chromedp.CSS(`#error`)))
		if !strings.Contains(refusal, "PermissionDenied") {
			t.Fatalf("the page says %q, want the BBS's PermissionDenied", refusal)
		}
		screenshot(t, ctx, "console-refused.png")
		got, err := e.c.BBS.DesiredLRPByProcessGuid(context.Background(), &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
		if err != nil || got.GetDesiredLrp().GetInstances() != 3 {
			t.Fatalf("after the refused scale the BBS has %d instances (%v), want 3", got.GetDesiredLrp().GetInstances(), err)
		}
	})
}
