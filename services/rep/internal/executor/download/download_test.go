package download

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// TestFetch: a file fetched and checked, told apart from a tar and a gzipped tar; refused
// URLs and checksums; the temporary file gone after Close.
func TestFetch(t *testing.T) {
	var tarball, tgz bytes.Buffer
	tw := tar.NewWriter(&tarball)
	_ = tw.WriteHeader(&tar.Header{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	zw := gzip.NewWriter(&tgz)
	_, _ = zw.Write(tarball.Bytes())
	_ = zw.Close()
	files := map[string][]byte{"/plain": []byte("just bytes"), "/a.tar": tarball.Bytes(), "/a.tgz": tgz.Bytes()}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	dir := t.TempDir()
	sum := sha256.Sum256(files["/plain"])

	for _, tc := range []struct {
		path, sum string
		archive   bool
		want      string // the file, or the tar stream's first entry's content
	}{
		{path: "/plain", sum: hex.EncodeToString(sum[:]), want: "just bytes"},
		{path: "/a.tar", archive: true, want: "x"},
		{path: "/a.tgz", archive: true, want: "x"},
	} {
		d := &modelsv1.DownloadAction{From: srv.URL + tc.path}
		if tc.sum != "" {
			d.ChecksumAlgorithm, d.ChecksumValue = "SHA256", tc.sum
		}
		f, err := Fetch(context.Background(), d, dir)
		if err != nil {
			t.Fatalf("Fetch %s: %v", tc.path, err)
		}
		r, archive, err := f.Archive()
		if err != nil || archive != tc.archive {
			t.Fatalf("Archive of %s: %v, %v; want %v", tc.path, archive, err, tc.archive)
		}
		if archive {
			tr := tar.NewReader(r)
			if _, err := tr.Next(); err != nil {
				t.Fatalf("%s: %v", tc.path, err)
			}
			r = tr
		}
		if got, _ := io.ReadAll(r); string(got) != tc.want {
			t.Errorf("%s read %q, want %q", tc.path, got, tc.want)
		}
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if _, err := os.Stat(f.Name()); !os.IsNotExist(err) {
			t.Errorf("the temporary file of %s is still there after Close: %v", tc.path, err)
		}
	}

	for _, tc := range []struct {
		d    *modelsv1.DownloadAction
		want string
	}{
		{&modelsv1.DownloadAction{From: "ftp://x/y"}, `download "ftp://x/y": not an http(s) URL`},
		{&modelsv1.DownloadAction{From: srv.URL + "/plain", ChecksumValue: "ab"}, "checksum algorithm and value go together"},
		{&modelsv1.DownloadAction{From: srv.URL + "/plain", ChecksumAlgorithm: "crc32", ChecksumValue: "ab"}, `unsupported checksum algorithm "crc32"`},
		{&modelsv1.DownloadAction{From: srv.URL + "/plain", ChecksumAlgorithm: "md5", ChecksumValue: "ab"}, "md5 checksum mismatch: got "},
		{&modelsv1.DownloadAction{From: srv.URL + "/missing"}, "get: status 404 Not Found"},
	} {
		if _, err := Fetch(context.Background(), tc.d, dir); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Fetch %s: %v, want %q", tc.d.GetFrom(), err, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("temporary files left: %v", entries)
	}
}

// TestIntoStaysInTheRoot: Into saves a file and extracts an archive inside the root, and
// refuses, saying why, a d.To through a symbolic link that leads outside it, writing nothing
// there.
func TestIntoStaysInTheRoot(t *testing.T) {
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	_ = tw.WriteHeader(&tar.Header{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/a.tar" {
			_, _ = w.Write(tarball.Bytes())
			return
		}
		_, _ = io.WriteString(w, "plain")
	}))
	defer srv.Close()
	base := t.TempDir()
	root, outside, tmp := filepath.Join(base, "root"), filepath.Join(base, "outside"), filepath.Join(base, "tmp")
	for _, d := range []string{root, outside, tmp} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "app")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := Into(ctx, &modelsv1.DownloadAction{From: srv.URL + "/a.tar", To: "/srv"}, root, tmp, -1, -1); err != nil {
		t.Fatalf("Into /srv: %v", err)
	}
	if err := Into(ctx, &modelsv1.DownloadAction{From: srv.URL + "/bin/tool", To: "bin/"}, root, tmp, -1, -1); err != nil {
		t.Fatalf("Into bin/: %v", err)
	}
	for name, want := range map[string]string{"srv/a": "x", "bin/tool": "plain"} {
		if got, err := os.ReadFile(filepath.Join(root, name)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, d := range []*modelsv1.DownloadAction{{From: srv.URL + "/a.tar", To: "/app"}, {From: srv.URL + "/f", To: "/app/f"}} {
		err := Into(ctx, d, root, tmp, -1, -1)
		if want := "download " + d.From + ": refused: /app leads outside the root filesystem"; err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Into %s: %v, want %q…", d.To, err, want)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) > 0 {
		t.Errorf("written outside the root: %v", entries)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) > 0 {
		t.Errorf("temporary files left: %v", entries)
	}
}
