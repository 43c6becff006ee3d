package cell

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// lrpSpec builds the container spec of an LRP instance from its desired LRP.
func lrpSpec(d *modelsv1.DesiredLRP, key *modelsv1.ActualLRPKey, instanceGuid string) executor.Spec {
	index := strconv.Itoa(int(key.GetIndex()))
	env := cloneEnv(d.GetEnv())
	env = append(env,
		&modelsv1.EnvironmentVariable{Name: "INSTANCE_INDEX", Value: index},
		&modelsv1.EnvironmentVariable{Name: "INSTANCE_GUID", Value: instanceGuid},
		&modelsv1.EnvironmentVariable{Name: "CF_INSTANCE_INDEX", Value: index},
		&modelsv1.EnvironmentVariable{Name: "CF_INSTANCE_GUID", Value: instanceGuid},
	)
	return executor.Spec{
		Guid:                instanceGuid,
		Kind:                executor.KindLRP,
		ProcessGuid:         d.GetProcessGuid(),
		Index:               key.GetIndex(),
		Domain:              d.GetDomain(),
		Rootfs:              d.GetRootfs(),
		ImageUsername:       d.GetImageUsername(),
		ImagePassword:       d.GetImagePassword(),
		Env:                 env,
		Setup:               d.GetSetup().CloneVT(),
		Action:              d.GetAction().CloneVT(),
		Monitor:             d.GetMonitor().CloneVT(),
		Checks:              d.GetCheckDefinition().CloneVT(),
		Ports:               append([]uint32(nil), d.GetPorts()...),
		MemoryMB:            d.GetMemoryMb(),
		DiskMB:              d.GetDiskMb(),
		MaxPids:             d.GetMaxPids(),
		CPUWeight:           d.GetCpuWeight(),
		Privileged:          d.GetPrivileged(),
		StartTimeout:        time.Duration(d.GetStartTimeoutMs()) * time.Millisecond,
		Properties:          maps.Clone(d.GetProperties()),
		PlacementConstraint: d.GetPlacementConstraint().CloneVT(),
		LogGuid:             d.GetLogGuid(),
		LogDrains:           slices.Clone(d.GetLogDrains()),
	}
}

// taskSpec builds the container spec of a task.
func taskSpec(t *modelsv1.Task) executor.Spec {
	def := t.GetDefinition()
	return executor.Spec{
		Guid:                t.GetTaskGuid(),
		Kind:                executor.KindTask,
		TaskGuid:            t.GetTaskGuid(),
		Domain:              t.GetDomain(),
		Rootfs:              def.GetRootfs(),
		ImageUsername:       def.GetImageUsername(),
		ImagePassword:       def.GetImagePassword(),
		Env:                 cloneEnv(def.GetEnv()),
		Action:              def.GetAction().CloneVT(),
		MemoryMB:            def.GetMemoryMb(),
		DiskMB:              def.GetDiskMb(),
		MaxPids:             def.GetMaxPids(),
		CPUWeight:           def.GetCpuWeight(),
		Privileged:          def.GetPrivileged(),
		ResultFile:          def.GetResultFile(),
		Properties:          maps.Clone(def.GetProperties()),
		PlacementConstraint: def.GetPlacementConstraint().CloneVT(),
		LogDrains:           slices.Clone(def.GetLogDrains()),
		LogGuid:             def.GetLogGuid(),
	}
}

func cloneEnv(env []*modelsv1.EnvironmentVariable) []*modelsv1.EnvironmentVariable {
	out := make([]*modelsv1.EnvironmentVariable, 0, len(env)+4)
	for _, e := range env {
		out = append(out, e.CloneVT())
	}
	return out
}

// HookPayload is the JSON a container hook reads on stdin: the container spec with its field
// names in snake_case (see executor.Spec), "kind" as "lrp" or "task", and the action trees,
// check definition and environment in their protobuf JSON form (lowerCamel field names).
func HookPayload(spec executor.Spec) ([]byte, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode spec of %s: %w", spec.Guid, err)
	}
	fields := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, fmt.Errorf("encode spec of %s: %w", spec.Guid, err)
	}
	kind := "lrp"
	if spec.Kind == executor.KindTask {
		kind = "task"
	}
	fields["kind"], _ = json.Marshal(kind)
	for name, m := range map[string]proto.Message{"setup": spec.Setup, "action": spec.Action, "monitor": spec.Monitor, "checks": spec.Checks} {
		if m == nil || !m.ProtoReflect().IsValid() {
			delete(fields, name)
			continue
		}
		pb, err := protojson.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encode %s of %s: %w", name, spec.Guid, err)
		}
		fields[name] = pb
	}
	if len(spec.Env) > 0 {
		env := make([]json.RawMessage, 0, len(spec.Env))
		for _, e := range spec.Env {
			pb, err := protojson.Marshal(e)
			if err != nil {
				return nil, fmt.Errorf("encode env of %s: %w", spec.Guid, err)
			}
			env = append(env, pb)
		}
		fields["env"], _ = json.Marshal(env)
	}
	fields["start_timeout"], _ = json.Marshal(spec.StartTimeout.String())
	out, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("encode spec of %s: %w", spec.Guid, err)
	}
	return out, nil
}
