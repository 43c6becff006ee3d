package build

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/models"
)

func TestRootfs(t *testing.T) {
	stacks := Stacks{"cflinuxfs4": "preloaded:cflinuxfs4", "lucid64": "preloaded:lucid64"}
	tests := []struct {
		name, stack, image, want, err string
	}{
		{"stack", "cflinuxfs4", "", "preloaded:cflinuxfs4", ""},
		{"stack in upper case", "LUCID64", "", "preloaded:lucid64", ""},
		{"unknown stack", "windows", "", "", `app.stack: unknown stack "windows" (known stacks: cflinuxfs4, lucid64)`},
		{"docker hub short name", "", "redis:7", "docker:///library/redis#7", ""},
		{"docker hub default tag", "", "library/nginx", "docker:///library/nginx#latest", ""},
		{"private registry", "", "registry.local:5000/team/app:v2", "docker://registry.local:5000/team/app#v2", ""},
		{"digest", "", "redis@sha256:" + strings.Repeat("a", 64), "docker:///library/redis#sha256:" + strings.Repeat("a", 64), ""},
		{"bad reference", "", "Bad/Name::x", "", "app.docker_image: is not a valid docker image reference"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := stacks.Rootfs("app", &nsyncv1.App{Stack: tt.stack, DockerImage: tt.image})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %q, %v; want error %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
			if err := models.ValidateRootfs("rootfs", got); err != nil {
				t.Errorf("%q is not a valid rootfs: %v", got, err)
			}
		})
	}
}

func validApp() *nsyncv1.App {
	routes, _ := structpb.NewValue([]any{map[string]any{"port": 8080, "routes": []any{"web.example.com"}}})
	return &nsyncv1.App{Guid: "web", Name: "web", SpaceGuid: "space", Stack: "cflinuxfs4", Command: "/bin/web -p 8080",
		Instances: 2, MemoryMb: 128, DiskMb: 256, Ports: []uint32{8080}, Routes: routes,
		Env:         map[string]string{"B": "2", "A": "1"},
		HealthCheck: &nsyncv1.HealthCheck{Type: nsyncv1.HealthCheck_TYPE_HTTP, HttpEndpoint: "/health"}}
}

func TestValidateApp(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(a *nsyncv1.App)
		field string
	}{
		{"valid", func(*nsyncv1.App) {}, ""},
		{"guid with a slash", func(a *nsyncv1.App) { a.Guid = "a/b" }, "app.guid"},
		{"guid too long for a label", func(a *nsyncv1.App) { a.Guid = strings.Repeat("g", 64) }, "app.guid"},
		{"no space", func(a *nsyncv1.App) { a.SpaceGuid = "" }, "app.space_guid"},
		{"neither stack nor image", func(a *nsyncv1.App) { a.Stack = "" }, "app.stack"},
		{"both stack and image", func(a *nsyncv1.App) { a.DockerImage = "redis" }, "app.docker_image"},
		{"no command", func(a *nsyncv1.App) { a.Command = "" }, "app.command"},
		{"negative instances", func(a *nsyncv1.App) { a.Instances = -1 }, "app.instances"},
		{"no memory", func(a *nsyncv1.App) { a.MemoryMb = 0 }, "app.memory_mb"},
		{"routes as a string", func(a *nsyncv1.App) { a.Routes = structpb.NewStringValue("x") }, "app.routes"},
		{"routes entry not an object", func(a *nsyncv1.App) {
			a.Routes, _ = structpb.NewValue([]any{"x"})
		}, "app.routes[0]"},
		{"http check without a path", func(a *nsyncv1.App) { a.HealthCheck.HttpEndpoint = "health" }, "app.health_check.http_endpoint"},
		{"port check without a port", func(a *nsyncv1.App) {
			a.Ports, a.HealthCheck = nil, &nsyncv1.HealthCheck{Type: nsyncv1.HealthCheck_TYPE_PORT}
		}, "app.health_check.type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := validApp()
			tt.edit(a)
			err := ValidateApp("app", a, models.DefaultLimits())
			if tt.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.field+":") {
				t.Fatalf("got %v, want a violation of %s", err, tt.field)
			}
		})
	}
}

func TestLRP(t *testing.T) {
	c := &modelsv1.PlacementConstraint{Require: []string{"production"}, Disallow: []string{"skynet"}}
	d, err := LRP(validApp(), 3, Work{Rootfs: "preloaded:cflinuxfs4", Constraint: c})
	if err != nil {
		t.Fatal(err)
	}
	if err := models.ValidateDesiredLRP("lrp", d, models.DefaultLimits()); err != nil {
		t.Fatalf("built LRP is invalid: %v", err)
	}
	run := d.GetAction().GetRun()
	switch {
	case d.GetProcessGuid() != "web-v3" || d.GetDomain() != AppsDomain:
		t.Errorf("guid/domain %s %s", d.GetProcessGuid(), d.GetDomain())
	case !models.SameConstraint(d.GetPlacementConstraint(), c):
		t.Errorf("constraint %v", d.GetPlacementConstraint())
	case run.GetPath() != "/bin/web" || strings.Join(run.GetArgs(), " ") != "-p 8080":
		t.Errorf("action %v", run)
	case d.GetEnv()[0].GetName() != "A" || d.GetEnv()[1].GetName() != "B":
		t.Errorf("env not sorted: %v", d.GetEnv())
	case string(d.GetRoutes()[CFRouter]) != `[{"port":8080,"routes":["web.example.com"]}]`:
		t.Errorf("routes %s", d.GetRoutes()[CFRouter])
	case d.GetLabels()[LabelApp] != "web" || d.GetLabels()[LabelSpace] != "space" || d.GetLabels()[LabelVersion] != "3":
		t.Errorf("labels %v", d.GetLabels())
	case d.GetProperties()[PropAppGuid] != "web" || d.GetProperties()[PropSpaceGuid] != "space" || d.GetProperties()[PropAppName] != "web":
		t.Errorf("properties %v", d.GetProperties())
	case d.GetCheckDefinition().GetChecks()[0].GetHttp().GetPath() != "/health":
		t.Errorf("checks %v", d.GetCheckDefinition())
	}
	// No constraint and no routes: none on the LRP.
	a := validApp()
	a.Routes = structpb.NewNullValue()
	d, err = LRP(a, 1, Work{Rootfs: "preloaded:cflinuxfs4", Constraint: &modelsv1.PlacementConstraint{}})
	if err != nil || d.GetPlacementConstraint() != nil || len(d.GetRoutes()) != 0 {
		t.Errorf("empty constraint and null routes: %v %v", d, err)
	}
}

func TestValidatePool(t *testing.T) {
	tests := []struct {
		name  string
		pool  *nsyncv1.PlacementPool
		field string
	}{
		{"valid", &nsyncv1.PlacementPool{Name: "prod", Require: []string{"Production"}, Disallow: []string{"skynet"}}, ""},
		{"no name", &nsyncv1.PlacementPool{Require: []string{"x"}}, "pool.name"},
		{"63-character tag", &nsyncv1.PlacementPool{Name: "p", Require: []string{strings.Repeat("t", 63)}}, ""},
		{"64-character tag", &nsyncv1.PlacementPool{Name: "p", Require: []string{strings.Repeat("t", 64)}}, "pool.require[0]"},
		{"tag with a comma", &nsyncv1.PlacementPool{Name: "p", Disallow: []string{"a,b"}}, "pool.disallow[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidatePool("pool", tt.pool)
			if tt.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.field+":") {
				t.Fatalf("got %v, want a violation of %s", err, tt.field)
			}
		})
	}
}

// TestSpreadWith: during an active deployment the new LRP (a revert's: the old version) spreads
// with the other version over the app's instances; no other version, and no LRP outside an
// active deployment, has a peer.
func TestSpreadWith(t *testing.T) {
	rec := &nsyncv1.AppRecord{
		State: nsyncv1.AppState_APP_STATE_STARTED,
		App:   &nsyncv1.App{Guid: "web", Version: 1, Instances: 6},
		Deployment: &nsyncv1.Deployment{FromVersion: 1, ToVersion: 2,
			State: nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING},
	}
	if sw := SpreadWith(rec, 2); sw.GetProcessGuid() != "web-v1" || sw.GetTotalInstances() != 6 {
		t.Errorf("new version's peer %v, want web-v1 over 6", sw)
	}
	if sw := SpreadWith(rec, 1); sw != nil {
		t.Errorf("old version's peer %v, want none", sw)
	}
	rec.Deployment.FromVersion, rec.Deployment.ToVersion, rec.Deployment.RevertOf = 2, 1, "web-d1"
	if sw := SpreadWith(rec, 1); sw.GetProcessGuid() != "web-v2" {
		t.Errorf("a revert's new LRP's peer %v, want web-v2", sw)
	}
	rec.Deployment.State = nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED
	if SpreadWith(rec, 1) == nil {
		t.Error("a paused deployment's new LRP has no peer")
	}
	rec.Deployment.State = nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED
	if sw := SpreadWith(rec, 1); sw != nil {
		t.Errorf("after the deployment: peer %v, want none", sw)
	}
}
