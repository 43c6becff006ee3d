package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesWholeFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "link.json")
	for _, content := range []string{`{"a":1}`, `{"a":2,"b":[1,2,3]}`, `{}`} {
		if err := Write(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != content {
			t.Fatalf("read %q, %v; want %q", b, err, content)
		}
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != 0o640 {
			t.Fatalf("mode %v, %v", st.Mode(), err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
	if err := Write(filepath.Join(dir, "missing", "x"), nil, 0o644); err == nil {
		t.Fatal("writing into a missing directory succeeded")
	}
}

// TestWriteInStaysInTheRoot: a link inside the root to a directory outside it does not lead a
// write there; a write inside replaces the file whole and leaves no temporary file.
func TestWriteInStaysInTheRoot(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "files"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := WriteIn(root, "escape/db.json", []byte("x"), 0o644); err == nil {
		t.Error("a write through a link out of the root succeeded")
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Errorf("written outside the root: %v", left)
	}
	for _, content := range []string{"one", "two"} {
		if err := WriteIn(root, "files/db.json", []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "files", "db.json")); err != nil || string(b) != content {
			t.Fatalf("db.json = %q, %v; want %q", b, err, content)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "files", "db.json")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v %v, want 0640", fi.Mode(), err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "files")); len(left) != 1 {
		t.Errorf("files left: %v, want db.json only", left)
	}
}
