package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Parallel returns a Runner that runs members side by side, in the manner of Diego's parallel
// grouper, for many members of one kind (a host's cells, a dev cluster's reps) that would take
// minutes to start or stop one after another.
//
// At most maxStarting members start at once (none when maxStarting is 0 or less): each holds
// its start slot until it calls ready or returns. The group calls ready once every member has.
// When ctx ends, every member's context is cancelled at once and Run waits for all of them; it
// returns the first error a member returned while stopping, other than one satisfying
// errors.Is(err, context.Canceled).
//
// Unlike Run's members, a member that returns while ctx is still live is a failure even when
// it returns nil (members of a parallel group are peers, and none of them ends the group's
// work): the others are stopped at once and Run returns that member's error, wrapped with its
// name, or an error saying it stopped.
func Parallel(maxStarting int, members ...Member) Runner {
	return parallel{maxStarting: maxStarting, members: members}
}

// parallel is the Runner Parallel returns.
type parallel struct {
	maxStarting int
	members     []Member
}

// exit is one member's return from a parallel group.
type exit struct {
	i       int
	err     error
	ready   bool // it had called ready
	started bool // it was started at all (the group may stop before its turn)
}

// Run implements Runner.
func (p parallel) Run(ctx context.Context, ready func()) error {
	if err := checkRunners(p.members); err != nil {
		return err
	}
	n := len(p.members)
	if n == 0 {
		ready()
		<-ctx.Done()
		return nil
	}
	limit := p.maxStarting
	if limit <= 0 || limit > n {
		limit = n
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	slots := make(chan struct{}, limit)
	readies := make(chan struct{}, n)
	exits := make(chan exit, n)
	for i, m := range p.members {
		go func() {
			select {
			case slots <- struct{}{}:
			case <-gctx.Done():
				exits <- exit{i: i}
				return
			}
			var release sync.Once
			var isReady atomic.Bool
			err := m.Runner.Run(gctx, func() {
				release.Do(func() {
					isReady.Store(true)
					<-slots
					readies <- struct{}{}
				})
			})
			release.Do(func() { <-slots })
			exits <- exit{i: i, err: err, ready: isReady.Load(), started: true}
		}()
	}

	// gctx ends when ctx does or when a member returns on its own: the group is stopping.
	var firstErr error
	for readied, exited := 0, 0; exited < n; {
		select {
		case <-readies:
			if readied++; readied == n && gctx.Err() == nil {
				ready()
			}
		case e := <-exits:
			exited++
			name := p.members[e.i].Name
			switch {
			case !e.started:
			case gctx.Err() == nil: // returned on its own
				firstErr = memberStopped(name, e.err, !e.ready)
				cancel()
			case e.err != nil && !errors.Is(e.err, context.Canceled) && firstErr == nil:
				firstErr = fmt.Errorf("%s: %w", name, e.err)
			}
		}
	}
	return firstErr
}

// memberStopped is the error of a parallel group's member that returned err on its own: as
// Run's (exitError), and a nil return after ready stops the group with an error too.
func memberStopped(name string, err error, beforeReady bool) error {
	if err := exitError(name, err, beforeReady); err != nil {
		return err
	}
	return fmt.Errorf("%s: stopped", name)
}
