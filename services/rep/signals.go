package rep

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/gavel-sched/gavel/pkg/servicemain"
)

// ServeUntilSignal runs the rep as its command does, logging "rep serving" once it is ready,
// until a signal stops it. SIGINT stops it at once. SIGTERM (what process supervisors and
// container runtimes send) and SIGUSR1 drain the cell first: the presence stays registered
// while the instances are handed over (Evacuate, at most evacuation_timeout), and is revoked
// when Run returns. A second SIGTERM or SIGUSR1 during the evacuation stops it at once.
func (s *Service) ServeUntilSignal() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	drain := make(chan os.Signal, 2)
	signal.Notify(drain, syscall.SIGTERM, syscall.SIGUSR1)
	defer signal.Stop(drain)
	return servicemain.Serve(ctx, s.log, "rep", draining{Service: s, drain: drain},
		"advertise_address", s.AdvertiseAddress(), "backend", s.cfg.Backend)
}

// draining is the rep run with runDraining over drain (a servicemain.Service).
type draining struct {
	*Service
	drain <-chan os.Signal
}

// Run implements servicemain.Service.
func (d draining) Run(ctx context.Context, ready func()) error {
	return d.runDraining(ctx, d.drain, ready)
}

// runDraining is Run until ctx ends, with the drain signals of drain: the first evacuates the
// cell and then stops the rep; a second one during the evacuation stops it at once. It returns
// once Run has returned and the evacuation it started has ended.
func (s *Service) runDraining(ctx context.Context, drain <-chan os.Signal, ready func()) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, stop := context.WithCancel(ctx)
	defer stop() // before wg.Wait: ends the signal watcher
	wg.Go(func() {
		select {
		case sig := <-drain:
			s.evacuateThenStop(ctx, stop, sig, drain)
		case <-ctx.Done():
		}
	})
	return s.Run(ctx, ready)
}

// evacuateThenStop evacuates the cell after sig and then calls stop; a further signal on drain
// calls stop at once.
func (s *Service) evacuateThenStop(ctx context.Context, stop func(), sig os.Signal, drain <-chan os.Signal) {
	defer stop()
	s.log.Info("evacuating, then exiting", "signal", sig.String(), "timeout", s.cfg.EvacuationTimeout.String())
	evacCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Evacuate(evacCtx) }()
	select {
	case sig := <-drain:
		s.log.Warn("stopping before the evacuation is over", "signal", sig.String())
		stop()
		<-done
	case err := <-done:
		if err != nil {
			s.log.Error("evacuation did not finish", "error", err)
		}
	}
}
