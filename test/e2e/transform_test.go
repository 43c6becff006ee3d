package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// TestTransformerPlugins runs the BBS binary with the two example plugins (built binaries on
// real UNIX sockets) in its chain: networking, then filter. An LRP desired through the gRPC API
// runs on a process cell, whose on-create hook gets the app_guid and network_id properties the
// networking plugin added (from a label and from an environment variable), byte for byte, and
// only the environment variables the filter plugin kept.
func TestTransformerPlugins(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the process backend needs Linux")
	}
	networkingBin, filterBin := binary(t, "networking"), binary(t, "filter")
	dir, err := os.MkdirTemp("", "gve2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	netSock, filterSock := filepath.Join(dir, "networking.sock"), filepath.Join(dir, "filter.sock")
	plugins := []*proc{
		startProc(t, "networking", networkingBin, "-socket", netSock),
		startProc(t, "filter", filterBin, "-socket", filterSock, "-prefix", "FOO_"),
	}
	waitSocket(t, plugins[0], netSock)
	waitSocket(t, plugins[1], filterSock)

	c := startClusterWith(t,
		"-transformer", "networking="+netSock+",timeout=2s",
		"-transformer", "filter="+filterSock+",kinds=desired_lrp")
	c.procs = append(c.procs, plugins...)

	const app = "e2e-transformed"
	// The network id comes from the environment with bytes a label could not hold.
	const appGuid, networkID = "app-1234", "net 5678/ü=\"q\""
	lrp := helloLRP(app, "preloaded:cflinuxfs4", c.hello, 1, map[string]string{"owner": "team-a"})
	lrp.Labels = map[string]string{"app_guid": appGuid}
	lrp.Env = []*modelsv1.EnvironmentVariable{
		{Name: "NETWORK_ID", Value: networkID},
		{Name: "FOO_GREETING", Value: "hello"},
		{Name: "SECRET_TOKEN", Value: "s3cr3t"},
		{Name: "FOO_COLOR", Value: "blue"},
	}
	c.desire(t, lrp)

	wantProps := map[string]string{"owner": "team-a", "app_guid": appGuid, "network_id": networkID}
	wantEnv := []string{"FOO_GREETING=hello", "FOO_COLOR=blue"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.bbs.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: app})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetDesiredLrp(); !maps.Equal(got.GetProperties(), wantProps) || !slices.Equal(envStrings(got.GetEnv()), wantEnv) {
		t.Errorf("stored properties %v env %v, want %v and %v", got.GetProperties(), envStrings(got.GetEnv()), wantProps, wantEnv)
	}

	a := c.waitRunning(t, app, 1, 20*time.Second)[0]
	if _, err := get(a); err != nil {
		t.Fatalf("the transformed app does not answer: %v", err)
	}
	type spec struct {
		Kind        string            `json:"kind"`
		ProcessGuid string            `json:"process_guid"`
		Properties  map[string]string `json:"properties"`
		Env         []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"env"`
	}
	var found bool
	for _, line := range strings.Split(readFile(t, c.hookLog), "\n") {
		var s spec
		if json.Unmarshal([]byte(line), &s) != nil || s.ProcessGuid != app {
			continue
		}
		found = true
		var env []string // the work's own variables: the cell adds INSTANCE_*, CF_INSTANCE_* and PORT*
		for _, e := range s.Env {
			if !strings.HasPrefix(e.Name, "INSTANCE_") && !strings.HasPrefix(e.Name, "CF_INSTANCE_") && !strings.HasPrefix(e.Name, "PORT") {
				env = append(env, e.Name+"="+e.Value)
			}
		}
		if s.Properties["app_guid"] != appGuid || s.Properties["network_id"] != networkID || !maps.Equal(s.Properties, wantProps) {
			t.Errorf("on-create hook got properties %q, want %q", s.Properties, wantProps)
		}
		if !slices.Equal(env, wantEnv) {
			t.Errorf("on-create hook got env %q, want only the FOO_ variables %q", env, wantEnv)
		}
	}
	if !found {
		t.Fatalf("the on-create hook never saw %s; log:\n%s", app, readFile(t, c.hookLog))
	}
}

func envStrings(env []*modelsv1.EnvironmentVariable) []string {
	var out []string
	for _, e := range env {
		out = append(out, e.GetName()+"="+e.GetValue())
	}
	return out
}

// waitSocket waits until a plugin answers describe on its socket.
func waitSocket(t *testing.T, p *proc, socket string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get("http://plugin/describe")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("describe answered %s", resp.Status)
		}
		select {
		case <-p.Exited:
			t.Fatalf("%s exited (%v): %s", p.Name, p.Err, p.Out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not serving on %s within 10s: %v", p.Name, socket, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
