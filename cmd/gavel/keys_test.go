package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gavel-sched/gavel/pkg/sealing"
)

// TestKeysNew: `gavel keys new FILE` writes a readable key with mode 0600, refuses to replace
// an existing file (leaving it as it was), and wants exactly one argument.
func TestKeysNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.key")
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := execute(context.Background(), args, strings.NewReader(""), &out, &errOut)
		return out.String(), err
	}
	if out, err := run("keys", "new", path); err != nil || !strings.Contains(out, path) {
		t.Fatalf("keys new = %q, %v", out, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v; want 0600", st.Mode(), err)
	}
	key, err := sealing.ReadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"existing file", []string{"keys", "new", path}, path},
		{"no file", []string{"keys", "new"}, "accepts 1 arg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("gavel %v = %v, want an error naming %q", tc.args, err, tc.want)
			}
		})
	}
	if again, _ := sealing.ReadKeyFile(path); again != key {
		t.Fatal("the existing key was replaced")
	}
}
