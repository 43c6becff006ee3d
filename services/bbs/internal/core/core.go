// Package core is the BBS's domain logic: the desired LRP, actual LRP and task lifecycles,
// domains and cells, each change expressed as one compare-and-swap transaction on the store.
// Each entity is its own type (DesiredLRPs, ActualLRPs, Tasks, Domains, Cells); they share one
// dependency struct, and New builds them all as a Core.
package core

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/timestamppb"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/labels"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// LRPStart asks for instances of one desired LRP to be placed.
type LRPStart struct {
	// SchedulingInfo is the desired LRP being placed.
	SchedulingInfo *modelsv1.DesiredLRPSchedulingInfo
	// Indices are the instance indices to place.
	Indices []int32
	// Peer, when the desired LRP has a spread peer (spread_with), is the peer's instances that
	// outlive this step, per cell, for the auctioneer to count with this LRP's; nil otherwise.
	Peer *SpreadPeer
}

// SpreadPeer is a desired LRP's spread peer resolved for one auction request.
type SpreadPeer struct {
	// ProcessGuid names the peer LRP.
	ProcessGuid string
	// BelowIndex is the survivor bound: the peer's total_instances minus the LRP's desired
	// instances. The peer's instances with a smaller index outlive the step.
	BelowIndex int32
	// CellInstances counts the surviving instances per cell id: ordinary instances placed on a
	// cell (claimed or running) and not draining.
	CellInstances map[string]int32
}

// Auctioneer places work on cells. The BBS calls it after creating UNCLAIMED instances or
// PENDING tasks; a failed call leaves the work for convergence to re-auction.
type Auctioneer interface {
	RequestLRPAuctions(ctx context.Context, starts []LRPStart) error
	RequestTaskAuctions(ctx context.Context, tasks []*modelsv1.Task) error
}

// CellClient reaches the rep of a cell to stop work it runs.
type CellClient interface {
	StopLRPInstance(ctx context.Context, cell *modelsv1.CellPresence, key *modelsv1.ActualLRPKey, instance *modelsv1.ActualLRPInstanceKey) error
	CancelTask(ctx context.Context, cell *modelsv1.CellPresence, taskGuid string) error
}

// CallbackQueue takes completed tasks whose completion callback must be delivered.
type CallbackQueue interface {
	Enqueue(task *modelsv1.Task)
}

// AuctionObserver counts auction requests (metrics); kind is "lrp" or "task" and n the number
// of instances or tasks in the request.
type AuctionObserver interface {
	AuctionRequested(kind string, n int)
	AuctionFailed(kind string, n int)
}

// Config wires the core; zero values take defaults.
type Config struct {
	// Limits bound request sizes.
	Limits models.Limits
	// MaxTaskRejections fails a task after this many rejections unless the task sets its own.
	MaxTaskRejections int32
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives the core's logs.
	Logger hclog.Logger
	// Auctioneer places new work; nil leaves it UNCLAIMED/PENDING for a later auction.
	Auctioneer Auctioneer
	// Cells stops work running on cells; nil means instances on live cells cannot be stopped.
	Cells CellClient
	// Callbacks delivers task completion callbacks; nil disables them.
	Callbacks CallbackQueue
	// Auctions observes auction requests; nil observes nothing.
	Auctions AuctionObserver
	// Transformer augments desired LRPs and tasks before they are stored (on desire and on
	// update, over the merged result); nil stores them as given.
	Transformer Transformer
	// Background runs the work requests are promised but do not wait for (auctions, stops);
	// the service runs it in its run group. Nil runs that work inline, bounded by its timeout.
	Background *Background
	// DrainTimeout bounds how long a RUNNING, routed instance that is to be stopped waits,
	// unrouted, for the route-emitters to publish its removal before its cell is asked to
	// stop it (drain.go); zero takes DefaultDrainTimeout, a negative value stops instances
	// without draining them.
	DrainTimeout time.Duration
	// Drainer waits for the drains this BBS starts and then stops the instances; the service
	// runs it in its run group. Nil leaves every drain to convergence, which stops an instance
	// once its drain timeout has passed.
	Drainer *Drainer
}

// deps is what every entity of the core shares: the store it writes through, its configuration
// (clock, limits, auctioneer, cell client, callback queue, auction observer) and its logger.
// Helpers used by more than one entity (auction requests, stopping instances, background work)
// are its methods.
type deps struct {
	st  *store.Store
	cfg Config
	log hclog.Logger
}

// Core is the BBS's operations, one type per entity, over one store.
type Core struct {
	// DesiredLRPs desires, updates and removes LRPs.
	DesiredLRPs *DesiredLRPs
	// ActualLRPs drives instances through their lifecycle and evacuation.
	ActualLRPs *ActualLRPs
	// Tasks drives tasks through their lifecycle.
	Tasks *Tasks
	// Domains keeps domains fresh.
	Domains *Domains
	// Cells answers questions about registered cells.
	Cells *Cells
	// Routing records what the route-emitters have published.
	Routing *Routing

	d *deps
}

// New returns the core over st.
func New(st *store.Store, cfg Config) *Core {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.MaxTaskRejections <= 0 {
		cfg.MaxTaskRejections = 3
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.Limits == (models.Limits{}) {
		cfg.Limits = models.DefaultLimits()
	}
	d := &deps{st: st, cfg: cfg, log: cfg.Logger}
	return &Core{
		DesiredLRPs: &DesiredLRPs{d},
		ActualLRPs:  &ActualLRPs{d},
		Tasks:       &Tasks{d},
		Domains:     &Domains{d},
		Cells:       &Cells{d},
		Routing:     &Routing{d},
		d:           d,
	}
}

// Now is the core's clock.
func (c *Core) Now() time.Time { return c.d.cfg.Now() }

func (c *deps) now() *timestamppb.Timestamp { return timestamppb.New(c.cfg.Now()) }

func newTag() *modelsv1.ModificationTag {
	return &modelsv1.ModificationTag{Epoch: uuid.NewString(), Index: 0}
}

func bump(tag *modelsv1.ModificationTag) *modelsv1.ModificationTag {
	if tag == nil {
		return newTag()
	}
	return &modelsv1.ModificationTag{Epoch: tag.GetEpoch(), Index: tag.GetIndex() + 1}
}

// ListFilter converts the API's filter; the selector was validated with the request.
func ListFilter(f *bbsv1.Filter) (store.ListFilter, error) {
	lf := store.ListFilter{Domain: f.GetDomain(), CellID: f.GetCellId()}
	if len(f.GetProcessGuids()) > 0 {
		lf.Guids = make(map[string]struct{}, len(f.GetProcessGuids()))
		for _, g := range f.GetProcessGuids() {
			lf.Guids[g] = struct{}{}
		}
	}
	sel, err := labels.Parse(f.GetLabelSelector())
	if err != nil {
		return lf, err
	}
	lf.Selector = sel
	return lf, nil
}

func sameInstance(a, b *modelsv1.ActualLRPInstanceKey) bool {
	return a.GetInstanceGuid() == b.GetInstanceGuid() && a.GetCellId() == b.GetCellId()
}

// detach hands fn to the background queue, for work the caller has been promised but need not
// wait for (auction requests, stops, cancels); it reports false when the queue refused it, in
// which case convergence redoes the work. Without a queue fn runs inline.
func (c *deps) detach(what string, fn func(ctx context.Context) error) bool {
	if c.cfg.Background == nil {
		ctx, cancel := context.WithTimeout(context.Background(), backgroundTimeout)
		defer cancel()
		if err := fn(ctx); err != nil {
			c.log.Warn("request failed; convergence will retry", "what", what, "error", err)
		}
		return true
	}
	if !c.cfg.Background.Go(what, fn) {
		c.log.Warn("background queue full or stopped; convergence will retry", "what", what)
		return false
	}
	return true
}

// auctionLRPs asks the auctioneer, in the background, to place starts; the request carries
// ctx's trace context, so that placing and starting them joins the caller's trace.
func (c *deps) auctionLRPs(ctx context.Context, starts []LRPStart) {
	n := 0
	kept := starts[:0:0]
	for _, s := range starts {
		if len(s.Indices) > 0 {
			kept = append(kept, s)
			n += len(s.Indices)
		}
	}
	if c.cfg.Auctioneer == nil || n == 0 {
		return
	}
	c.observeAuction("lrp", n)
	tc := tracing.Carry(ctx)
	if !c.detach("lrp auction", func(ctx context.Context) error {
		c.resolvePeers(kept)
		return c.auctionResult("lrp", n, c.cfg.Auctioneer.RequestLRPAuctions(tracing.Join(ctx, tc), kept))
	}) {
		c.auctionResult("lrp", n, errNotQueued)
	}
}

// resolvePeers sets Peer on every start whose desired LRP has a spread peer, from the store's
// current instances of the peer. Starts without one cost nothing. It runs in the background,
// off the request that created the instances.
func (c *deps) resolvePeers(starts []LRPStart) {
	for i := range starts {
		sw := starts[i].SchedulingInfo.GetSpreadWith()
		if sw.GetProcessGuid() == "" {
			continue
		}
		starts[i].Peer = c.spreadPeer(sw, starts[i].SchedulingInfo.GetInstances())
	}
}

// spreadPeer resolves peer sw of an LRP with desired instances: the peer's instances whose
// index is below sw.total_instances - desired, counted per cell. nsync retires the peer's
// highest indices first (old_desired = total - new_healthy), so these are the instances that
// outlive the step this auction belongs to.
func (c *deps) spreadPeer(sw *modelsv1.SpreadWith, desired int32) *SpreadPeer {
	p := &SpreadPeer{ProcessGuid: sw.GetProcessGuid(), BelowIndex: max(0, sw.GetTotalInstances()-desired), CellInstances: map[string]int32{}}
	actuals, _ := c.st.ActualLRPs(store.ListFilter{Guids: map[string]struct{}{p.ProcessGuid: {}}})
	for _, a := range actuals {
		cell := a.GetInstanceKey().GetCellId()
		if a.GetPresence() != ordinary || cell == "" || draining(a) || a.GetKey().GetIndex() >= p.BelowIndex {
			continue
		}
		if s := a.GetState(); s != modelsv1.ActualLRP_STATE_CLAIMED && s != modelsv1.ActualLRP_STATE_RUNNING {
			continue
		}
		p.CellInstances[cell]++
	}
	return p
}

// auctionTasks asks the auctioneer, in the background, to place tasks, carrying ctx's trace
// context.
func (c *deps) auctionTasks(ctx context.Context, tasks []*modelsv1.Task) {
	if c.cfg.Auctioneer == nil || len(tasks) == 0 {
		return
	}
	c.observeAuction("task", len(tasks))
	tc := tracing.Carry(ctx)
	if !c.detach("task auction", func(ctx context.Context) error {
		return c.auctionResult("task", len(tasks), c.cfg.Auctioneer.RequestTaskAuctions(tracing.Join(ctx, tc), tasks))
	}) {
		c.auctionResult("task", len(tasks), errNotQueued)
	}
}

// errNotQueued is the failure of an auction request the background queue refused.
var errNotQueued = errors.New("background queue full or stopped")

func (c *deps) observeAuction(kind string, n int) {
	if c.cfg.Auctions != nil {
		c.cfg.Auctions.AuctionRequested(kind, n)
	}
}

func (c *deps) auctionResult(kind string, n int, err error) error {
	if err != nil && c.cfg.Auctions != nil {
		c.cfg.Auctions.AuctionFailed(kind, n)
	}
	return err
}

// RequestLRPAuctions asks the auctioneer (when configured) to place the given instances, in the
// background; a failure leaves them for the next convergence.
func (c *ActualLRPs) RequestLRPAuctions(starts []LRPStart) {
	c.auctionLRPs(context.Background(), starts)
}

// RequestTaskAuctions asks the auctioneer (when configured) to place the given PENDING tasks, in
// the background; a failure leaves them for the next convergence.
func (c *Tasks) RequestTaskAuctions(tasks []*modelsv1.Task) {
	c.auctionTasks(context.Background(), tasks)
}
