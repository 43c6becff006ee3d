package models

import (
	"maps"
	"slices"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

func cloneRoutes(m map[string][]byte) map[string][]byte {
	if m == nil {
		return nil
	}
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = slices.Clone(v)
	}
	return out
}

func cloneEnv(env []*modelsv1.EnvironmentVariable) []*modelsv1.EnvironmentVariable {
	if env == nil {
		return nil
	}
	out := make([]*modelsv1.EnvironmentVariable, len(env))
	for i, v := range env {
		out[i] = v.CloneVT()
	}
	return out
}

// SchedulingInfo returns the part of d that placement and routing read: identity, rootfs,
// instances, resources, placement constraint, labels, annotation, routes, modification tag and
// spread peer. The result shares no memory with d.
func SchedulingInfo(d *modelsv1.DesiredLRP) *modelsv1.DesiredLRPSchedulingInfo {
	if d == nil {
		return nil
	}
	return &modelsv1.DesiredLRPSchedulingInfo{
		ProcessGuid: d.GetProcessGuid(),
		Domain:      d.GetDomain(),
		LogGuid:     d.GetLogGuid(),
		Rootfs:      d.GetRootfs(),
		Instances:   d.GetInstances(),
		Resources: &modelsv1.Resources{
			MemoryMb: d.GetMemoryMb(),
			DiskMb:   d.GetDiskMb(),
			MaxPids:  d.GetMaxPids(),
		},
		PlacementConstraint: d.GetPlacementConstraint().CloneVT(),
		Labels:              maps.Clone(d.GetLabels()),
		Annotation:          d.GetAnnotation(),
		Routes:              cloneRoutes(d.GetRoutes()),
		ModificationTag:     d.GetModificationTag().CloneVT(),
		SpreadWith:          d.GetSpreadWith().CloneVT(),
	}
}

// RunInfo returns the part of d that only the cell running it needs: properties, ports, env,
// actions, checks, start timeout, links, privilege, CPU weight, log drains and image
// credentials, with the identity.
// The result shares no memory with d.
func RunInfo(d *modelsv1.DesiredLRP) *modelsv1.DesiredLRPRunInfo {
	if d == nil {
		return nil
	}
	return &modelsv1.DesiredLRPRunInfo{
		ProcessGuid:     d.GetProcessGuid(),
		Domain:          d.GetDomain(),
		Properties:      maps.Clone(d.GetProperties()),
		Ports:           slices.Clone(d.GetPorts()),
		Env:             cloneEnv(d.GetEnv()),
		Setup:           d.GetSetup().CloneVT(),
		Action:          d.GetAction().CloneVT(),
		Monitor:         d.GetMonitor().CloneVT(),
		CheckDefinition: d.GetCheckDefinition().CloneVT(),
		StartTimeoutMs:  d.GetStartTimeoutMs(),
		Links:           d.GetLinks().CloneVT(),
		Privileged:      d.GetPrivileged(),
		CpuWeight:       d.GetCpuWeight(),
		LogDrains:       slices.Clone(d.GetLogDrains()),
		ImageUsername:   d.GetImageUsername(),
		ImagePassword:   d.GetImagePassword(),
	}
}

// JoinDesiredLRP rebuilds a DesiredLRP from its halves. r may be nil: then only the scheduling
// fields are set. The result shares no memory with s or r.
func JoinDesiredLRP(s *modelsv1.DesiredLRPSchedulingInfo, r *modelsv1.DesiredLRPRunInfo) *modelsv1.DesiredLRP {
	if s == nil {
		return nil
	}
	d := &modelsv1.DesiredLRP{
		ProcessGuid:         s.GetProcessGuid(),
		Domain:              s.GetDomain(),
		LogGuid:             s.GetLogGuid(),
		Rootfs:              s.GetRootfs(),
		Instances:           s.GetInstances(),
		MemoryMb:            s.GetResources().GetMemoryMb(),
		DiskMb:              s.GetResources().GetDiskMb(),
		MaxPids:             s.GetResources().GetMaxPids(),
		PlacementConstraint: s.GetPlacementConstraint().CloneVT(),
		Labels:              maps.Clone(s.GetLabels()),
		Annotation:          s.GetAnnotation(),
		Routes:              cloneRoutes(s.GetRoutes()),
		ModificationTag:     s.GetModificationTag().CloneVT(),
		SpreadWith:          s.GetSpreadWith().CloneVT(),
	}
	if r == nil {
		return d
	}
	d.Properties = maps.Clone(r.GetProperties())
	d.Ports = slices.Clone(r.GetPorts())
	d.Env = cloneEnv(r.GetEnv())
	d.Setup = r.GetSetup().CloneVT()
	d.Action = r.GetAction().CloneVT()
	d.Monitor = r.GetMonitor().CloneVT()
	d.CheckDefinition = r.GetCheckDefinition().CloneVT()
	d.StartTimeoutMs = r.GetStartTimeoutMs()
	d.Links = r.GetLinks().CloneVT()
	d.Privileged = r.GetPrivileged()
	d.CpuWeight = r.GetCpuWeight()
	d.LogDrains = slices.Clone(r.GetLogDrains())
	d.ImageUsername = r.GetImageUsername()
	d.ImagePassword = r.GetImagePassword()
	return d
}
