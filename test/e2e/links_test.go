package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// linkReport is what the linkclient example answers.
type linkReport struct {
	Link struct {
		Nodes []struct {
			ID      string `json:"id"`
			Index   int32  `json:"index"`
			Address string `json:"address"`
		} `json:"nodes"`
		Properties map[string]string `json:"properties"`
	} `json:"link"`
	Answers []struct {
		Address string `json:"address"`
		Answer  string `json:"answer"`
		Error   string `json:"error"`
	} `json:"answers"`
	Env  map[string]json.RawMessage `json:"env"`
	Hups int64                      `json:"hups"`
}

func consumerReport(a *modelsv1.ActualLRP) (linkReport, error) {
	var rep linkReport
	var hostPort uint32
	for _, pm := range a.GetNetInfo().GetPorts() {
		if pm.GetContainerPort() == 8080 {
			hostPort = pm.GetHostPort()
		}
	}
	resp, err := httpClient.Get(fmt.Sprintf("http://127.0.0.1:%d/", hostPort))
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return rep, err
	}
	if resp.StatusCode != 200 {
		return rep, fmt.Errorf("%s: %s", resp.Status, body)
	}
	return rep, json.Unmarshal(body, &rep)
}

func (c *cluster) scale(t *testing.T, guid string, n int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.bbs.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: guid, Update: &modelsv1.DesiredLRPUpdate{Instances: &n}}); err != nil {
		t.Fatalf("scale %s to %d: %v", guid, n, err)
	}
}

// TestLinksFollowProviders runs a provider (the hello app) and a consumer (the linkclient app)
// on process cells: the consumer reads the provider's addresses from its link file and
// reaches each, while the provider scales 2 → 4 → 1, crashes and restarts.
func TestLinksFollowProviders(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the process backend needs Linux")
	}
	c := startCluster(t)
	client := binary(t, "linkclient")
	const provider, consumer = "e2e-links-db", "e2e-links-web"

	p := helloLRP(provider, "preloaded:cflinuxfs4", c.hello, 2, nil)
	p.Links = &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "backend", Type: "hello", Port: 8080, Properties: map[string]string{"proto": "http"}}}}
	c.desire(t, p)
	cons := helloLRP(consumer, "preloaded:cflinuxfs4", client, 1, nil)
	cons.Links = &modelsv1.Links{SignalOnChange: true, Consumes: []*modelsv1.LinkConsume{{Name: "backend", Type: "hello"}}}
	c.desire(t, cons)
	web := c.waitRunning(t, consumer, 1, 30*time.Second)[0]

	// follows waits until the consumer's link file lists exactly the provider's n running
	// instances and the consumer reached every one of them, and returns its report.
	follows := func(t *testing.T, n int) linkReport {
		t.Helper()
		running := c.waitRunning(t, provider, n, 30*time.Second)
		want := make([]string, n)
		for i, a := range running {
			want[i] = fmt.Sprintf("127.0.0.1:%d", a.GetNetInfo().GetPorts()[0].GetHostPort())
		}
		var rep linkReport
		c.waitFor(t, 20*time.Second, fmt.Sprintf("the consumer to reach %d providers", n), func() (bool, string) {
			var err error
			if rep, err = consumerReport(web); err != nil {
				return false, err.Error()
			}
			var got []string
			for i, a := range rep.Answers {
				if !strings.HasPrefix(a.Answer, fmt.Sprintf("hello from instance %d ", rep.Link.Nodes[i].Index)) {
					return false, fmt.Sprintf("%s answered %q %s", a.Address, a.Answer, a.Error)
				}
				got = append(got, a.Address)
			}
			sort.Strings(got)
			sort.Strings(want)
			return slices.Equal(got, want), fmt.Sprintf("file lists %v, want %v", got, want)
		})
		return rep
	}

	t.Run("the consumer reaches each provider instance from its link file", func(t *testing.T) {
		rep := follows(t, 2)
		if rep.Link.Properties["proto"] != "http" {
			t.Errorf("properties %v", rep.Link.Properties)
		}
		if _, ok := rep.Env["backend"]; !ok {
			t.Errorf("GAVEL_LINKS %v has no backend link", rep.Env)
		}
	})
	t.Run("scale 2 → 4 → 1: the file follows", func(t *testing.T) {
		before := follows(t, 2).Hups
		c.scale(t, provider, 4)
		follows(t, 4)
		c.scale(t, provider, 1)
		follows(t, 1)
		c.waitFor(t, 10*time.Second, "SIGHUPs for the rewrites", func() (bool, string) {
			rep, err := consumerReport(web)
			if err != nil {
				return false, err.Error()
			}
			return rep.Hups > before, fmt.Sprintf("SIGHUPs %d → %d", before, rep.Hups)
		})
	})
	// linkFile is the consumer's link file on the host: in its container directory, or below
	// the preloaded rootfs when the rep may chroot.
	linkFile := func(t *testing.T) string {
		t.Helper()
		guid := web.GetInstanceKey().GetInstanceGuid()
		files, _ := filepath.Glob(filepath.Join(c.dir, "cell-*", "containers", guid, ".gavel", "links", guid, "backend.json"))
		chrooted, _ := filepath.Glob(filepath.Join(c.dir, "cflinuxfs4", ".gavel", "links", guid, "backend.json"))
		files = append(files, chrooted...)
		if len(files) != 1 {
			t.Fatalf("link files of the consumer: %v", files)
		}
		return files[0]
	}
	type fileNodes struct {
		Nodes []struct {
			ID string `json:"id"`
		} `json:"nodes"`
	}
	t.Run("a crashed provider instance leaves the file until it runs again", func(t *testing.T) {
		file := linkFile(t)
		hupsBefore := follows(t, 1).Hups
		h, err := get(c.waitRunning(t, provider, 1, 10*time.Second)[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(h.pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Every distinct content of the file, read every millisecond: the crashed instance's
		// node goes, then its replacement's comes.
		var seen [][]string
		last := ""
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("link file nodes seen %v: want the crashed %s gone, then a new one", seen, h.guid)
			}
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) == last {
				continue
			}
			last = string(b)
			var fn fileNodes
			if err := json.Unmarshal(b, &fn); err != nil {
				t.Fatalf("the link file is not whole JSON: %q: %v", b, err)
			}
			var ids []string
			for _, n := range fn.Nodes {
				ids = append(ids, n.ID)
			}
			seen = append(seen, ids)
			if len(ids) == 1 && ids[0] != h.guid {
				break
			}
		}
		if len(seen) < 2 || len(seen[len(seen)-2]) != 0 {
			t.Fatalf("link file nodes seen %v: want no node between the crash of %s and its replacement", seen, h.guid)
		}
		follows(t, 1)
		// The signal follows each rewrite: two rewrites, two SIGHUPs.
		c.waitFor(t, 10*time.Second, "a SIGHUP per rewrite", func() (bool, string) {
			rep, err := consumerReport(web)
			if err != nil {
				return false, err.Error()
			}
			return rep.Hups >= hupsBefore+2, fmt.Sprintf("SIGHUPs %d → %d", hupsBefore, rep.Hups)
		})
	})
	t.Run("provider RUNNING to link file rewritten", func(t *testing.T) {
		files := []string{linkFile(t)}
		var lat []time.Duration
		for i := 0; i < 20; i++ {
			before, err := os.ReadFile(files[0])
			if err != nil {
				t.Fatal(err)
			}
			// Poll the file tightly from the scale on (file mtimes are too coarse to time a
			// millisecond): the figure is an upper bound, by at most one poll interval.
			seenCh := make(chan time.Time, 1)
			go func() {
				defer close(seenCh)
				for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
					if b, err := os.ReadFile(files[0]); err == nil && string(b) != string(before) {
						seenCh <- time.Now()
						return
					}
				}
			}()
			c.scale(t, provider, 2)
			a := c.waitRunning(t, provider, 2, 30*time.Second)[1]
			addr := fmt.Sprintf("127.0.0.1:%d", a.GetNetInfo().GetPorts()[0].GetHostPort())
			seen, ok := <-seenCh
			if !ok {
				t.Fatal("the link file did not change within 20s of the scale")
			}
			if b, _ := os.ReadFile(files[0]); !strings.Contains(string(b), addr) {
				t.Fatalf("the link file does not list the new instance %s: %s", addr, b)
			}
			lat = append(lat, seen.Sub(a.GetSince().AsTime()))
			c.scale(t, provider, 1)
			follows(t, 1)
		}
		slices.Sort(lat)
		t.Logf("provider instance RUNNING → consumer link file rewritten over %d changes: p50 %v, p99 %v (max %v)",
			len(lat), lat[len(lat)/2], lat[(len(lat)*99+99)/100-1], lat[len(lat)-1])
	})
	t.Run("bad input is refused with nothing stored", func(t *testing.T) {
		for _, d := range []*modelsv1.DesiredLRP{
			withLinks(helloLRP("e2e-twin-a", "preloaded:cflinuxfs4", c.hello, 0, nil), &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "a", Type: "twin"}}}),
			withLinks(helloLRP("e2e-twin-b", "preloaded:cflinuxfs4", c.hello, 0, nil), &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "b", Type: "twin"}}}),
			withDomain(withLinks(helloLRP("e2e-private", "preloaded:cflinuxfs4", c.hello, 0, nil), &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "secret", Type: "secret"}}}), "e2e-other"),
		} {
			c.desire(t, d)
		}
		for _, tc := range []struct {
			name  string
			links *modelsv1.Links
			want  string
		}{
			{"unresolvable", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "x", Type: "nope"}}}, `no provider of type "nope" in domain "e2e"`},
			{"ambiguous type", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "x", Type: "twin"}}}, `2 providers of type "twin" in domain "e2e": lrp "e2e-twin-a" link "a", lrp "e2e-twin-b" link "b"; set from to choose one`},
			{"cross-domain unshared", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "x", From: "e2e-other.secret"}}}, `provider "secret" in domain "e2e-other" is not shared`},
			{"duplicate link name", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "x", From: "a"}, {Name: "x", From: "b"}}}, `duplicates the name "x"`},
			{"custom without nodes", &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "x", Custom: &modelsv1.ResolvedLink{}}}}, `custom link has no nodes`},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := c.bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: withLinks(helloLRP("e2e-bad", "preloaded:cflinuxfs4", client, 1, nil), tc.links)})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Errorf("%s: %v, want InvalidArgument with %q", tc.name, err, tc.want)
			}
			_, err = c.bbs.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "e2e-bad"})
			if status.Code(err) != codes.NotFound {
				t.Errorf("%s: the refused LRP was stored: %v", tc.name, err)
			}
			cancel()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: provider})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), consumer) {
			t.Errorf("removing a consumed provider: %v, want FailedPrecondition naming %s", err, consumer)
		}
	})
}

func withLinks(d *modelsv1.DesiredLRP, l *modelsv1.Links) *modelsv1.DesiredLRP {
	d.Links = l
	return d
}

func withDomain(d *modelsv1.DesiredLRP, domain string) *modelsv1.DesiredLRP {
	d.Domain = domain
	return d
}
