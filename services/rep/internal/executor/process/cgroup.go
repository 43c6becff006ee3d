package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupParent is the cgroup, under the cgroup v2 root, holding one child per container.
const cgroupParent = "gavel"

// cgroupControllers are the controllers every container cgroup needs.
var cgroupControllers = []string{"memory", "pids"}

// cgroupManager creates per-container cgroups under <root>/gavel.
type cgroupManager struct {
	parent string
}

// newCgroupManager checks that cgroup v2 is mounted at root and writable: it enables the
// memory and pids controllers for root's children and for gavel/'s children, and creates
// and removes a probe group. The error says why limits cannot be enforced.
func newCgroupManager(root string) (*cgroupManager, error) {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		return nil, fmt.Errorf("cgroup v2 not mounted at %s", root)
	}
	parent := filepath.Join(root, cgroupParent)
	if err := enableControllers(root); err != nil {
		return nil, err
	}
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup v2 not writable: create %s: %w", parent, err)
	}
	if err := enableControllers(parent); err != nil {
		return nil, err
	}
	probe := filepath.Join(parent, fmt.Sprintf("probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup v2 not writable: create %s: %w", probe, err)
	}
	defer os.Remove(probe)
	for _, f := range []string{"memory.max", "pids.max"} {
		if _, err := os.Stat(filepath.Join(probe, f)); err != nil {
			return nil, fmt.Errorf("cgroup v2: %s missing in a child of %s", f, parent)
		}
	}
	return &cgroupManager{parent: parent}, nil
}

// enableControllers makes the memory and pids controllers available to dir's children.
func enableControllers(dir string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2: read controllers of %s: %w", dir, err)
	}
	enabled, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("cgroup v2: read subtree_control of %s: %w", dir, err)
	}
	var add []string
	for _, c := range cgroupControllers {
		if !slicesContainsField(string(avail), c) {
			return fmt.Errorf("cgroup v2: controller %s not available in %s (have %q)", c, dir, strings.TrimSpace(string(avail)))
		}
		if !slicesContainsField(string(enabled), c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0o644); err != nil {
		return fmt.Errorf("cgroup v2 not writable: enable %s in %s: %w", strings.Join(add, " "), dir, err)
	}
	return nil
}

func slicesContainsField(s, field string) bool {
	for _, f := range strings.Fields(s) {
		if f == field {
			return true
		}
	}
	return false
}

// cgroup is one container's cgroup.
type cgroup struct {
	path string
	fd   *os.File // the directory, for SysProcAttr.CgroupFD
}

// create makes the container's cgroup with its limits (0: unlimited).
func (m *cgroupManager) create(guid string, memoryMB, maxPids int32) (*cgroup, error) {
	path := filepath.Join(m.parent, guid)
	if err := os.Mkdir(path, 0o755); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create cgroup %s: %w", path, err)
		}
		// Left over by an earlier run: empty it and reuse it.
		killCgroup(path)
	}
	write := func(file, value string) error {
		if err := os.WriteFile(filepath.Join(path, file), []byte(value), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: set %s=%s: %w", path, file, value, err)
		}
		return nil
	}
	mem, pids := "max", "max"
	if memoryMB > 0 {
		mem = strconv.FormatInt(int64(memoryMB)<<20, 10)
	}
	if maxPids > 0 {
		pids = strconv.Itoa(int(maxPids))
	}
	err := errors.Join(write("memory.max", mem), write("pids.max", pids))
	if err == nil && memoryMB > 0 {
		// Without swap accounting the file is missing; the limit then only covers RAM.
		if _, statErr := os.Stat(filepath.Join(path, "memory.swap.max")); statErr == nil {
			err = write("memory.swap.max", "0")
		}
	}
	var fd *os.File
	if err == nil {
		fd, err = os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			err = fmt.Errorf("open cgroup %s: %w", path, err)
		}
	}
	if err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	return &cgroup{path: path, fd: fd}, nil
}

// destroy kills what is left in the cgroup and removes it.
func (c *cgroup) destroy() {
	_ = c.fd.Close()
	killCgroup(c.path)
	for i := 0; i < 100; i++ {
		err := os.Remove(c.path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill sends SIGKILL to every process in the cgroup.
func (c *cgroup) kill() {
	killCgroup(c.path)
}

// killCgroup kills every process in the cgroup at path: with cgroup.kill when the kernel has
// it, otherwise one by one.
func killCgroup(path string) {
	if err := os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0o644); err == nil {
		return
	}
	b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
