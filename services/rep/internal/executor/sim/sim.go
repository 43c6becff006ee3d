// Package sim is the simulated executor backend, registered as "sim": containers become
// healthy after Options.SimStartLatency, are routable at once, get fake host ports from the
// port range (no socket is opened), and LRPs crash with probability Options.SimCrashRate per
// second. Tasks succeed after the latency with Output "sim". A running container writes a
// synthetic line to its log sink every Options.SimLogInterval. A container is timers and no
// goroutine of its own, so one process can host tens of thousands of them.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// Name is the name the backend is registered under.
const Name = "sim"

// Reasons a simulated container ends with.
const (
	// ReasonCrash is the Result reason of a simulated crash.
	ReasonCrash = "simulated crash"
	// ReasonStopped is the Result reason of a container stopped by Stop.
	ReasonStopped = "stopped"
	// ReasonStartTimeout is the Result reason of an LRP whose start latency exceeds its
	// start timeout.
	ReasonStartTimeout = "start timeout: not healthy within the start timeout"
	// TaskOutput is the Output of every simulated task.
	TaskOutput = "sim"
)

func init() {
	executor.Register(Name, func(o executor.Options) (executor.Backend, error) { return New(o) })
}

// Backend runs simulated containers.
type Backend struct {
	opts executor.Options

	mu    sync.Mutex
	ports *portPool
}

var _ executor.Backend = (*Backend)(nil)

// New builds a simulated backend. The port range must be valid when containers have ports.
func New(o executor.Options) (*Backend, error) {
	if o.SimStartLatency < 0 {
		return nil, fmt.Errorf("sim backend: start latency %s is negative", o.SimStartLatency)
	}
	if o.SimCrashRate < 0 || o.SimCrashRate > 1 || math.IsNaN(o.SimCrashRate) {
		return nil, fmt.Errorf("sim backend: crash rate %v must be between 0 and 1", o.SimCrashRate)
	}
	if o.PortRangeStart != 0 || o.PortRangeEnd != 0 {
		if o.PortRangeStart < 1 || o.PortRangeEnd > 65535 || o.PortRangeStart > o.PortRangeEnd {
			return nil, fmt.Errorf("sim backend: invalid port range %d-%d", o.PortRangeStart, o.PortRangeEnd)
		}
	}
	return &Backend{opts: o, ports: newPortPool(o.PortRangeStart, o.PortRangeEnd)}, nil
}

// Isolation is none: nothing runs.
func (b *Backend) Isolation() executor.Isolation { return executor.Isolation{Kind: "sim"} }

// Notes says the containers are simulated.
func (b *Backend) Notes() []string {
	return []string{"sim backend: containers are simulated; nothing runs and no port is opened"}
}

// Start creates a simulated container; it fails only when the port range is exhausted.
func (b *Backend) Start(_ context.Context, spec executor.Spec) (executor.Container, error) {
	net := &modelsv1.ActualLRPNetInfo{Address: b.opts.CellAddress, InstanceAddress: b.opts.CellAddress}
	b.mu.Lock()
	hostPorts, err := b.ports.take(len(spec.Ports))
	b.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("sim container %s: %w", spec.Guid, err)
	}
	for i, p := range spec.Ports {
		net.Ports = append(net.Ports, &modelsv1.PortMapping{ContainerPort: p, HostPort: uint32(hostPorts[i])})
	}
	c := &container{
		guid:     spec.Guid,
		net:      net,
		healthy:  make(chan struct{}),
		routable: make(chan bool, 1),
		done:     make(chan struct{}),
		usage:    newSimUsage(spec),
		release: func() {
			b.mu.Lock()
			b.ports.give(hostPorts)
			b.mu.Unlock()
		},
	}
	c.begin(spec, b.opts)
	return c, nil
}

// container is one simulated container. Its life is timers (the start latency, then a crash
// and the log lines), each step taken under mu and only while the container has not ended.
type container struct {
	guid     string
	net      *modelsv1.ActualLRPNetInfo
	healthy  chan struct{}
	routable chan bool
	done     chan struct{}
	release  func()
	usage    simUsage
	result   executor.Result // written before done is closed

	mu     sync.Mutex
	ended  bool
	timers []*time.Timer // the start latency's, then the crash's and the log lines'
}

var _ executor.Container = (*container)(nil)

// FilesPath implements executor.Container: simulated containers keep no files.
func (c *container) FilesPath() (root, dir string) { return "", "" }

// Signal implements executor.Container: simulated containers have no processes to signal.
func (c *container) Signal(syscall.Signal) error { return nil }

// Guid is the spec's guid.
func (c *container) Guid() string { return c.guid }

// NetInfo is the cell address and the fake host ports.
func (c *container) NetInfo() *modelsv1.ActualLRPNetInfo { return c.net }

// Healthy is closed after the start latency.
func (c *container) Healthy() <-chan struct{} { return c.healthy }

// Routable sends true once healthy and is closed when done.
func (c *container) Routable() <-chan bool { return c.routable }

// Done is closed when the container ended.
func (c *container) Done() <-chan struct{} { return c.done }

// Result is how the container ended; valid once Done is closed.
func (c *container) Result() executor.Result { return c.result }

// Stop ends the container at once (nothing runs, so there is no grace to give) and waits for
// Done.
func (c *container) Stop(time.Duration) {
	c.finish(true, ReasonStopped, "")
	<-c.done
}

// finish ends the container with its result, unless it has ended already.
func (c *container) finish(failed bool, reason, out string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.finishLocked(failed, reason, out)
}

// finishLocked ends the container with its result, unless it has ended already; the caller
// holds c.mu.
func (c *container) finishLocked(failed bool, reason, out string) {
	if c.ended {
		return
	}
	c.ended = true
	for _, t := range c.timers {
		t.Stop()
	}
	c.end(executor.Result{Failed: failed, Reason: reason, Output: out})
}

// end records the result, frees the ports and closes Routable and Done.
func (c *container) end(r executor.Result) {
	c.result = r
	c.release()
	close(c.routable)
	close(c.done)
}

// step runs fn under c.mu if the container has not ended.
func (c *container) step(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended {
		fn()
	}
}

// begin plays the container's life: start latency (bounded by the start timeout), then for an
// LRP healthy and routable until a simulated crash or Stop, with a log line every log
// interval; for a task success.
func (c *container) begin(spec executor.Spec, o executor.Options) {
	latency := o.SimStartLatency
	timedOut := spec.Kind == executor.KindLRP && spec.StartTimeout > 0 && latency > spec.StartTimeout
	if timedOut {
		latency = spec.StartTimeout
	}
	logLine := func(n int) {
		if spec.Log != nil {
			spec.Log.Line("", "stdout", fmt.Sprintf("sim: %s index %d line %d", spec.Guid, spec.Index, n))
		}
	}
	started := func() {
		switch {
		case timedOut:
			c.finishLocked(true, ReasonStartTimeout, "")
		case spec.Kind == executor.KindTask:
			logLine(1)
			c.finishLocked(false, "", TaskOutput)
		default:
			c.routable <- true
			close(c.healthy)
			if d, ok := timeToCrash(o.SimCrashRate); ok {
				c.timers = append(c.timers, time.AfterFunc(d, func() { c.finish(true, ReasonCrash, "") }))
			}
			if spec.Log != nil && o.SimLogInterval > 0 {
				n := 0
				var tick *time.Timer
				tick = time.AfterFunc(o.SimLogInterval, func() {
					c.step(func() {
						n++
						logLine(n)
						tick.Reset(o.SimLogInterval)
					})
				})
				c.timers = append(c.timers, tick)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timers = append(c.timers, time.AfterFunc(latency, func() { c.step(started) }))
}

// timeToCrash draws when a container crashing with probability p per second crashes: the
// waiting time of a Poisson process with rate -ln(1-p) per second. It reports false when it
// never crashes.
func timeToCrash(p float64) (time.Duration, bool) {
	switch {
	case p <= 0:
		return 0, false
	case p >= 1:
		return time.Duration(rand.Int64N(int64(time.Second))), true
	}
	rate := -math.Log1p(-p) // crashes per second
	secs := rand.ExpFloat64() / rate
	const maxWait = 100 * 365 * 24 * time.Hour
	if secs > maxWait.Seconds() {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}

// errNoPorts says the port range is used up.
var errNoPorts = errors.New("no free host port in the port range")

// portPool hands out fake host ports from an inclusive range, lowest free first after a moving
// cursor, so recently freed ports are reused last.
type portPool struct {
	start, end int
	used       map[int]bool
	next       int
}

func newPortPool(start, end int) *portPool {
	return &portPool{start: start, end: end, used: map[int]bool{}, next: start}
}

// take reserves n ports or none.
func (p *portPool) take(n int) ([]int, error) {
	if n == 0 {
		return nil, nil
	}
	size := p.end - p.start + 1
	if p.start == 0 || size-len(p.used) < n {
		return nil, fmt.Errorf("%w %d-%d", errNoPorts, p.start, p.end)
	}
	out := make([]int, 0, n)
	for i := 0; i < size && len(out) < n; i++ {
		port := p.next
		p.next++
		if p.next > p.end {
			p.next = p.start
		}
		if !p.used[port] {
			p.used[port] = true
			out = append(out, port)
		}
	}
	return out, nil
}

// give frees ports.
func (p *portPool) give(ports []int) {
	for _, port := range ports {
		delete(p.used, port)
	}
}
