package api

import (
	"fmt"

	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Validate checks an auction request, naming every bad field; other requests pass. It is the
// server's validator (grpcx.WithValidator), so bad input never reaches a batch.
func Validate(req any) error {
	e := &rpcerr.InvalidError{}
	switch r := req.(type) {
	case *auctioneerv1.RequestLRPAuctionsRequest:
		for i, s := range r.GetStarts() {
			f := fmt.Sprintf("starts[%d]", i)
			e.Merge(f+".process_guid", models.ValidateGuid(f+".process_guid", s.GetProcessGuid()))
			e.Merge(f+".domain", models.ValidateDomain(f+".domain", s.GetDomain()))
			if len(s.GetIndices()) == 0 {
				e.Add(f+".indices", "must name at least one index")
			}
			for j, idx := range s.GetIndices() {
				if idx < 0 {
					e.Add(fmt.Sprintf("%s.indices[%d]", f, j), "must not be negative, got %d", idx)
				}
			}
			work(e, f, s.GetResources(), s.GetRootfs(), s.GetPlacementConstraint())
		}
	case *auctioneerv1.RequestTaskAuctionsRequest:
		for i, t := range r.GetTasks() {
			f := fmt.Sprintf("tasks[%d]", i)
			e.Merge(f+".task_guid", models.ValidateGuid(f+".task_guid", t.GetTaskGuid()))
			e.Merge(f+".domain", models.ValidateDomain(f+".domain", t.GetDomain()))
			work(e, f, t.GetResources(), t.GetRootfs(), t.GetPlacementConstraint())
		}
	}
	return rpcerr.ToStatus(e.Err())
}

// work checks what every piece of work carries: resources, rootfs and constraint.
func work(e *rpcerr.InvalidError, f string, res *modelsv1.Resources, rootfs string, pc *modelsv1.PlacementConstraint) {
	if res.GetMemoryMb() < 0 {
		e.Add(f+".resources.memory_mb", "must not be negative, got %d", res.GetMemoryMb())
	}
	if res.GetDiskMb() < 0 {
		e.Add(f+".resources.disk_mb", "must not be negative, got %d", res.GetDiskMb())
	}
	e.Merge(f+".rootfs", models.ValidateRootfs(f+".rootfs", rootfs))
	e.Merge(f+".placement_constraint", models.ValidatePlacementConstraint(f+".placement_constraint", pc))
}
