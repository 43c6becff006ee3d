// Package lifecycle runs a process's components as an ordered group, in the
// manner of Diego's ordered grouper: members start one after another, each
// waiting for the previous one to be ready, and stop in reverse order.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// Runner is a long-running component.
type Runner interface {
	// Run blocks until ctx is cancelled or the component fails. It calls
	// ready once it is serving. It should return nil when stopped by ctx.
	Run(ctx context.Context, ready func()) error
}

// RunFunc adapts a function to a Runner.
type RunFunc func(ctx context.Context, ready func()) error

// Run calls f(ctx, ready).
func (f RunFunc) Run(ctx context.Context, ready func()) error { return f(ctx, ready) }

// Member is a named Runner in a group.
type Member struct {
	// Name identifies the member in logs and errors.
	Name string
	// Runner is the component itself.
	Runner Runner
}

// member is the state of a started Member.
type member struct {
	Member
	cancel context.CancelFunc
	ready  chan struct{} // closed by the first call to ready()
	done   chan struct{} // closed when Run has returned
	err    error         // Run's result; read only after done is closed
}

// Run starts members in order, each with its own context (carrying ctx's
// values but not its cancellation), and waits for each one to call ready
// before starting the next. If a member returns before it is ready, or ctx
// is done during start-up, the members already started are stopped in
// reverse order.
//
// Once all are ready, Run waits until ctx is done or any member returns
// (with an error or nil), then stops the remaining members in reverse order:
// it cancels one member's context and waits for it to return before
// cancelling the previous one.
//
// Run returns the first member error, wrapped with the member's name. A stop
// initiated by ctx, or by a member returning nil, is clean and returns nil;
// errors satisfying errors.Is(err, context.Canceled) returned while stopping
// count as clean too. A member that returns nil before calling ready makes
// Run return an error.
func Run(ctx context.Context, logger hclog.Logger, members ...Member) error {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if err := checkRunners(members); err != nil {
		return err
	}

	// exited receives the index of each member as it returns.
	exited := make(chan int, len(members))
	started := make([]*member, 0, len(members))
	var firstErr error

	for i, m := range members {
		if ctx.Err() != nil {
			logger.Info("context done during start-up", "not_started", m.Name)
			return stop(logger, started, nil)
		}
		st := start(ctx, logger, i, m, exited)
		started = append(started, st)
		failed := false
		waiting := true
		for waiting {
			select {
			case <-st.ready:
				logger.Info("member ready", "member", m.Name)
				waiting = false
			case j := <-exited:
				e := started[j]
				if j == i {
					logger.Error("member exited before becoming ready", "member", e.Name, "error", e.err)
				} else {
					logger.Error("member exited during start-up", "member", e.Name, "error", e.err)
				}
				firstErr = exitError(e.Name, e.err, j == i)
				failed, waiting = true, false
			case <-ctx.Done():
				logger.Info("context done during start-up", "waiting_for", m.Name)
				failed, waiting = true, false
			}
		}
		if failed {
			return stop(logger, started, firstErr)
		}
	}

	select {
	case <-ctx.Done():
		logger.Info("context done, stopping group")
	case j := <-exited:
		e := started[j]
		if e.err != nil {
			logger.Error("member failed, stopping group", "member", e.Name, "error", e.err)
		} else {
			logger.Info("member exited, stopping group", "member", e.Name)
		}
		firstErr = exitError(e.Name, e.err, false)
	}
	return stop(logger, started, firstErr)
}

// start launches m in its own goroutine.
func start(ctx context.Context, logger hclog.Logger, i int, m Member, exited chan<- int) *member {
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	st := &member{
		Member: m,
		cancel: cancel,
		ready:  make(chan struct{}),
		done:   make(chan struct{}),
	}
	var once sync.Once
	ready := func() { once.Do(func() { close(st.ready) }) }
	logger.Info("starting member", "member", m.Name)
	go func() {
		defer func() {
			close(st.done)
			exited <- i
		}()
		st.err = m.Runner.Run(mctx, ready)
	}()
	return st
}

// checkRunners reports the first member without a runner.
func checkRunners(members []Member) error {
	for i, m := range members {
		if m.Runner == nil {
			return fmt.Errorf("lifecycle: member %d (%q) has no runner", i, m.Name)
		}
	}
	return nil
}

// exitError is the group error caused by member name exiting on its own with err: nil for a
// clean exit after it was ready.
func exitError(name string, err error, beforeReady bool) error {
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", name, err)
	case beforeReady:
		return fmt.Errorf("%s: exited before becoming ready", name)
	default:
		return nil
	}
}

// stop cancels the started members in reverse order, waiting for each to
// return before cancelling the previous one, and returns firstErr or else the
// first error returned while stopping.
func stop(logger hclog.Logger, started []*member, firstErr error) error {
	for i := len(started) - 1; i >= 0; i-- {
		m := started[i]
		exitedAlready := false
		select {
		case <-m.done:
			exitedAlready = true
		default:
			logger.Info("stopping member", "member", m.Name)
		}
		m.cancel()
		<-m.done
		if m.err != nil && !errors.Is(m.err, context.Canceled) {
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", m.Name, m.err)
			}
			if !exitedAlready {
				logger.Error("member stopped with error", "member", m.Name, "error", m.err)
			}
			continue
		}
		if !exitedAlready {
			logger.Info("member stopped", "member", m.Name)
		}
	}
	return firstErr
}

// SignalContext returns a context that is cancelled on SIGINT or SIGTERM, or
// when the returned cancel function is called (which also stops listening
// for the signals).
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}
