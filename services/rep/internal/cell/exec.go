package cell

import (
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// ExecTarget returns the running container of instance processGuid/index (its instance guid
// and its backend container) for a command to run in: NotFound when the cell holds no such
// instance, FailedPrecondition when it is not running or its backend cannot run commands in
// it.
func (c *Cell) ExecTarget(processGuid string, index int32) (string, executor.Execer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var held *container
	for _, ctr := range c.containers {
		if ctr.kind != executor.KindLRP || ctr.key.GetProcessGuid() != processGuid || ctr.key.GetIndex() != index {
			continue
		}
		held = ctr
		if ctr.phase == phaseRunning && !ctr.stopping {
			e, ok := ctr.exec.(executor.Execer)
			if !ok {
				return "", nil, rpcerr.FailedPrecondition("instance %s/%d: the %s backend cannot run commands in its containers", processGuid, index, c.backend.Isolation().Kind)
			}
			return ctr.guid, e, nil
		}
	}
	if held == nil {
		return "", nil, rpcerr.NotFound("instance %s/%d is not on this cell", processGuid, index)
	}
	return "", nil, rpcerr.FailedPrecondition("instance %s/%d is not running (it is %s)", processGuid, index, held.phase)
}
