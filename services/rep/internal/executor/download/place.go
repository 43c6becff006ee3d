package download

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Into runs download action d into the root filesystem rootDir: it fetches d.From into
// tmpDir (Fetch), then extracts a tar or gzipped tar into d.To, or saves anything else as an
// executable file at d.To (in it when d.To is a directory, ends with a slash or is the root),
// named after the URL's last path element. d.To is taken inside rootDir, absolute or not.
// What it writes is owned by uid and gid; -1 keeps the rep's.
//
// Every write goes through an os.Root of rootDir, so neither the root filesystem's nor the
// archive's symbolic links and ".." can lead it outside rootDir: a path that would is refused
// with an error saying so, and nothing is written there. Absolute symbolic links are refused
// too, even when they would resolve inside rootDir. Its errors start with "download" and the
// URL without credentials.
func Into(ctx context.Context, d *modelsv1.DownloadAction, rootDir, tmpDir string, uid, gid int) error {
	f, err := Fetch(ctx, d, tmpDir)
	if err != nil {
		return err
	}
	defer f.Close()
	fail := func(err error) error { return fmt.Errorf("download %s: %w", f.URL.Redacted(), refused(err)) }
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return fail(err)
	}
	defer root.Close()
	to := InRoot(d.GetTo())
	r, archive, err := f.Archive()
	if err != nil {
		return err
	}
	if !archive {
		if fi, err := root.Stat(to); (err == nil && fi.IsDir()) || strings.HasSuffix(d.GetTo(), "/") || to == "." {
			base := path.Base(f.URL.Path)
			if base == "/" || base == "." || base == "" {
				base = "download"
			}
			to = path.Join(to, base)
		}
		if err := root.MkdirAll(path.Dir(to), 0o755); err != nil {
			return fail(err)
		}
		if err := writeFile(root, to, r, 0o755, uid, gid); err != nil {
			return fail(err)
		}
		return nil
	}
	if _, err := root.Lstat(to); errors.Is(err, fs.ErrNotExist) {
		if err := root.MkdirAll(to, 0o755); err != nil {
			return fail(err)
		}
		if err := root.Lchown(to, uid, gid); err != nil {
			return fail(err)
		}
	}
	if err := untarIn(root, to, r, uid, gid); err != nil {
		return fail(err)
	}
	return nil
}

// InRoot is container path p relative to the root ("." for the root itself): cleaned, so it
// never starts with "..".
func InRoot(p string) string {
	if rel := strings.TrimPrefix(path.Clean("/"+p), "/"); rel != "" {
		return rel
	}
	return "."
}

// refused says, of an os.Root error for a path leading outside the root, that the download
// was refused for that reason; other errors are returned as they are.
func refused(err error) error {
	var pe *fs.PathError
	if !errors.As(err, &pe) || !strings.HasSuffix(err.Error(), "path escapes from parent") {
		return err
	}
	return fmt.Errorf("refused: /%s leads outside the root filesystem (a symbolic link or \"..\"): %w", pe.Path, err)
}

// writeFile writes r to name in root with mode, owned by uid and gid.
func writeFile(root *os.Root, name string, r io.Reader, mode fs.FileMode, uid, gid int) error {
	out, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := root.Chmod(name, mode); err != nil { // the umask narrowed it
		return err
	}
	return root.Lchown(name, uid, gid)
}

// untarIn extracts the tar stream r into dir of root: directories, regular files, symbolic
// and hard links, owned by uid and gid; other entries are skipped. Names are cleaned; links
// are created as given but never followed out of root.
func untarIn(root *os.Root, dir string, r io.Reader, uid, gid int) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("untar: %w", err)
		}
		name := path.Join(dir, InRoot(h.Name))
		if name == dir && h.Typeflag != tar.TypeDir {
			continue
		}
		mode := fs.FileMode(h.Mode) & fs.ModePerm
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return fmt.Errorf("untar %s: %w", h.Name, refused(err))
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, mode|0o700); err != nil {
				return fmt.Errorf("untar %s: %w", h.Name, refused(err))
			}
			err = root.Lchown(name, uid, gid)
		case tar.TypeReg:
			err = writeFile(root, name, tr, mode, uid, gid)
		case tar.TypeSymlink:
			_ = root.Remove(name)
			if err = root.Symlink(h.Linkname, name); err == nil {
				err = root.Lchown(name, uid, gid)
			}
		case tar.TypeLink:
			_ = root.Remove(name)
			err = root.Link(path.Join(dir, InRoot(h.Linkname)), name)
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("untar %s: %w", h.Name, refused(err))
		}
	}
}
