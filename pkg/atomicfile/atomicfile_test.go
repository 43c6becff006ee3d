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
