package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

var _ executor.Adopter = (*Backend)(nil)

// Adopt takes over the containers of the backend's containerd namespace that an earlier run
// of the rep left (see executor.Adopter): each one with its record in the work directory and
// a task is watched again — its output re-attached to logFor's sink, its checks run again,
// its network attachment and host ports taken back from the network's cache. Everything
// else that run left is removed: containers without a record or a task, and container
// directories without a containerd container (with their overlay mount, pinned network
// namespace and network attachment).
func (b *Backend) Adopt(ctx context.Context, logFor func(executor.Spec) executor.LogSink) ([]executor.Adopted, error) {
	cctx := b.ctx(ctx)
	ctrs, err := b.client.Containers(cctx)
	if err != nil {
		return nil, fmt.Errorf("oci backend: list the containers of namespace %s: %w", b.cfg.Namespace, err)
	}
	var out []executor.Adopted
	seen := map[string]bool{}
	for _, ctr := range ctrs {
		guid := ctr.ID()
		seen[guid] = true
		b.mu.Lock()
		_, held := b.containers[guid]
		b.mu.Unlock()
		if held {
			continue
		}
		c, err := b.adoptOne(cctx, ctr, logFor)
		if err != nil {
			b.log.Warn("removing a container that cannot be adopted", "guid", guid, "error", err)
			b.removeLeftover(cctx, guid)
			continue
		}
		b.mu.Lock()
		b.containers[guid] = c
		b.mu.Unlock()
		go c.run()
		if c.spec.Kind == executor.KindTask {
			c.log.Info("adopted task container")
		} else {
			c.log.Info("adopted lrp container", "process_guid", c.spec.ProcessGuid, "index", c.spec.Index)
		}
		spec := c.spec
		spec.Log = nil
		out = append(out, executor.Adopted{Spec: spec, Container: c})
	}
	entries, err := os.ReadDir(b.cfg.WorkDir)
	if err != nil {
		return out, fmt.Errorf("oci backend: list the work directory: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || seen[e.Name()] || !validGuid(e.Name()) {
			continue
		}
		b.log.Info("removing what a container left", "guid", e.Name())
		b.removeLeftover(cctx, e.Name())
	}
	return out, nil
}

// removeLeftover removes everything of container guid (logged when it cannot).
func (b *Backend) removeLeftover(ctx context.Context, guid string) {
	if err := b.removeStale(ctx, guid, newOverlay(b.containerDir(guid), "")); err != nil {
		b.log.Warn("could not remove a leftover container", "guid", guid, "error", err)
	}
}

// adoptOne takes over the containerd container ctr from its record.
func (b *Backend) adoptOne(ctx context.Context, ctr containerd.Container, logFor func(executor.Spec) executor.LogSink) (*container, error) {
	guid := ctr.ID()
	dir := b.containerDir(guid)
	rec, err := readRecord(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errors.New("no record: not created by this cell, or its creation did not finish")
	}
	if err != nil {
		return nil, err
	}
	if rec.Spec.Guid != guid {
		return nil, fmt.Errorf("record names container %q", rec.Spec.Guid)
	}
	if rec.Tree {
		return nil, errors.New("its action tree was run by the rep that stopped, and cannot be taken over")
	}
	if _, err := MainProcess(rec.Spec); err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	c := b.newContainer(rec.Spec, dir)
	c.ctr, c.cgroup, c.filesHost, c.snapshot = ctr, rec.Cgroup, rec.FilesHost, rec.Snapshot
	if rec.Upper != "" {
		c.ov.upper = rec.Upper
	}
	if logFor != nil {
		c.spec.Log = logFor(rec.Spec)
	}
	stdout, stderr := c.streams()
	attach := cio.NewAttach(cio.WithStreams(nil, stdout, stderr))
	c.task, err = ctr.Task(ctx, func(fifos *cio.FIFOSet) (cio.IO, error) {
		// The FIFOs are in the container's directory; should their directory be gone, new
		// ones let the container be adopted all the same (its output is then lost).
		for _, p := range []string{fifos.Stdout, fifos.Stderr} {
			if p != "" {
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					return nil, err
				}
			}
		}
		return attach(fifos)
	})
	if err != nil {
		return nil, fmt.Errorf("load task: %w", err)
	}
	c.exitCh, err = c.task.Wait(b.ctx(context.Background()))
	if err != nil {
		return nil, fmt.Errorf("wait for task: %w", err)
	}
	c.netnsPath = rec.NetnsPath
	if c.netnsPath == "" {
		c.netnsPath = fmt.Sprintf("/proc/%d/ns/net", c.task.Pid())
	}
	c.netInfo = &modelsv1.ActualLRPNetInfo{Address: b.cfg.CellAddress, InstanceAddress: b.cfg.CellAddress}
	if b.cfg.Network != nil && rec.NetnsPath != "" {
		att, ok, err := b.cfg.Network.Adopt(ctx, guid, rec.NetnsPath)
		if err != nil {
			return nil, fmt.Errorf("network attachment: %w", err)
		}
		if ok {
			c.attached = true
			c.netInfo.InstanceAddress = att.Address
			for _, cp := range c.ports {
				if hp, ok := att.Ports[cp]; ok {
					c.netInfo.Ports = append(c.netInfo.Ports, &modelsv1.PortMapping{ContainerPort: cp, HostPort: hp})
				}
			}
		}
	}
	if rec.Snapshot {
		if ref, _, err := imageRef(rec.Spec.Rootfs, b.cfg.InsecureRegistries); err == nil {
			c.image = ref
			b.useImage(ref)
		}
	}
	return c, nil
}
