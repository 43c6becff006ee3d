// Package peers holds the BBS's clients of other services: the auctioneer, which places new
// work, and the reps, which stop instances and cancel tasks on their cells.
package peers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
)

// Auctioneer sends start requests to the auctioneer, coalescing the requests of a short window
// into one RPC. It implements core.Auctioneer.
type Auctioneer struct {
	client auctioneerv1.AuctioneerServiceClient
	log    hclog.Logger
	window time.Duration

	mu      sync.Mutex
	lrps    []*auctioneerv1.LRPStartRequest
	tasks   []*auctioneerv1.TaskStartRequest
	pending chan struct{}
}

var _ core.Auctioneer = (*Auctioneer)(nil)

// NewAuctioneer returns a client over conn that flushes requests every window.
func NewAuctioneer(conn grpc.ClientConnInterface, window time.Duration, logger hclog.Logger) *Auctioneer {
	return &Auctioneer{
		client:  auctioneerv1.NewAuctioneerServiceClient(conn),
		log:     logger,
		window:  window,
		pending: make(chan struct{}, 1),
	}
}

// RequestLRPAuctions queues instances for placement; they are sent within one window.
func (a *Auctioneer) RequestLRPAuctions(_ context.Context, starts []core.LRPStart) error {
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
		})
	}
	a.mu.Unlock()
	a.kick()
	return nil
}

// RequestTaskAuctions queues tasks for placement; they are sent within one window.
func (a *Auctioneer) RequestTaskAuctions(_ context.Context, tasks []*modelsv1.Task) error {
	a.mu.Lock()
	for _, t := range tasks {
		def := t.GetDefinition()
		a.tasks = append(a.tasks, &auctioneerv1.TaskStartRequest{
			TaskGuid:            t.GetTaskGuid(),
			Domain:              t.GetDomain(),
			Resources:           &modelsv1.Resources{MemoryMb: def.GetMemoryMb(), DiskMb: def.GetDiskMb(), MaxPids: def.GetMaxPids()},
			Rootfs:              def.GetRootfs(),
			PlacementConstraint: def.GetPlacementConstraint(),
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
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if len(lrps) > 0 {
		if _, err := a.client.RequestLRPAuctions(cctx, &auctioneerv1.RequestLRPAuctionsRequest{Starts: lrps}); err != nil {
			a.log.Warn("auctioneer refused lrp starts; convergence will re-auction them", "starts", len(lrps), "error", err)
		}
	}
	if len(tasks) > 0 {
		if _, err := a.client.RequestTaskAuctions(cctx, &auctioneerv1.RequestTaskAuctionsRequest{Tasks: tasks}); err != nil {
			a.log.Warn("auctioneer refused task starts; convergence will re-auction them", "tasks", len(tasks), "error", err)
		}
	}
}

// Reps reaches the rep of a cell at the address it registered. It implements core.CellClient.
type Reps struct {
	cfg   grpcx.ClientConfig
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

var _ core.CellClient = (*Reps)(nil)

// NewReps returns a rep client pool dialling with cfg.
func NewReps(cfg grpcx.ClientConfig) *Reps {
	return &Reps{cfg: cfg, conns: map[string]*grpc.ClientConn{}}
}

func (r *Reps) client(cell *modelsv1.CellPresence) (repv1.RepServiceClient, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	addr := cell.GetRepAddress()
	conn, ok := r.conns[addr]
	if !ok {
		var err error
		if conn, err = grpcx.Dial(addr, r.cfg); err != nil {
			return nil, fmt.Errorf("dial rep of cell %s at %s: %w", cell.GetCellId(), addr, err)
		}
		r.conns[addr] = conn
	}
	return repv1.NewRepServiceClient(conn), nil
}

// StopLRPInstance asks a cell's rep to stop an instance.
func (r *Reps) StopLRPInstance(ctx context.Context, cell *modelsv1.CellPresence, key *modelsv1.ActualLRPKey, instance *modelsv1.ActualLRPInstanceKey) error {
	c, err := r.client(cell)
	if err != nil {
		return err
	}
	_, err = c.StopLRPInstance(ctx, &repv1.StopLRPInstanceRequest{Key: key, InstanceKey: instance})
	return err
}

// CancelTask asks a cell's rep to stop a task's container.
func (r *Reps) CancelTask(ctx context.Context, cell *modelsv1.CellPresence, guid string) error {
	c, err := r.client(cell)
	if err != nil {
		return err
	}
	_, err = c.CancelTask(ctx, &repv1.CancelTaskRequest{TaskGuid: guid})
	return err
}

// Close closes every rep connection.
func (r *Reps) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, c := range r.conns {
		c.Close()
		delete(r.conns, addr)
	}
}
