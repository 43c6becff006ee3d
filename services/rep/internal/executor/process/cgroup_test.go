package process

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCgroupRoot writes the files newCgroupManager reads at the root of a cgroup v2 tree.
func fakeCgroupRoot(t *testing.T, controllers string) string {
	t.Helper()
	root := t.TempDir()
	for name, body := range map[string]string{"cgroup.controllers": controllers, "cgroup.subtree_control": ""} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCgroupManagerWhyNot(t *testing.T) {
	tests := []struct {
		name, controllers, want string
	}{
		{"no cgroup v2", "", "cgroup v2 not mounted at"},
		{"no pids controller", "cpu memory", "controller pids not available"},
		// A plain directory tree: the gavel/ child gets no control files.
		{"not a cgroup fs", "memory pids", "read controllers of"},
	}
	for _, tc := range tests {
		root := t.TempDir()
		if tc.controllers != "" {
			root = fakeCgroupRoot(t, tc.controllers)
		}
		_, err := newCgroupManager(root)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
}

func TestCgroupCreateWritesLimits(t *testing.T) {
	m := &cgroupManager{parent: t.TempDir()}
	cg, err := m.create("c1", 128, 42)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer cg.fd.Close()
	for file, want := range map[string]string{"memory.max": "134217728", "pids.max": "42"} {
		b, err := os.ReadFile(filepath.Join(m.parent, "c1", file))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", file, b, err, want)
		}
	}
	cg2, err := m.create("c2", 0, 0)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer cg2.fd.Close()
	for _, file := range []string{"memory.max", "pids.max"} {
		if b, _ := os.ReadFile(filepath.Join(m.parent, "c2", file)); string(b) != "max" {
			t.Errorf("unlimited %s = %q, want max", file, b)
		}
	}
}
