// Package rootfstest helps tests use docker rootfses without leaving the machine: it runs
// go-containerregistry's in-process registry on 127.0.0.1, builds image layers from files and
// pushes images to it, and builds static Go binaries to put in them.
package rootfstest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// NewRegistry starts an in-process registry on 127.0.0.1 and returns its host:port. It is
// shut down when the test ends.
func NewRegistry(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// NewAuthRegistry is NewRegistry requiring HTTP basic authentication as user with password on
// every request (401 with a Basic challenge otherwise). Push to it with PushAuth.
func NewAuthRegistry(t testing.TB, user, password string) string {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="rootfstest"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// NewTokenRegistry is NewRegistry requiring a bearer token on every request, as Docker Hub
// does: a request without one gets 401 with a Bearer challenge naming the registry's /token
// realm, which hands out the token for HTTP basic authentication as user with password. Push
// to it with PushAuth.
func NewTokenRegistry(t testing.TB, user, password string) string {
	t.Helper()
	const token = "rootfstest-token"
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"token":"`+token+`","access_token":"`+token+`"}`)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+srv.URL+`/token",service="rootfstest"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// File is one entry of a test layer.
type File struct {
	// Name is the path in the image, without a leading slash ("bin/app", "etc/").
	Name string
	// Mode is the permission bits (0o755 for executables and directories).
	Mode int64
	// Body is the content of a regular file.
	Body []byte
	// Typeflag is the tar type (tar.TypeReg when zero, or tar.TypeDir, tar.TypeSymlink, ...).
	Typeflag byte
	// Linkname is the target of a symbolic or hard link.
	Linkname string
}

// Layer builds an uncompressed image layer holding files, in order.
func Layer(t testing.TB, files ...File) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		typ := f.Typeflag
		if typ == 0 {
			typ = tar.TypeReg
		}
		hdr := &tar.Header{Name: f.Name, Mode: f.Mode, Typeflag: typ, Linkname: f.Linkname}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(f.Body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("layer: header %s: %v", f.Name, err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write(f.Body); err != nil {
				t.Fatalf("layer: write %s: %v", f.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("layer: close: %v", err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	return layer
}

// Push builds an image from layers (the first is the bottom one), pushes it to
// host/repo:tag and returns its rootfs URI "docker://host/repo#tag" and its digest.
func Push(t testing.TB, host, repo, tag string, layers ...v1.Layer) (string, v1.Hash) {
	t.Helper()
	return push(t, host, repo, tag, nil, layers)
}

// PushAuth is Push to a registry of NewAuthRegistry or NewTokenRegistry, as user with
// password.
func PushAuth(t testing.TB, host, repo, tag, user, password string, layers ...v1.Layer) (string, v1.Hash) {
	t.Helper()
	return push(t, host, repo, tag, []remote.Option{remote.WithAuth(&authn.Basic{Username: user, Password: password})}, layers)
}

func push(t testing.TB, host, repo, tag string, opts []remote.Option, layers []v1.Layer) (string, v1.Hash) {
	t.Helper()
	base, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{Architecture: runtime.GOARCH, OS: "linux"})
	if err != nil {
		t.Fatalf("push: config: %v", err)
	}
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		t.Fatalf("push: build image: %v", err)
	}
	ref, err := name.NewTag(host+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		t.Fatalf("push: reference: %v", err)
	}
	if err := remote.Write(ref, img, opts...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("push: digest: %v", err)
	}
	return "docker://" + host + "/" + repo + "#" + tag, d
}

// BuildStatic builds the Go packages pkgs (e.g. "./testdata/app") from dir into the
// directory out as static binaries (CGO_ENABLED=0), one per package, named after it.
func BuildStatic(dir, out string, pkgs ...string) error {
	args := append([]string{"build", "-trimpath", "-o", out + string(os.PathSeparator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", pkgs, err, b)
	}
	return nil
}
