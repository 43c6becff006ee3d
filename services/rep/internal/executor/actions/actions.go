// Package actions interprets a container's action tree (serial, parallel, codependent, try,
// timeout) for every executor backend. A backend supplies only the leaf steps (Steps): running
// a RunAction's process and fetching a DownloadAction, in its own way (a host process, a
// process exec'd in an OCI container); the tree's semantics are here, once.
package actions

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor/checks"
)

// MonitorActionTimeout bounds one run of a legacy monitor action used as a health probe.
const MonitorActionTimeout = 10 * time.Second

// ErrCodependentExit is the cause of a codependent action's context once one of its children
// exited: the leaf steps of the others stop their processes (SIGTERM, then SIGKILL after the
// backend's kill grace).
var ErrCodependentExit = errors.New("a codependent action exited")

// TimeoutError is the cause of a timeout action's context, and its failure, when its child ran
// longer than D.
type TimeoutError struct {
	// D is the timeout action's limit.
	D time.Duration
}

// Error is "timed out after D".
func (e TimeoutError) Error() string { return fmt.Sprintf("timed out after %v", e.D) }

// Steps are the leaf steps of an action tree a backend runs. Each returns the step's failure
// (its text is the reason reported in the container's result). When ctx ends, Run stops its
// process: SIGTERM, then SIGKILL after the backend's kill grace — unless the context's cause
// is the backend's own stop, which signals the processes itself.
type Steps interface {
	// Run runs ra's process to its end.
	Run(ctx context.Context, ra *modelsv1.RunAction) error
	// Download fetches d into the container.
	Download(ctx context.Context, d *modelsv1.DownloadAction) error
}

// Interpreter runs action trees with its Steps.
type Interpreter struct {
	// Steps are the backend's leaf steps.
	Steps Steps
	// Log receives the ignored failures of try actions (hclog.NewNullLogger when nil).
	Log hclog.Logger
}

// Run runs the tree a and returns its failure, if any: a serial action stops at its first
// failing child; a parallel action runs its children at once and fails with the first failure
// in order; a codependent action runs them at once and stops the others when the first ends,
// failing with that one's failure; a try action ignores its child's failure (not a stop); a
// timeout action fails with TimeoutError when its child runs longer than timeout_ms.
func (in Interpreter) Run(ctx context.Context, a *modelsv1.Action) error {
	if err := context.Cause(ctx); err != nil {
		return err
	}
	switch k := a.GetKind().(type) {
	case *modelsv1.Action_Run:
		return in.Steps.Run(ctx, k.Run)
	case *modelsv1.Action_Download:
		return in.Steps.Download(ctx, k.Download)
	case *modelsv1.Action_Serial:
		for _, child := range k.Serial.GetActions() {
			if err := in.Run(ctx, child); err != nil {
				return err
			}
		}
		return nil
	case *modelsv1.Action_Parallel:
		for _, err := range in.runAll(ctx, k.Parallel.GetActions(), nil) {
			if err != nil {
				return err
			}
		}
		return nil
	case *modelsv1.Action_Codependent:
		return in.runCodependent(ctx, k.Codependent.GetActions())
	case *modelsv1.Action_Try:
		if err := in.Run(ctx, k.Try.GetAction()); err != nil {
			if cause := context.Cause(ctx); cause != nil {
				return cause // a stop is not a failure to ignore
			}
			in.logger().Debug("try action failed; ignored", "reason", err)
		}
		return nil
	case *modelsv1.Action_Timeout:
		d := time.Duration(k.Timeout.GetTimeoutMs()) * time.Millisecond
		if d <= 0 {
			return fmt.Errorf("timeout action: timeout_ms must be positive, got %d", k.Timeout.GetTimeoutMs())
		}
		tctx, cancel := context.WithTimeoutCause(ctx, d, TimeoutError{d})
		defer cancel()
		err := in.Run(tctx, k.Timeout.GetAction())
		var te TimeoutError
		if errors.As(context.Cause(tctx), &te) && ctx.Err() == nil {
			return te
		}
		return err
	default:
		return errors.New("empty action")
	}
}

// Probe is the legacy monitor action a as a health probe: it passes when a succeeds within
// MonitorActionTimeout.
func (in Interpreter) Probe(a *modelsv1.Action) checks.Probe {
	return func(ctx context.Context) bool {
		ctx, cancel := context.WithTimeout(ctx, MonitorActionTimeout)
		defer cancel()
		return in.Run(ctx, a) == nil
	}
}

func (in Interpreter) logger() hclog.Logger {
	if in.Log == nil {
		return hclog.NewNullLogger()
	}
	return in.Log
}

// runAll runs actions at once and returns their errors, by index. When exited is not nil it
// receives the index of each action as it ends.
func (in Interpreter) runAll(ctx context.Context, actions []*modelsv1.Action, exited chan<- int) []error {
	errs := make([]error, len(actions))
	var wg sync.WaitGroup
	for i, a := range actions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = in.Run(ctx, a)
			if exited != nil {
				exited <- i
			}
		}()
	}
	wg.Wait()
	return errs
}

// runCodependent runs actions at once; when the first ends, the others are stopped. It fails
// with the first one's error: the others end because they were stopped, which is not counted
// as their failure.
func (in Interpreter) runCodependent(ctx context.Context, actions []*modelsv1.Action) error {
	if len(actions) == 0 {
		return nil
	}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	exited := make(chan int, len(actions))
	firstCh := make(chan int, 1)
	go func() {
		i := <-exited
		firstCh <- i
		cancel(ErrCodependentExit)
	}()
	errs := in.runAll(cctx, actions, exited)
	first := <-firstCh
	if errs[first] != nil {
		return errs[first]
	}
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	return nil
}
