package rep

import (
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	_ "github.com/gavel-sched/gavel/services/rep/internal/executor/oci"     // registers "oci"
	_ "github.com/gavel-sched/gavel/services/rep/internal/executor/process" // registers "process"
	_ "github.com/gavel-sched/gavel/services/rep/internal/executor/sim"     // registers "sim"
)

// newBackend builds the executor backend the configuration names ("process", "oci" or "sim"), with
// the options derived from it. Every backend is registered here, in one place.
func newBackend(c Config) (executor.Backend, error) {
	return executor.New(c.Backend, backendOptions(c))
}
