package main

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
)

func TestReadApp(t *testing.T) {
	dir := t.TempDir()
	json := filepath.Join(dir, "app.json")
	if err := os.WriteFile(json, []byte(`{"guid":"web","spaceGuid":"s","stack":"cflinuxfs4","command":"/bin/web","instances":2,
		"routes":[{"port":8080,"routes":["web.example.com"]}],"healthCheck":{"type":"TYPE_HTTP","httpEndpoint":"/health"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("guid: web\ninstances: many\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path string
		check      func(a *nsyncv1.App) bool
		wantErr    bool
	}{
		{"the YAML example", "../../examples/app.yaml", func(a *nsyncv1.App) bool {
			r := a.GetRoutes().GetListValue().GetValues()
			return a.GetGuid() == "hello-app" && a.GetSpaceGuid() == "dev-space" && a.GetInstances() == 2 &&
				len(r) == 1 && r[0].GetStructValue().GetFields()["port"].GetNumberValue() == 8080 &&
				a.GetHealthCheck().GetType() == nsyncv1.HealthCheck_TYPE_HTTP && a.GetEnv()["GREETING"] != ""
		}, false},
		{"JSON with lowerCamel names", json, func(a *nsyncv1.App) bool {
			return a.GetSpaceGuid() == "s" && a.GetHealthCheck().GetHttpEndpoint() == "/health" && len(a.GetRoutes().GetListValue().GetValues()) == 1
		}, false},
		{"a wrong type", bad, nil, true},
		{"a missing file", filepath.Join(dir, "none.yaml"), nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := readApp(tt.path)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("read %v, want an error", a)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(a) {
				t.Errorf("read %s", protojson.Format(a))
			}
		})
	}
}
