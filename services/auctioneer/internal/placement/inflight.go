package placement

import (
	"fmt"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// InFlight is the optional limit on containers starting at once across all cells. Starting
// counts the containers the cells report as starting plus those placed this round.
type InFlight struct {
	// Limit is the most containers that may be starting; zero means unlimited.
	Limit int
	// Starting is how many are starting now.
	Starting int
}

// Admit reports an IN_FLIGHT_LIMIT failure when no more containers may start.
func (f *InFlight) Admit() *Failure {
	if f.Limit <= 0 || f.Starting < f.Limit {
		return nil
	}
	return &Failure{
		Code:    modelsv1.PlacementError_CODE_IN_FLIGHT_LIMIT,
		Message: fmt.Sprintf("in-flight limit reached: %d containers starting (limit %d)", f.Starting, f.Limit),
	}
}

// Add counts n more starting containers (negative to uncount).
func (f *InFlight) Add(n int) { f.Starting += n }
