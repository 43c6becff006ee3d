package process

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/rootfs"
)

// download fetches d.From (http or https) and extracts it into d.To when it is a tar or a
// gzipped tar; anything else is saved as a file at d.To (or in it, when d.To is a directory).
// The checksum, when given, is verified before anything is written.
func (c *container) download(ctx context.Context, d *modelsv1.DownloadAction) error {
	u, err := url.Parse(d.GetFrom())
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("download %q: not an http(s) URL", d.GetFrom())
	}
	var sum hash.Hash
	switch alg := strings.ToLower(d.GetChecksumAlgorithm()); {
	case alg == "" && d.GetChecksumValue() == "":
	case alg == "" || d.GetChecksumValue() == "":
		return fmt.Errorf("download %s: checksum algorithm and value go together", u.Redacted())
	case alg == "sha256":
		sum = sha256.New()
	case alg == "sha1":
		sum = sha1.New()
	case alg == "md5":
		sum = md5.New()
	default:
		return fmt.Errorf("download %s: unsupported checksum algorithm %q", u.Redacted(), alg)
	}

	tmp, err := c.fetch(ctx, u, sum)
	if err != nil {
		return fmt.Errorf("download %s: %w", u.Redacted(), err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if sum != nil {
		if got := hex.EncodeToString(sum.Sum(nil)); !strings.EqualFold(got, d.GetChecksumValue()) {
			return fmt.Errorf("download %s: %s checksum mismatch: got %s, want %s", u.Redacted(),
				d.GetChecksumAlgorithm(), got, d.GetChecksumValue())
		}
	}

	dest := c.hostPath(d.GetTo())
	opts := rootfs.UntarOptions{}
	if c.cred != nil {
		opts = rootfs.UntarOptions{ChownTo: true, UID: int(c.cred.Uid), GID: int(c.cred.Gid)}
	}
	br := bufio.NewReaderSize(tmp, 4096)
	head, _ := br.Peek(512)
	gzipped := len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b
	isTar := len(head) >= 262 && bytes.Equal(head[257:262], []byte("ustar"))
	if !gzipped && !isTar {
		if err := c.saveFile(tmp, u, dest, d.GetTo()); err != nil {
			return fmt.Errorf("download %s: %w", u.Redacted(), err)
		}
		return nil
	}
	if _, err := os.Lstat(dest); errors.Is(err, os.ErrNotExist) && c.cred != nil {
		// Created here for the container's user, not the rep's.
		if err := os.MkdirAll(dest, 0o755); err != nil {
			return fmt.Errorf("download %s: create %s: %w", u.Redacted(), d.GetTo(), err)
		}
		if err := os.Chown(dest, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("download %s: chown %s: %w", u.Redacted(), d.GetTo(), err)
		}
	}
	r := io.Reader(br)
	if gzipped {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("download %s: gunzip: %w", u.Redacted(), err)
		}
		r = zr
	}
	if err := rootfs.Untar(r, dest, opts); err != nil {
		return fmt.Errorf("download %s: %w", u.Redacted(), err)
	}
	return nil
}

// fetch GETs u into a temporary file in the container directory, hashing it into sum.
func (c *container) fetch(ctx context.Context, u *url.URL, sum hash.Hash) (*os.File, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get: status %s", resp.Status)
	}
	tmp, err := os.CreateTemp(c.dir, ".download-")
	if err != nil {
		return nil, fmt.Errorf("temporary file: %w", err)
	}
	w := io.Writer(tmp)
	if sum != nil {
		w = io.MultiWriter(tmp, sum)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return nil, fmt.Errorf("read body: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return nil, fmt.Errorf("rewind: %w", err)
	}
	return tmp, nil
}

// saveFile moves the downloaded file to dest, or into dest when it is a directory (or to
// ends with a slash), named after the URL's last path element. It is made executable.
func (c *container) saveFile(tmp *os.File, u *url.URL, dest, to string) error {
	if fi, err := os.Stat(dest); (err == nil && fi.IsDir()) || strings.HasSuffix(to, "/") || to == "" {
		base := path.Base(u.Path)
		if base == "/" || base == "." || base == "" {
			base = "download"
		}
		dest = filepath.Join(dest, base)
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(dest), err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		if !errors.Is(err, syscall.EXDEV) {
			return fmt.Errorf("save %s: %w", dest, err)
		}
		// Another filesystem (e.g. the rootfs): copy.
		out, err := os.OpenFile(dest, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
		if err != nil {
			return fmt.Errorf("save %s: %w", dest, err)
		}
		_, err = io.Copy(out, tmp)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("save %s: %w", dest, err)
		}
	}
	if err := os.Chmod(dest, 0o755); err != nil {
		return fmt.Errorf("chmod %s: %w", dest, err)
	}
	if c.cred != nil {
		if err := os.Chown(dest, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", dest, err)
		}
	}
	return nil
}
