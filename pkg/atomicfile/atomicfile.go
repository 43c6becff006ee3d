// Package atomicfile replaces files so that readers never see a partial write.
package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data: it writes a temporary file in the same directory with mode
// perm and renames it over path, so a reader sees the old content or the new, never a part.
func Write(path string, data []byte, perm os.FileMode) error {
	root, err := os.OpenRoot(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer root.Close()
	return writeIn(root, filepath.Base(path), path, data, perm)
}

// WriteIn is Write for name inside root: every step goes through root, so a symbolic link or
// ".." on the way cannot lead the write outside it (the write fails instead).
func WriteIn(root *os.Root, name string, data []byte, perm os.FileMode) error {
	return writeIn(root, name, name, data, perm)
}

// writeIn is WriteIn whose errors name the file as shown.
func writeIn(root *os.Root, name, shown string, data []byte, perm os.FileMode) error {
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	tmp := filepath.Join(filepath.Dir(name), ".tmp-"+filepath.Base(name)+"-"+hex.EncodeToString(suffix[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", shown, err)
	}
	defer root.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", shown, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", shown, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", shown, err)
	}
	if err := root.Rename(tmp, name); err != nil {
		return fmt.Errorf("write %s: %w", shown, err)
	}
	return nil
}
