package auction

import (
	"strings"

	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

// LRPWork turns LRP start requests into one piece of work per instance index.
func LRPWork(starts []*auctioneerv1.LRPStartRequest) []*placement.Work {
	var out []*placement.Work
	for _, s := range starts {
		peer := spreadPeer(s.GetSpreadPeer())
		for _, idx := range s.GetIndices() {
			out = append(out, &placement.Work{
				Kind:        placement.KindLRP,
				ProcessGuid: s.GetProcessGuid(),
				Index:       idx,
				Domain:      s.GetDomain(),
				MemoryMB:    int(s.GetResources().GetMemoryMb()),
				DiskMB:      int(s.GetResources().GetDiskMb()),
				MaxPids:     s.GetResources().GetMaxPids(),
				Rootfs:      s.GetRootfs(),
				Require:     s.GetPlacementConstraint().GetRequire(),
				Disallow:    s.GetPlacementConstraint().GetDisallow(),

				Trace:      s.GetTrace(),
				SpreadPeer: peer,
			})
		}
	}
	return out
}

// spreadPeer is the placement form of a start request's spread peer: its instances per cell id
// (nil when there is none, or it has no instance to count).
func spreadPeer(p *auctioneerv1.SpreadPeer) map[string]int {
	if len(p.GetCellInstances()) == 0 {
		return nil
	}
	out := make(map[string]int, len(p.GetCellInstances()))
	for id, n := range p.GetCellInstances() {
		if n > 0 {
			out[id] = int(n)
		}
	}
	return out
}

// TaskWork turns task start requests into work.
func TaskWork(tasks []*auctioneerv1.TaskStartRequest) []*placement.Work {
	out := make([]*placement.Work, 0, len(tasks))
	for _, t := range tasks {
		out = append(out, &placement.Work{
			Kind:     placement.KindTask,
			TaskGuid: t.GetTaskGuid(),
			Domain:   t.GetDomain(),
			MemoryMB: int(t.GetResources().GetMemoryMb()),
			DiskMB:   int(t.GetResources().GetDiskMb()),
			MaxPids:  t.GetResources().GetMaxPids(),
			Rootfs:   t.GetRootfs(),
			Require:  t.GetPlacementConstraint().GetRequire(),
			Disallow: t.GetPlacementConstraint().GetDisallow(),

			Trace: t.GetTrace(),
		})
	}
	return out
}

// performRequest is the Perform request handing works to a cell; traces[i], when set, is the
// trace context works[i] carries to the cell.
func performRequest(works []*placement.Work, traces []*modelsv1.TraceContext) *repv1.PerformRequest {
	req := &repv1.PerformRequest{}
	for i, w := range works {
		var tc *modelsv1.TraceContext
		if i < len(traces) {
			tc = traces[i]
		}
		res := &modelsv1.Resources{MemoryMb: int32(w.MemoryMB), DiskMb: int32(w.DiskMB), MaxPids: w.MaxPids}
		var pc *modelsv1.PlacementConstraint
		if len(w.Require) > 0 || len(w.Disallow) > 0 {
			pc = &modelsv1.PlacementConstraint{Require: w.Require, Disallow: w.Disallow}
		}
		if w.Kind == placement.KindTask {
			req.Tasks = append(req.Tasks, &repv1.TaskWork{
				TaskGuid: w.TaskGuid, Domain: w.Domain, Resources: res, Rootfs: w.Rootfs, PlacementConstraint: pc,
				Trace: tc,
			})
			continue
		}
		req.Lrps = append(req.Lrps, &repv1.LRPInstance{
			Key:       &modelsv1.ActualLRPKey{ProcessGuid: w.ProcessGuid, Index: w.Index, Domain: w.Domain},
			Resources: res, Rootfs: w.Rootfs, PlacementConstraint: pc, Trace: tc,
		})
	}
	return req
}

// failedKeys are the work keys of the work a cell handed back.
func failedKeys(resp *repv1.PerformResponse) map[string]bool {
	out := map[string]bool{}
	for _, l := range resp.GetFailedLrps() {
		w := placement.Work{Kind: placement.KindLRP, ProcessGuid: l.GetKey().GetProcessGuid(), Index: l.GetKey().GetIndex()}
		out[w.Key()] = true
	}
	for _, t := range resp.GetFailedTasks() {
		w := placement.Work{Kind: placement.KindTask, TaskGuid: t.GetTaskGuid()}
		out[w.Key()] = true
	}
	return out
}

// unreachableCell is a registered cell that did not answer State.
func unreachableCell(p *modelsv1.CellPresence) *placement.Cell {
	// Its presence still says what it could run (tags, rootfses), so placement can tell a
	// compatible cell that did not answer from one that could never take the work.
	c := cellFromState(p, &repv1.StateResponse{})
	c.Unreachable = true
	return c
}

// cellFromState is the round's view of a cell from its presence and its State answer. The
// State answer is live and wins; the presence fills what it leaves out.
func cellFromState(p *modelsv1.CellPresence, s *repv1.StateResponse) *placement.Cell {
	zone := s.GetZone()
	if zone == "" {
		zone = p.GetZone()
	}
	total := capacity(s.GetTotalResources())
	if s.GetTotalResources() == nil {
		total = capacity(p.GetCapacity())
	}
	available := total
	if s.GetAvailableResources() != nil {
		available = capacity(s.GetAvailableResources())
	}
	tags := s.GetPlacementTags()
	if len(tags) == 0 {
		tags = p.GetPlacementTags()
	}
	preloaded := s.GetPreloadedRootfses()
	if len(preloaded) == 0 {
		for name := range p.GetPreloadedRootfses() {
			preloaded = append(preloaded, name)
		}
	}
	providers := s.GetRootfsProviders()
	if len(providers) == 0 {
		providers = p.GetRootfsProviders()
	}
	lower := make([]string, len(providers))
	for i, pr := range providers {
		lower[i] = strings.ToLower(pr)
	}
	instances := make(map[string]int, len(s.GetLrpInstances()))
	for guid, n := range s.GetLrpInstances() {
		instances[guid] += int(n)
	}
	for _, l := range s.GetLrps() { // a full answer (a rep that ignores summary)
		instances[l.GetKey().GetProcessGuid()]++
	}
	return &placement.Cell{
		ID:                p.GetCellId(),
		Address:           p.GetRepAddress(),
		Zone:              zone,
		Total:             total,
		Available:         available,
		Tags:              placement.TagSet(tags...),
		PreloadedRootfses: placement.NameSet(preloaded...),
		RootfsProviders:   placement.NameSet(lower...),
		Instances:         instances,
		Starting:          int(s.GetStartingContainerCount()),
		Evacuating:        s.GetEvacuating(),
		PresenceLapsed:    s.GetPresenceLapsed(),
	}
}

func capacity(c *modelsv1.CellCapacity) placement.Capacity {
	return placement.Capacity{MemoryMB: int(c.GetMemoryMb()), DiskMB: int(c.GetDiskMb()), Containers: int(c.GetContainers())}
}
