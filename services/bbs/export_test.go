package bbs

import "github.com/gavel-sched/gavel/services/bbs/internal/converge"

// Converger is the BBS's convergence, for the package's tests to run a pass directly (see
// WithManualConvergence). Test-only: the exported API names no internal type.
func (s *Service) Converger() *converge.Converger { return s.converger }
