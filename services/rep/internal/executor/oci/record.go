package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gavel-sched/gavel/pkg/atomicfile"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// recordFile is the name of a container's record in its directory.
const recordFile = "record.json"

// record is what the backend keeps of a container on disk, in its directory, so that a
// restarted rep can adopt it (Adopt): the spec it was started with, without its environment
// (it may hold secrets, and the running process has it already), files and log sink, and
// where its cgroup and network namespace are.
type record struct {
	// Spec is the container's spec with Env, Setup, Action, Monitor and Checks left out
	// (Action and Checks are below, in their protobuf JSON form).
	Spec executor.Spec `json:"spec"`
	// Action is the spec's action (protobuf JSON).
	Action json.RawMessage `json:"action,omitempty"`
	// Checks is the spec's check definition (protobuf JSON).
	Checks json.RawMessage `json:"checks,omitempty"`
	// Cgroup is the container's cgroup path (the OCI spec's cgroupsPath).
	Cgroup string `json:"cgroup"`
	// NetnsPath is the pinned network namespace; empty when the backend has no Network.
	NetnsPath string `json:"netns_path,omitempty"`
	// FilesHost is the host path of the spec's files directory ("" without one).
	FilesHost string `json:"files_host,omitempty"`
	// Snapshot says the rootfs is a snapshot of an image, keyed by the guid (imageRootfs).
	Snapshot bool `json:"snapshot,omitempty"`
	// Upper is the writable layer of an image's snapshot (the overlay's upper directory of a
	// preloaded rootfs is in the container's directory).
	Upper string `json:"upper,omitempty"`
	// Tree says the container's action is a tree run by the rep (IsTree): its init is the
	// init program, and no later rep can take the tree over.
	Tree bool `json:"tree,omitempty"`
}

// writeRecord writes c's record into its directory.
func (c *container) writeRecord() error {
	r := record{Spec: c.spec, Cgroup: c.cgroup, FilesHost: c.filesHost, Snapshot: c.snapshot, Tree: c.tree}
	if c.snapshot {
		r.Upper = c.ov.upper
	}
	if c.b.cfg.Network != nil {
		r.NetnsPath = c.netnsPath
	}
	r.Spec.Env, r.Spec.Setup, r.Spec.Action, r.Spec.Monitor, r.Spec.Checks = nil, nil, nil, nil, nil
	r.Spec.Files, r.Spec.Log = nil, nil
	var err error
	if c.spec.Action != nil {
		if r.Action, err = protojson.Marshal(c.spec.Action); err != nil {
			return fmt.Errorf("record container: action: %w", err)
		}
	}
	if c.spec.Checks != nil {
		if r.Checks, err = protojson.Marshal(c.spec.Checks); err != nil {
			return fmt.Errorf("record container: checks: %w", err)
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("record container: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(c.dir, recordFile), b, 0o600); err != nil {
		return fmt.Errorf("record container: %w", err)
	}
	return nil
}

// readRecord reads the record in the container directory dir.
func readRecord(dir string) (record, error) {
	var r record
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("read %s: %w", filepath.Join(dir, recordFile), err)
	}
	if len(r.Action) > 0 {
		r.Spec.Action = &modelsv1.Action{}
		if err := protojson.Unmarshal(r.Action, r.Spec.Action); err != nil {
			return r, fmt.Errorf("read %s: action: %w", filepath.Join(dir, recordFile), err)
		}
	}
	if len(r.Checks) > 0 {
		r.Spec.Checks = &modelsv1.CheckDefinition{}
		if err := protojson.Unmarshal(r.Checks, r.Spec.Checks); err != nil {
			return r, fmt.Errorf("read %s: checks: %w", filepath.Join(dir, recordFile), err)
		}
	}
	return r, nil
}
