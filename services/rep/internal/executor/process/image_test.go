package process

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// TestDockerImageEndToEnd pushes an image holding the static test server to an in-process
// registry, resolves it with the rootfs resolver and runs it chrooted, as nobody when root,
// through the process backend.
func TestDockerImageEndToEnd(t *testing.T) {
	t.Parallel()
	server, err := os.ReadFile(bin("httpserver"))
	if err != nil {
		t.Fatal(err)
	}
	host := rootfstest.NewRegistry(t)
	uri, _ := rootfstest.Push(t, host, "gavel/app", "v1", rootfstest.Layer(t,
		rootfstest.File{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		rootfstest.File{Name: "bin/httpserver", Mode: 0o755, Body: server},
		rootfstest.File{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	))

	resolver, err := rootfs.NewResolver(rootfs.Config{Providers: []string{"docker"}, CacheDir: t.TempDir(), InsecureRegistries: true})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := resolver.Resolve(t.Context(), uri, "image-app", rootfs.Auth{})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	defer fs.Release()

	b := newTestBackend(t, func(o *executor.Options) {
		if os.Getuid() == 0 {
			o.User = "nobody"
		}
	})
	spec := lrp("image-app", &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{httpCheck(8080, "/health")}})
	spec.Rootfs = uri
	spec.RootfsPath = fs.Path
	spec.Chroot = fs.Chroot
	spec.Action = run("/bin/httpserver")
	c := start(t, b, spec)
	waitHealthy(t, c, 10*time.Second)
	got := getJSON(t, hostPort(t, c, 8080))
	if got["cwd"] != "/" {
		t.Errorf("cwd = %q, want / in the image", got["cwd"])
	}
	if os.Getuid() == 0 && got["uid"] != "65534" {
		t.Errorf("uid = %s, want nobody's", got["uid"])
	}
	c.Stop(5 * time.Second)
}

// tgz builds a gzipped tar of files (name → content).
func tgz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// newLoopbackServer serves h on 127.0.0.1 until the test ends and returns its base URL.
func newLoopbackServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestDownloadStaysInTheRootfs: a download into a chrooted container's root filesystem goes
// through none of its symbolic links that lead outside it (as /app -> /etc would, to the
// host's /etc as root), nor through one its own archive makes: each is refused, the reason
// saying so, and nothing is written outside; nor does its files directory. A download to a
// plain directory of the same rootfs lands there.
func TestDownloadStaysInTheRootfs(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("SKIP: chroot needs root; run the process backend's tests as root to check downloads into a rootfs")
	}
	b := newTestBackend(t, nil)
	base := openDir(t)
	rootDir, outside := filepath.Join(base, "rootfs"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(rootDir, "srv"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"app": outside, "up": "../outside", "srv/deep": "../../outside"} {
		if err := os.Symlink(target, filepath.Join(rootDir, link)); err != nil {
			t.Fatal(err)
		}
	}
	archive := tgz(t, map[string]string{"passwd": "written by a download\n"})
	var slip bytes.Buffer // a symbolic link to outside, then a file through it
	zw := gzip.NewWriter(&slip)
	tw := tar.NewWriter(zw)
	_ = tw.WriteHeader(&tar.Header{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: outside})
	_ = tw.WriteHeader(&tar.Header{Name: "evil/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	_, _ = tw.Write([]byte("x\n"))
	_ = tw.Close()
	_ = zw.Close()
	srv := newLoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/app.tgz":
			_, _ = w.Write(archive)
		case "/slip.tgz":
			_, _ = w.Write(slip.Bytes())
		case "/passwd":
			_, _ = io.WriteString(w, "plain\n")
		default:
			http.NotFound(w, r)
		}
	}))
	for i, tc := range []struct {
		name, from, to string
	}{
		{"archive through /app -> outside", "/app.tgz", "/app"},
		{"file into /app/", "/passwd", "/app/"},
		{"file through a relative link", "/passwd", "up/passwd"},
		{"archive through a nested relative link", "/app.tgz", "/srv/deep"},
		{"archive making its own link", "/slip.tgz", "/srv/slip"},
	} {
		spec := task(fmt.Sprintf("escape-%d", i), download(srv+tc.from, tc.to, "", ""))
		spec.RootfsPath, spec.Chroot = rootDir, true
		res := waitDone(t, start(t, b, spec), 10*time.Second)
		want := "download " + srv + tc.from + ": "
		if !res.Failed || !strings.HasPrefix(res.Reason, want) || !strings.Contains(res.Reason, "refused: ") ||
			!strings.Contains(res.Reason, "leads outside the root filesystem") {
			t.Errorf("%s: Result = %+v, want failed %q…refused: … leads outside the root filesystem", tc.name, res, want)
		}
		if entries, _ := os.ReadDir(outside); len(entries) > 0 {
			t.Fatalf("%s: written outside the rootfs: %v", tc.name, entries)
		}
	}

	files := task("files-escape", download(srv+"/passwd", "/srv/", "", ""))
	files.RootfsPath, files.Chroot = rootDir, true
	files.FilesDir, files.Files = "/app/files", map[string][]byte{"f": []byte("x")}
	if c, err := b.Start(t.Context(), files); err == nil || !strings.Contains(err.Error(), "create files directory: ") {
		if err == nil {
			c.Stop(0)
		}
		t.Errorf("Start with a files directory through /app -> %s: %v, want refused", outside, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) > 0 {
		t.Fatalf("files directory written outside the rootfs: %v", entries)
	}

	spec := task("inside", download(srv+"/app.tgz", "/srv/app", "", ""))
	spec.RootfsPath, spec.Chroot = rootDir, true
	if res := waitDone(t, start(t, b, spec), 10*time.Second); res.Failed {
		t.Fatalf("download inside the rootfs: %+v", res)
	}
	if got, err := os.ReadFile(filepath.Join(rootDir, "srv", "app", "passwd")); err != nil || string(got) != "written by a download\n" {
		t.Errorf("rootfs/srv/app/passwd = %q, %v", got, err)
	}
}

// TestResultFileLinkedOutside: a task that makes its result file a symbolic link to a host
// file fails with the reason, and the host file is not its result (the rep may read result
// files as root, on behalf of a container running as another user).
func TestResultFileLinkedOutside(t *testing.T) {
	t.Parallel()
	b := newTestBackend(t, nil)
	secret := filepath.Join(openDir(t), "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, link := range []string{secret, "../../../../../../../.." + secret} {
		spec := task(fmt.Sprintf("result-link-%d", i), sh("ln -s "+link+" result"))
		spec.ResultFile = "result"
		res := waitDone(t, start(t, b, spec), 10*time.Second)
		if !res.Failed || strings.Contains(res.Output+res.Reason, "host secret") || !strings.HasPrefix(res.Reason, "read result file: ") {
			t.Errorf("result file linked to %s: Result = %+v, want failed reading it, without the host file", link, res)
		}
	}
}
