package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/services/rep/internal/rootfs/rootfstest"
)

// helloBin is the static test binary built once by TestMain.
var helloBin []byte

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "rootfs-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := rootfstest.BuildStatic(".", dir, "./testdata/hello"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	helloBin, err = os.ReadFile(filepath.Join(dir, "hello"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// pushHello pushes a two-layer image: the second layer deletes /etc/old and adds /etc/new.
func pushHello(t *testing.T, host, repo string) string {
	t.Helper()
	base := rootfstest.Layer(t,
		rootfstest.File{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		rootfstest.File{Name: "bin/hello", Mode: 0o755, Body: helloBin},
		rootfstest.File{Name: "bin/hi", Typeflag: tar.TypeSymlink, Linkname: "hello"},
		rootfstest.File{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		rootfstest.File{Name: "etc/old", Mode: 0o644, Body: []byte("old\n")},
		rootfstest.File{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	)
	top := rootfstest.Layer(t,
		rootfstest.File{Name: "etc/.wh.old", Mode: 0o644},
		rootfstest.File{Name: "etc/new", Mode: 0o644, Body: []byte("new\n")},
	)
	uri, _ := rootfstest.Push(t, host, repo, "v1", base, top)
	return uri
}

func newDockerResolver(t *testing.T) *Resolver {
	t.Helper()
	r, err := NewResolver(Config{Providers: []string{"docker"}, CacheDir: t.TempDir(), InsecureRegistries: true})
	if err != nil {
		t.Fatalf("NewResolver: %v", err)
	}
	return r
}

func TestResolveDockerImage(t *testing.T) {
	host := rootfstest.NewRegistry(t)
	uri := pushHello(t, host, "gavel/hello")
	r := newDockerResolver(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs, err := r.Resolve(ctx, uri, "guid-1", Auth{})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if !fs.Chroot {
		t.Errorf("Chroot = false, want true for a docker image")
	}
	if want := filepath.Join(r.cfg.CacheDir, "containers", "guid-1"); fs.Path != want {
		t.Errorf("Path = %s, want %s", fs.Path, want)
	}
	out, err := exec.Command(filepath.Join(fs.Path, "bin", "hi"), "there").CombinedOutput()
	if err != nil {
		t.Fatalf("run the image's binary: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "hello from the image there" {
		t.Errorf("binary printed %q", got)
	}
	if _, err := os.Stat(filepath.Join(fs.Path, "etc", "old")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/etc/old deleted by the upper layer: stat err = %v, want not exist", err)
	}
	if b, err := os.ReadFile(filepath.Join(fs.Path, "etc", "new")); err != nil || string(b) != "new\n" {
		t.Errorf("/etc/new = %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(fs.Path, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode = %v, %v; want sticky 0777", fi.Mode(), err)
	}

	fs.Release()
	fs.Release() // idempotent
	if _, err := os.Stat(fs.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Release the container copy is still there: %v", err)
	}
	images, _ := os.ReadDir(filepath.Join(r.cfg.CacheDir, "images"))
	if len(images) != 1 || !strings.HasPrefix(images[0].Name(), "sha256-") {
		t.Errorf("image cache holds %v, want one sha256-<hex> directory", images)
	}
}

func TestResolveUnpacksOnce(t *testing.T) {
	host := rootfstest.NewRegistry(t)
	uri := pushHello(t, host, "gavel/once")
	r := newDockerResolver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const n = 4
	var wg sync.WaitGroup
	results := make([]Rootfs, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = r.Resolve(ctx, uri, fmt.Sprintf("c-%d", i), Auth{})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Resolve %d: %v", i, err)
		}
	}
	if got := r.unpacks.Load(); got != 1 {
		t.Errorf("concurrent resolves unpacked %d times, want 1", got)
	}
	again, err := r.Resolve(ctx, uri, "c-later", Auth{})
	if err != nil {
		t.Fatalf("Resolve again: %v", err)
	}
	if got := r.unpacks.Load(); got != 1 {
		t.Errorf("a cached image was unpacked again: %d unpacks", got)
	}

	// Every container has its own tree, hard-linked to the cached image.
	seen := map[string]bool{}
	var first os.FileInfo
	for _, fs := range append(results, again) {
		if seen[fs.Path] {
			t.Errorf("two containers share %s", fs.Path)
		}
		seen[fs.Path] = true
		fi, err := os.Stat(filepath.Join(fs.Path, "bin", "hello"))
		if err != nil {
			t.Fatalf("stat: %v", err)
		}
		if first == nil {
			first = fi
		} else if !os.SameFile(first, fi) {
			t.Errorf("%s is not hard-linked to the cached image", fs.Path)
		}
		fs.Release()
	}
}

func TestPreloaded(t *testing.T) {
	dir := t.TempDir()
	for _, chroot := range []bool{false, true} {
		r, err := NewResolver(Config{Preloaded: map[string]string{"cflinuxfs4": dir}, ChrootPreloaded: chroot})
		if err != nil {
			t.Fatalf("NewResolver: %v", err)
		}
		for _, uri := range []string{"preloaded:cflinuxfs4", "preloaded://cflinuxfs4", "PRELOADED:cflinuxfs4", "preloaded:///cflinuxfs4/"} {
			if !r.Supports(uri) {
				t.Errorf("Supports(%q) = false", uri)
			}
			fs, err := r.Resolve(context.Background(), uri, "g", Auth{})
			if err != nil {
				t.Fatalf("Resolve(%q): %v", uri, err)
			}
			if fs.Path != dir || fs.Chroot != chroot {
				t.Errorf("Resolve(%q) = %s chroot=%v, want %s chroot=%v", uri, fs.Path, fs.Chroot, dir, chroot)
			}
			fs.Release()
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("Release removed the preloaded directory: %v", err)
			}
		}
		for _, uri := range []string{"preloaded:other", "preloaded://", "preloaded:"} {
			if r.Supports(uri) {
				t.Errorf("Supports(%q) = true", uri)
			}
		}
	}
}

func TestSupports(t *testing.T) {
	with, err := NewResolver(Config{Providers: []string{"docker"}, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	without, err := NewResolver(Config{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		uri          string
		with, withou bool
	}{
		{"docker:///library/redis#7", true, false},
		{"docker://127.0.0.1:5000/a/b", true, false},
		{"oci://example.com/a", false, false},
		{"", false, false},
		{"/just/a/path", false, false},
	}
	for _, tc := range tests {
		if got := with.Supports(tc.uri); got != tc.with {
			t.Errorf("with docker: Supports(%q) = %v, want %v", tc.uri, got, tc.with)
		}
		if got := without.Supports(tc.uri); got != tc.withou {
			t.Errorf("without providers: Supports(%q) = %v, want %v", tc.uri, got, tc.withou)
		}
	}
	for _, uri := range []string{"oci://example.com/a", "docker:///a/b"} {
		if _, err := without.Resolve(context.Background(), uri, "g", Auth{}); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Resolve(%q) without providers: err = %v, want ErrUnsupported", uri, err)
		}
	}
}

func TestNewResolverErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Providers: []string{"docker"}},
		{Providers: []string{"oci"}, CacheDir: t.TempDir()},
		{Preloaded: map[string]string{"x": ""}},
	} {
		if _, err := NewResolver(cfg); err == nil {
			t.Errorf("NewResolver(%+v) succeeded", cfg)
		}
	}
}

func TestDockerReference(t *testing.T) {
	r, err := NewResolver(Config{Providers: []string{"docker"}, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		uri, want string
	}{
		{"docker:///library/redis#7", "index.docker.io/library/redis:7"},
		{"docker:///redis", "index.docker.io/library/redis:latest"},
		{"docker:///foo/bar#baz", "index.docker.io/foo/bar:baz"},
		{"docker://127.0.0.1:5000/foo/bar#baz", "127.0.0.1:5000/foo/bar:baz"},
		{"docker://myregistry/team/app", "myregistry/team/app:latest"},
		{"docker://registry.example.com/app#" + digest, "registry.example.com/app@" + digest},
		{"docker://registry.example.com/", ""},
		{"docker://registry.example.com/UPPER", ""},
		{"docker://registry.example.com/app#bad tag", ""},
		{"preloaded:x", ""},
	}
	for _, tc := range tests {
		ref, err := r.DockerReference(tc.uri)
		if tc.want == "" {
			if err == nil {
				t.Errorf("DockerReference(%q) = %v, want an error", tc.uri, ref)
			}
			continue
		}
		if err != nil {
			t.Errorf("DockerReference(%q): %v", tc.uri, err)
			continue
		}
		if got := ref.Name(); got != tc.want {
			t.Errorf("DockerReference(%q) = %s, want %s", tc.uri, got, tc.want)
		}
	}
}

func TestUntarStaysInside(t *testing.T) {
	outside := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(&tar.Header{Name: "../../escape", Typeflag: tar.TypeReg, Mode: 0o644}, "x")
	write(&tar.Header{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: outside}, "")
	write(&tar.Header{Name: "evil/owned", Typeflag: tar.TypeReg, Mode: 0o644}, "x")
	write(&tar.Header{Name: "early-link", Typeflag: tar.TypeLink, Linkname: "late/file"}, "")
	write(&tar.Header{Name: "late/file", Typeflag: tar.TypeReg, Mode: 0o640}, "late")
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(t.TempDir(), "x")
	if err := Untar(&buf, dir, UntarOptions{}); err != nil {
		t.Fatalf("Untar: %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("Untar wrote through a symbolic link: %v", entries)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "escape")); err != nil || string(b) != "x" {
		t.Errorf("../../escape should land at the root: %q, %v", b, err)
	}
	a, errA := os.Stat(filepath.Join(dir, "early-link"))
	b, errB := os.Stat(filepath.Join(dir, "late", "file"))
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		t.Errorf("hard link listed before its target: %v %v", errA, errB)
	}
	if b != nil && b.Mode().Perm() != 0o640 {
		t.Errorf("mode = %v, want 0640", b.Mode())
	}
}

// TestResolveDockerImageCredentials: an image of a registry that requires basic authentication
// is fetched with the work's credentials; without them, or with wrong ones, Resolve fails
// naming the image, even once the image is in the cache (its manifest is fetched each time),
// and the password is not in the error.
func TestResolveDockerImageCredentials(t *testing.T) {
	host := rootfstest.NewAuthRegistry(t, "alice", "s3cret")
	layer := rootfstest.Layer(t, rootfstest.File{Name: "hello", Mode: 0o644, Body: []byte("hello\n")})
	uri, _ := rootfstest.PushAuth(t, host, "gavel/private", "v1", "alice", "s3cret", layer)
	r := newDockerResolver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs, err := r.Resolve(ctx, uri, "ok", Auth{Username: "alice", Password: "s3cret"})
	if err != nil {
		t.Fatalf("Resolve with the right credentials: %v", err)
	}
	if _, err := os.Stat(filepath.Join(fs.Path, "hello")); err != nil {
		t.Errorf("the image's file: %v", err)
	}
	for _, a := range []Auth{{}, {Username: "alice", Password: "wrong-secret"}} {
		_, err := r.Resolve(ctx, uri, "refused", a)
		if err == nil || !strings.Contains(err.Error(), host+"/gavel/private") || !strings.Contains(strings.ToUpper(err.Error()), "UNAUTHORIZED") {
			t.Errorf("Resolve with %q: %v, want the image refused as unauthorized", a.Username, err)
		}
		if err != nil && strings.Contains(err.Error(), "wrong-secret") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}
