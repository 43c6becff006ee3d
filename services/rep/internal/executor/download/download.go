// Package download fetches what a download action names: the part of the action the process
// and oci backends share. Each backend places the result in its own container.
package download

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
	"strings"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// File is a fetched download: a temporary file, read from its start. Close removes it.
type File struct {
	f *os.File
	// URL is the download's source.
	URL *url.URL
}

// Fetch GETs d.From (http or https) into a temporary file in dir and verifies the checksum,
// when d gives one, before anything is returned. Its errors start with "download" and the
// URL without credentials.
func Fetch(ctx context.Context, d *modelsv1.DownloadAction, dir string) (*File, error) {
	u, err := url.Parse(d.GetFrom())
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("download %q: not an http(s) URL", d.GetFrom())
	}
	var sum hash.Hash
	switch alg := strings.ToLower(d.GetChecksumAlgorithm()); {
	case alg == "" && d.GetChecksumValue() == "":
	case alg == "" || d.GetChecksumValue() == "":
		return nil, fmt.Errorf("download %s: checksum algorithm and value go together", u.Redacted())
	case alg == "sha256":
		sum = sha256.New()
	case alg == "sha1":
		sum = sha1.New()
	case alg == "md5":
		sum = md5.New()
	default:
		return nil, fmt.Errorf("download %s: unsupported checksum algorithm %q", u.Redacted(), alg)
	}
	f, err := get(ctx, u, sum, dir)
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", u.Redacted(), err)
	}
	file := &File{f: f, URL: u}
	if sum != nil {
		if got := hex.EncodeToString(sum.Sum(nil)); !strings.EqualFold(got, d.GetChecksumValue()) {
			_ = file.Close()
			return nil, fmt.Errorf("download %s: %s checksum mismatch: got %s, want %s", u.Redacted(),
				d.GetChecksumAlgorithm(), got, d.GetChecksumValue())
		}
	}
	return file, nil
}

// get GETs u into a temporary file in dir, hashing it into sum, and rewinds it.
func get(ctx context.Context, u *url.URL, sum hash.Hash, dir string) (*os.File, error) {
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
	tmp, err := os.CreateTemp(dir, ".download-")
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

// Name is the temporary file's path.
func (f *File) Name() string { return f.f.Name() }

// Read reads the file as fetched.
func (f *File) Read(p []byte) (int, error) { return f.f.Read(p) }

// Close closes and removes the temporary file (unless it was moved away).
func (f *File) Close() error {
	err := f.f.Close()
	if rerr := os.Remove(f.f.Name()); err == nil && !errors.Is(rerr, os.ErrNotExist) {
		err = rerr
	}
	return err
}

// Archive tells a tar or gzipped tar from any other file, by its first bytes: for an archive
// it returns the tar stream (gunzipped) and true; for anything else a reader of the file as
// fetched and false. Read only from the returned reader afterwards.
func (f *File) Archive() (io.Reader, bool, error) {
	br := bufio.NewReaderSize(f.f, 4096)
	head, _ := br.Peek(512)
	gzipped := len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b
	isTar := len(head) >= 262 && bytes.Equal(head[257:262], []byte("ustar"))
	switch {
	case gzipped:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, false, fmt.Errorf("download %s: gunzip: %w", f.URL.Redacted(), err)
		}
		return zr, true, nil
	case isTar:
		return br, true, nil
	default:
		return br, false, nil
	}
}
