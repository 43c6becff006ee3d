package process

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
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
	fs, err := resolver.Resolve(t.Context(), uri, "image-app")
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
