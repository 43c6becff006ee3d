// Package servicemain holds the wiring every service's main repeats, so that each main stays a
// wiring script (config → logger → clients → components → ordered run group): the -config flag,
// parsing the file and then the flags, validation, the exit on error, and running one service
// until a signal.
package servicemain

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// CPUProfileEnv names the environment variable that, set to a file path, makes Main write a
// CPU profile of the service's whole run there (written when the service stops cleanly, e.g. on
// SIGINT). The scale harness sets it for each process it profiles (make bench-scale
// ARGS='-profile-dir DIR').
const CPUProfileEnv = "GAVEL_CPU_PROFILE"

// HeapProfileEnv names the environment variable that, set to a file path, makes Main write a
// heap profile there when the service stops cleanly: what the heap held at the last collection
// (inuse) and everything the run allocated (alloc). The scale harness sets it beside
// CPUProfileEnv.
const HeapProfileEnv = "GAVEL_HEAP_PROFILE"

// Main runs run on the process arguments; when it fails, Main prints "name: error" on stderr and
// exits with status 1. With CPUProfileEnv or HeapProfileEnv set it profiles the run.
func Main(name string, run func(args []string) error) {
	stop, err := startCPUProfile(os.Getenv(CPUProfileEnv))
	if err == nil {
		err = run(os.Args[1:])
		stop()
		if herr := writeHeapProfile(os.Getenv(HeapProfileEnv)); err == nil {
			err = herr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// startCPUProfile starts a CPU profile into path (nothing when path is empty) and returns the
// function that ends it.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CPUProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", CPUProfileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// writeHeapProfile writes the heap profile into path (nothing when path is empty).
func writeHeapProfile(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("%s: %w", HeapProfileEnv, err)
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return fmt.Errorf("%s: %w", HeapProfileEnv, err)
	}
	return f.Close()
}

// NewFlagSet returns the flag set of the service name with -config already declared: a JSON
// config file (described in services/name/README.md) that the flags override.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.String("config", "", fmt.Sprintf("JSON config file (see services/%s/README.md); flags override it", name))
	return fs
}

// Config is what a service's configuration offers its main.
type Config interface {
	// LoadFile reads a JSON config file over the configuration.
	LoadFile(path string) error
	// Validate reports what is wrong with the configuration.
	Validate() error
}

// Parse reads the file named by -config and then the flags in args into cfg (so flags override
// the file), and validates cfg.
func Parse(fs *flag.FlagSet, args []string, cfg Config) error {
	if err := config.Parse(fs, args, "config", cfg.LoadFile); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return nil
}

// Service is a gRPC service as its main runs it.
type Service interface {
	// Run serves until ctx ends, calling ready once it listens.
	Run(ctx context.Context, ready func()) error
	// Addr is the bound listen address (valid once ready).
	Addr() net.Addr
}

// Serve runs svc as the only member of a run group until ctx ends. Once svc is ready it logs
// "NAME serving" with the bound address and fields (key, value, ...).
func Serve(ctx context.Context, logger hclog.Logger, name string, svc Service, fields ...any) error {
	return lifecycle.Run(ctx, logger, lifecycle.Member{Name: name, Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
		return svc.Run(ctx, func() {
			logger.Info(name+" serving", append([]any{"address", svc.Addr().String()}, fields...)...)
			ready()
		})
	})})
}

// ServeUntilSignal is Serve until SIGINT or SIGTERM (lifecycle.SignalContext).
func ServeUntilSignal(logger hclog.Logger, name string, svc Service, fields ...any) error {
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	return Serve(ctx, logger, name, svc, fields...)
}

// StartTracing installs the tracer provider of service name (tracing.Start) and returns the
// function that flushes its spans at exit: a main calls it once its logger exists, and defers
// the stop.
func StartTracing(logger hclog.Logger, name string, c tracing.Config) (stop func(), err error) {
	shutdown, err := tracing.Start(context.Background(), name, c)
	if err != nil {
		return nil, err
	}
	if c.OTLPEndpoint != "" {
		logger.Info("tracing on", "otlp_endpoint", c.OTLPEndpoint, "sampling_ratio", c.SamplingRatio)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			logger.Warn("could not flush the last spans", "error", err)
		}
	}, nil
}
