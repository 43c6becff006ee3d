package rootfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// linkTree recreates the directory tree src at dst: directories are made with src's mode and
// owner, everything else is hard-linked (copied when src and dst are on different
// filesystems).
func linkTree(src, dst string) error {
	type dirMode struct {
		path string
		mode fs.FileMode
	}
	var dirs []dirMode
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return fmt.Errorf("relative path of %s: %w", path, err)
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
		if d.IsDir() {
			if err := os.Mkdir(target, 0o700); err != nil {
				return fmt.Errorf("mkdir %s: %w", target, err)
			}
			if err := chownLike(target, info); err != nil {
				return err
			}
			// Modes are applied last: a read-only directory must stay writable while filled.
			dirs = append(dirs, dirMode{target, info.Mode()})
			return nil
		}
		if err := os.Link(path, target); err != nil {
			if !errors.Is(err, syscall.EXDEV) && !errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.EMLINK) {
				return fmt.Errorf("link %s: %w", target, err)
			}
			if err := copyEntry(path, target, info); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		m := dirs[i].mode & (os.ModePerm | os.ModeSetgid | os.ModeSticky)
		if err := os.Chmod(dirs[i].path, m); err != nil {
			return fmt.Errorf("chmod %s: %w", dirs[i].path, err)
		}
	}
	return nil
}

// copyEntry copies a regular file or a symbolic link (other special files are skipped).
func copyEntry(src, dst string, info fs.FileInfo) error {
	switch {
	case info.Mode()&os.ModeSymlink != 0:
		link, err := os.Readlink(src)
		if err != nil {
			return fmt.Errorf("readlink %s: %w", src, err)
		}
		if err := os.Symlink(link, dst); err != nil {
			return fmt.Errorf("symlink %s: %w", dst, err)
		}
		return chownLike(dst, info)
	case info.Mode().IsRegular():
		in, err := os.Open(src)
		if err != nil {
			return fmt.Errorf("open %s: %w", src, err)
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", dst, err)
		}
		_, err = io.Copy(out, in)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("copy %s: %w", dst, err)
		}
		if err := chownLike(dst, info); err != nil {
			return err
		}
		mode := info.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		if err := os.Chmod(dst, mode); err != nil {
			return fmt.Errorf("chmod %s: %w", dst, err)
		}
		return nil
	default:
		return nil
	}
}

// chownLike gives dst the owner of info when running as root.
func chownLike(dst string, info fs.FileInfo) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || os.Geteuid() != 0 {
		return nil
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", dst, err)
	}
	return nil
}
