// Package peers holds the BBS's clients of other services: the auctioneer, which places new
// work, and the reps, which stop instances and cancel tasks on their cells.
package peers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/authz"
	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/reppool"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
)

// Auctioneer sends start requests to the auctioneer, coalescing the requests of a short window
// into one RPC. It implements core.Auctioneer.
//
// Several auctioneers may run, only the elected leader places work; a standby answers
// FailedPrecondition "not the leader". The client knows every auctioneer address and follows
// the leader: each flush starts with the address that last accepted work and, when that one
// refuses or cannot be reached, tries the others in turn. Work that no address accepts is
// dropped with a warning; its instances stay UNCLAIMED (tasks PENDING) for convergence to
// re-auction.
type Auctioneer struct {
	targets []auctioneerTarget
	conns   []*grpc.ClientConn // dialled by DialAuctioneers; closed by Close
	log     hclog.Logger
	window  time.Duration
	attempt time.Duration // bound of one call to one address

	last int // index in targets of the address that last accepted work; used by Run only

	failed core.AuctionObserver // counts the instances and tasks no auctioneer took; may be nil

	mu      sync.Mutex
	lrps    []*auctioneerv1.LRPStartRequest
	tasks   []*auctioneerv1.TaskStartRequest
	pending chan struct{}
}

// auctioneerTarget is one auctioneer instance.
type auctioneerTarget struct {
	address string
	client  auctioneerv1.AuctioneerServiceClient
}

var _ core.Auctioneer = (*Auctioneer)(nil)

// attemptTimeout bounds one call to one auctioneer, so a hung instance does not hold the
// others' turn for long.
const attemptTimeout = 3 * time.Second

// NewAuctioneer returns a client over conn (one auctioneer, or a connection that balances
// itself) that flushes requests every window.
func NewAuctioneer(conn grpc.ClientConnInterface, window time.Duration, logger hclog.Logger) *Auctioneer {
	return newAuctioneer([]auctioneerTarget{{address: "auctioneer", client: auctioneerv1.NewAuctioneerServiceClient(conn)}}, window, logger)
}

// DialAuctioneers returns a client of every auctioneer in addresses (each entry may hold
// several comma-separated addresses), dialled with cfg, that flushes requests every window
// to the leader among them. Close closes the connections.
func DialAuctioneers(addresses []string, cfg grpcx.ClientConfig, window time.Duration, logger hclog.Logger) (*Auctioneer, error) {
	addrs := grpcx.SplitTargets(addresses...)
	if len(addrs) == 0 {
		return nil, errors.New("no auctioneer address")
	}
	var targets []auctioneerTarget
	var conns []*grpc.ClientConn
	for _, addr := range addrs {
		conn, err := grpcx.Dial(addr, cfg)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("dial auctioneer %s: %w", addr, err)
		}
		conns = append(conns, conn)
		targets = append(targets, auctioneerTarget{address: addr, client: auctioneerv1.NewAuctioneerServiceClient(conn)})
	}
	a := newAuctioneer(targets, window, logger)
	a.conns = conns
	return a, nil
}

func newAuctioneer(targets []auctioneerTarget, window time.Duration, logger hclog.Logger) *Auctioneer {
	return &Auctioneer{
		targets: targets,
		log:     logger,
		window:  window,
		attempt: attemptTimeout,
		pending: make(chan struct{}, 1),
	}
}

// CountFailures makes the client count, on obs, the instances and tasks of every request that
// no auctioneer accepted (the BBS's gavel_bbs_auctions_failed_total). Call it before Run.
func (a *Auctioneer) CountFailures(obs core.AuctionObserver) { a.failed = obs }

func (a *Auctioneer) countFailed(kind string, n int) {
	if a.failed != nil {
		a.failed.AuctionFailed(kind, n)
	}
}

// Close closes the connections DialAuctioneers made (none for NewAuctioneer).
func (a *Auctioneer) Close() error {
	var errs []error
	for _, c := range a.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// RequestLRPAuctions queues instances for placement; they are sent within one window, each
// carrying ctx's trace context.
func (a *Auctioneer) RequestLRPAuctions(ctx context.Context, starts []core.LRPStart) error {
	tc := tracing.Carry(ctx)
	a.mu.Lock()
	for _, s := range starts {
		if len(s.Indices) == 0 {
			continue
		}
		si := s.SchedulingInfo
		a.lrps = append(a.lrps, &auctioneerv1.LRPStartRequest{
			ProcessGuid:         si.GetProcessGuid(),
			Domain:              si.GetDomain(),
			Indices:             s.Indices,
			Resources:           si.GetResources(),
			Rootfs:              si.GetRootfs(),
			PlacementConstraint: si.GetPlacementConstraint(),
			Trace:               tc,
			SpreadPeer:          spreadPeer(s.Peer),
		})
	}
	a.mu.Unlock()
	a.kick()
	return nil
}

// spreadPeer is the start request's form of a resolved spread peer (nil for none).
func spreadPeer(p *core.SpreadPeer) *auctioneerv1.SpreadPeer {
	if p == nil {
		return nil
	}
	return &auctioneerv1.SpreadPeer{ProcessGuid: p.ProcessGuid, BelowIndex: p.BelowIndex, CellInstances: p.CellInstances}
}

// RequestTaskAuctions queues tasks for placement; they are sent within one window, each
// carrying ctx's trace context.
func (a *Auctioneer) RequestTaskAuctions(ctx context.Context, tasks []*modelsv1.Task) error {
	tc := tracing.Carry(ctx)
	a.mu.Lock()
	for _, t := range tasks {
		def := t.GetDefinition()
		a.tasks = append(a.tasks, &auctioneerv1.TaskStartRequest{
			TaskGuid:            t.GetTaskGuid(),
			Domain:              t.GetDomain(),
			Resources:           &modelsv1.Resources{MemoryMb: def.GetMemoryMb(), DiskMb: def.GetDiskMb(), MaxPids: def.GetMaxPids()},
			Rootfs:              def.GetRootfs(),
			PlacementConstraint: def.GetPlacementConstraint(),
			Trace:               tc,
		})
	}
	a.mu.Unlock()
	a.kick()
	return nil
}

func (a *Auctioneer) kick() {
	select {
	case a.pending <- struct{}{}:
	default:
	}
}

// Run flushes queued requests until ctx ends. Requests that cannot be delivered are dropped
// with a warning: their instances stay UNCLAIMED (tasks PENDING) for convergence to re-auction.
func (a *Auctioneer) Run(ctx context.Context, ready func()) error {
	ready()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.pending:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(a.window):
		}
		a.mu.Lock()
		lrps, tasks := a.lrps, a.tasks
		a.lrps, a.tasks = nil, nil
		a.mu.Unlock()
		a.flush(ctx, lrps, tasks)
	}
}

func (a *Auctioneer) flush(ctx context.Context, lrps []*auctioneerv1.LRPStartRequest, tasks []*auctioneerv1.TaskStartRequest) {
	if len(lrps) > 0 {
		err := a.send(ctx, func(ctx context.Context, c auctioneerv1.AuctioneerServiceClient) error {
			_, err := c.RequestLRPAuctions(ctx, &auctioneerv1.RequestLRPAuctionsRequest{Starts: lrps})
			return err
		})
		if err != nil {
			n := 0
			for _, s := range lrps {
				n += len(s.GetIndices())
			}
			a.countFailed("lrp", n)
			a.log.Warn("no auctioneer took the lrp starts; convergence will re-auction them", "starts", len(lrps), "instances", n, "error", err)
		}
	}
	if len(tasks) > 0 {
		err := a.send(ctx, func(ctx context.Context, c auctioneerv1.AuctioneerServiceClient) error {
			_, err := c.RequestTaskAuctions(ctx, &auctioneerv1.RequestTaskAuctionsRequest{Tasks: tasks})
			return err
		})
		if err != nil {
			a.countFailed("task", len(tasks))
			a.log.Warn("no auctioneer took the task starts; convergence will re-auction them", "tasks", len(tasks), "error", err)
		}
	}
}

// send calls each auctioneer in turn, starting with the one that last accepted work, until one
// accepts; it remembers that one. A request the auctioneer finds invalid is not offered to
// the others. It returns the errors of every address when none accepted.
func (a *Auctioneer) send(ctx context.Context, call func(context.Context, auctioneerv1.AuctioneerServiceClient) error) error {
	var errs []error
	for i := range a.targets {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		n := (a.last + i) % len(a.targets)
		t := a.targets[n]
		cctx, cancel := context.WithTimeout(ctx, a.attempt)
		err := call(cctx, t.client)
		cancel()
		if err == nil {
			if n != a.last {
				a.log.Info("following the auctioneer leader", "address", t.address)
			}
			a.last = n
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", t.address, err))
		if status.Code(err) == codes.InvalidArgument {
			break
		}
		a.log.Debug("auctioneer did not take the work, trying the next", "address", t.address, "error", err)
	}
	return errors.Join(errs...)
}

// Reps reaches the rep of a cell at the address it registered, over a shared rep connection
// pool. It implements core.CellClient.
type Reps struct {
	pool *reppool.Pool
}

var _ core.CellClient = (*Reps)(nil)

// NewReps returns a rep client over pool.
func NewReps(pool *reppool.Pool) *Reps {
	return &Reps{pool: pool}
}

// StopLRPInstance asks a cell's rep to stop an instance.
func (r *Reps) StopLRPInstance(ctx context.Context, cell *modelsv1.CellPresence, key *modelsv1.ActualLRPKey, instance *modelsv1.ActualLRPInstanceKey) error {
	c, err := r.pool.Presence(cell)
	if err != nil {
		return err
	}
	_, err = c.StopLRPInstance(ctx, &repv1.StopLRPInstanceRequest{Key: key, InstanceKey: instance})
	return err
}

// CancelTask asks a cell's rep to stop a task's container.
func (r *Reps) CancelTask(ctx context.Context, cell *modelsv1.CellPresence, guid string) error {
	c, err := r.pool.Presence(cell)
	if err != nil {
		return err
	}
	_, err = c.CancelTask(ctx, &repv1.CancelTaskRequest{TaskGuid: guid})
	return err
}

// StreamLogs opens a cell's log stream (its rep's StreamLogs).
func (r *Reps) StreamLogs(ctx context.Context, cell *modelsv1.CellPresence, req *repv1.StreamLogsRequest) (grpc.ServerStreamingClient[repv1.StreamLogsResponse], error) {
	c, err := r.pool.Presence(cell)
	if err != nil {
		return nil, err
	}
	return c.StreamLogs(authz.OnBehalfOf(ctx), req) // the rep checks the user's role again
}

// InstanceMetrics asks a cell's rep for its containers' latest resource samples.
func (r *Reps) InstanceMetrics(ctx context.Context, cell *modelsv1.CellPresence, req *repv1.InstanceMetricsRequest) (*repv1.InstanceMetricsResponse, error) {
	c, err := r.pool.Presence(cell)
	if err != nil {
		return nil, err
	}
	return c.InstanceMetrics(authz.OnBehalfOf(ctx), req)
}

// Exec opens an exec stream to a cell's rep.
func (r *Reps) Exec(ctx context.Context, cell *modelsv1.CellPresence) (grpc.BidiStreamingClient[repv1.ExecRequest, repv1.ExecResponse], error) {
	c, err := r.pool.Presence(cell)
	if err != nil {
		return nil, err
	}
	return c.Exec(authz.OnBehalfOf(ctx))
}
