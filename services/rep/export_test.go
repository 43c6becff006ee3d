package rep

import (
	"context"
	"os"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// BackendOptions exposes backendOptions to the package's tests.
func BackendOptions(c Config) executor.Options { return backendOptions(c) }

// Draining is svc run as ServeUntilSignal runs it, with drain standing in for SIGTERM and
// SIGUSR1 and the context's end for SIGINT.
func Draining(svc *Service, drain <-chan os.Signal) interface {
	Run(ctx context.Context, ready func()) error
} {
	return draining{Service: svc, drain: drain}
}
