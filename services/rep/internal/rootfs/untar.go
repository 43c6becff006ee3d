package rootfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// UntarOptions say who owns the files Untar writes.
type UntarOptions struct {
	// KeepOwners applies the archive's uid and gid to every entry (it needs root). It wins
	// over ChownTo.
	KeepOwners bool
	// ChownTo, when true, makes UID and GID own every entry written.
	ChownTo bool
	// UID owns the entries when ChownTo is set.
	UID int
	// GID owns the entries when ChownTo is set.
	GID int
}

// Untar extracts the tar stream r into dir, which is created when missing. Entries are kept
// inside dir: names are cleaned, and an entry is never written through a symbolic link the
// archive itself created. Character and block devices are created only when permitted
// (otherwise skipped); other special entries are skipped.
func Untar(r io.Reader, dir string, opts UntarOptions) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("untar: create %s: %w", dir, err)
	}
	x := &extractor{root: dir, opts: opts, safeDirs: map[string]bool{dir: true}}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("untar into %s: read archive: %w", dir, err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return fmt.Errorf("untar into %s: %s: %w", dir, hdr.Name, err)
		}
	}
	// Hard links whose target came later in the stream (a flattened image lists upper layers
	// first) are made now.
	for _, l := range x.pendingLinks {
		if err := x.link(l.target, l.hdr); err != nil {
			return fmt.Errorf("untar into %s: %s: %w", dir, l.hdr.Name, err)
		}
	}
	return nil
}

// errNotDir is returned by ensureParent when a parent is not a real directory.
var errNotDir = errors.New("not a directory")

type pendingLink struct {
	target string
	hdr    *tar.Header
}

type extractor struct {
	root         string
	opts         UntarOptions
	safeDirs     map[string]bool // directories known to be real directories inside root
	pendingLinks []pendingLink
}

// inside maps an archive name to a path under root.
func (x *extractor) inside(name string) (string, bool) {
	clean := filepath.Clean("/" + strings.ReplaceAll(name, "\\", "/"))
	if clean == "/" {
		return x.root, false
	}
	return filepath.Join(x.root, clean), true
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	target, ok := x.inside(hdr.Name)
	if !ok {
		// The root itself: apply its mode and owner only.
		if hdr.Typeflag == tar.TypeDir {
			return x.finish(x.root, hdr)
		}
		return nil
	}
	if err := x.ensureParent(target); err != nil {
		if errors.Is(err, errNotDir) {
			// A parent is a file or a symbolic link: in a flattened image an upper layer
			// replaced the directory, and following a link could leave root. Skip it.
			return nil
		}
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		fi, err := os.Lstat(target)
		switch {
		case err == nil && fi.IsDir():
		case err == nil:
			if err := os.RemoveAll(target); err != nil {
				return fmt.Errorf("replace with directory: %w", err)
			}
			fallthrough
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(target, 0o755); err != nil {
				return fmt.Errorf("mkdir: %w", err)
			}
		default:
			return fmt.Errorf("lstat: %w", err)
		}
		x.safeDirs[target] = true
		return x.finish(target, hdr)
	case tar.TypeReg, tar.TypeRegA:
		if err := removeNonDir(target); err != nil {
			return err
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return x.finish(target, hdr)
	case tar.TypeSymlink:
		if err := removeNonDir(target); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
		return x.chown(target, hdr)
	case tar.TypeLink:
		linkTarget, ok := x.inside(hdr.Linkname)
		if !ok {
			return fmt.Errorf("hard link to the archive root")
		}
		if _, err := os.Lstat(linkTarget); errors.Is(err, os.ErrNotExist) {
			x.pendingLinks = append(x.pendingLinks, pendingLink{target: target, hdr: hdr})
			return nil
		}
		return x.link(target, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if err := removeNonDir(target); err != nil {
			return err
		}
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode |= syscall.S_IFCHR
		case tar.TypeBlock:
			mode |= syscall.S_IFBLK
		default:
			mode |= syscall.S_IFIFO
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknod(target, mode, int(dev)); err != nil {
			if hdr.Typeflag != tar.TypeFifo && (errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EPERM)) {
				return nil // not allowed here (unprivileged or in a user namespace): skip it
			}
			return fmt.Errorf("mknod: %w", err)
		}
		return x.finish(target, hdr)
	default:
		return nil
	}
}

// link makes the hard link described by hdr at target.
func (x *extractor) link(target string, hdr *tar.Header) error {
	linkTarget, _ := x.inside(hdr.Linkname)
	if err := x.ensureParent(linkTarget); err != nil {
		if errors.Is(err, errNotDir) {
			return nil
		}
		return fmt.Errorf("hard link target: %w", err)
	}
	if err := removeNonDir(target); err != nil {
		return err
	}
	if err := os.Link(linkTarget, target); err != nil {
		return fmt.Errorf("hard link: %w", err)
	}
	return nil
}

// ensureParent creates target's parent directories and refuses a parent that is not a real
// directory (e.g. a symbolic link made by the archive, which could point outside root).
func (x *extractor) ensureParent(target string) error {
	parent := filepath.Dir(target)
	if x.safeDirs[parent] {
		return nil
	}
	rel, err := filepath.Rel(x.root, parent)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Errorf("path outside the extraction directory")
	}
	cur := x.root
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		cur = filepath.Join(cur, part)
		if x.safeDirs[cur] {
			continue
		}
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(cur, 0o755); err != nil {
				return fmt.Errorf("mkdir %s: %w", cur, err)
			}
			if x.opts.ChownTo && !x.opts.KeepOwners {
				if err := os.Lchown(cur, x.opts.UID, x.opts.GID); err != nil {
					return fmt.Errorf("chown %s: %w", cur, err)
				}
			}
		case err != nil:
			return fmt.Errorf("lstat %s: %w", cur, err)
		case !fi.IsDir():
			return fmt.Errorf("%s: %w", cur, errNotDir)
		}
		x.safeDirs[cur] = true
	}
	return nil
}

// finish applies owner then mode (chown clears set-id bits).
func (x *extractor) finish(target string, hdr *tar.Header) error {
	if err := x.chown(target, hdr); err != nil {
		return err
	}
	mode := hdr.FileInfo().Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
	if err := os.Chmod(target, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

func (x *extractor) chown(target string, hdr *tar.Header) error {
	var uid, gid int
	switch {
	case x.opts.KeepOwners:
		uid, gid = hdr.Uid, hdr.Gid
	case x.opts.ChownTo:
		uid, gid = x.opts.UID, x.opts.GID
	default:
		return nil
	}
	if err := os.Lchown(target, uid, gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	return nil
}

// removeNonDir removes whatever is at path unless it is missing; a directory is removed
// with its contents (a later layer replaced it with a file).
func removeNonDir(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lstat: %w", err)
	}
	if fi.IsDir() {
		err = os.RemoveAll(path)
	} else {
		err = os.Remove(path)
	}
	if err != nil {
		return fmt.Errorf("replace existing entry: %w", err)
	}
	return nil
}
