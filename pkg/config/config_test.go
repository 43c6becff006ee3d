package config

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

type cfg struct {
	Listen    string   `json:"listen"`
	Endpoints []string `json:"endpoints"`
	Level     string   `json:"level"`
}

func TestFlagsOverrideFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(`{"listen":"file:1","endpoints":["a","b"],"level":"debug"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want cfg
	}{
		{"defaults", nil, cfg{Listen: "def", Level: "info"}},
		{"flags only", []string{"-listen", "x:1", "-endpoints", "p, q"}, cfg{Listen: "x:1", Endpoints: []string{"p", "q"}, Level: "info"}},
		{"file only", []string{"-config", path}, cfg{Listen: "file:1", Endpoints: []string{"a", "b"}, Level: "debug"}},
		{"flag beats file", []string{"-listen", "x:2", "-config", path}, cfg{Listen: "x:2", Endpoints: []string{"a", "b"}, Level: "debug"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg{Listen: "def", Level: "info"}
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.String("config", "", "")
			fs.StringVar(&c.Listen, "listen", c.Listen, "")
			fs.Var(List{&c.Endpoints}, "endpoints", "")
			err := Parse(fs, tt.args, "config", func(p string) error {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				return json.Unmarshal(b, &c)
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c, tt.want) {
				t.Fatalf("got %+v, want %+v", c, tt.want)
			}
		})
	}
}
