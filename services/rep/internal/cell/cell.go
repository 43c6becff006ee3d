// Package cell is the rep's model of its cell: a registry of containers with resource
// accounting, and the lifecycles that take work from a Perform to a running container and
// report every step to the BBS.
//
// A container moves reserved → starting → running → completed:
//
//	reserved   resources are held; the LRP is being claimed (or the task started) in the BBS,
//	           its run info fetched, its rootfs resolved and the on_create hooks run
//	starting   the backend started it; an LRP waits to become healthy
//	running    an LRP is healthy and RUNNING in the BBS; a task runs
//	completed  every process exited; the outcome is being reported, on_destroy hooks run
//
// and leaves the registry (releasing its resources) after its on_destroy hooks.
package cell

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/rep/internal/drain"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/logs"
)

// LRPReporter is what an LRP's lifecycle tells the BBS.
type LRPReporter interface {
	// ClaimActualLRP claims an instance slot for a container.
	ClaimActualLRP(ctx context.Context, in *bbsv1.ClaimActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.ClaimActualLRPResponse, error)
	// DesiredLRPByProcessGuid fetches the desired LRP, for its run info.
	DesiredLRPByProcessGuid(ctx context.Context, in *bbsv1.DesiredLRPByProcessGuidRequest, opts ...grpc.CallOption) (*bbsv1.DesiredLRPByProcessGuidResponse, error)
	// StartActualLRP reports an instance RUNNING (again on every routability change).
	StartActualLRP(ctx context.Context, in *bbsv1.StartActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.StartActualLRPResponse, error)
	// CrashActualLRP reports a container that ended on its own.
	CrashActualLRP(ctx context.Context, in *bbsv1.CrashActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.CrashActualLRPResponse, error)
	// ClaimActualLRPs makes several claims in one call (the claims queued while one was out).
	ClaimActualLRPs(ctx context.Context, in *bbsv1.ClaimActualLRPsRequest, opts ...grpc.CallOption) (*bbsv1.ClaimActualLRPsResponse, error)
	// StartActualLRPs makes several RUNNING reports in one call.
	StartActualLRPs(ctx context.Context, in *bbsv1.StartActualLRPsRequest, opts ...grpc.CallOption) (*bbsv1.StartActualLRPsResponse, error)
	// RemoveActualLRP removes the record of a stopped or vanished container.
	RemoveActualLRP(ctx context.Context, in *bbsv1.RemoveActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.RemoveActualLRPResponse, error)
}

// TaskReporter is what a task's lifecycle tells the BBS.
type TaskReporter interface {
	// StartTask moves a task to RUNNING on this cell.
	StartTask(ctx context.Context, in *bbsv1.StartTaskRequest, opts ...grpc.CallOption) (*bbsv1.StartTaskResponse, error)
	// TaskByGuid fetches the task, for its definition.
	TaskByGuid(ctx context.Context, in *bbsv1.TaskByGuidRequest, opts ...grpc.CallOption) (*bbsv1.TaskByGuidResponse, error)
	// CompleteTask records a task's outcome.
	CompleteTask(ctx context.Context, in *bbsv1.CompleteTaskRequest, opts ...grpc.CallOption) (*bbsv1.CompleteTaskResponse, error)
}

// Evacuator hands instances of a draining cell over.
type Evacuator interface {
	// EvacuateClaimedActualLRP gives a claimed instance back for re-placement.
	EvacuateClaimedActualLRP(ctx context.Context, in *bbsv1.EvacuateClaimedActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.EvacuateClaimedActualLRPResponse, error)
	// EvacuateRunningActualLRP keeps a running instance as EVACUATING until its replacement runs.
	EvacuateRunningActualLRP(ctx context.Context, in *bbsv1.EvacuateRunningActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.EvacuateRunningActualLRPResponse, error)
	// EvacuateStoppedActualLRP reports an evacuating instance stopped.
	EvacuateStoppedActualLRP(ctx context.Context, in *bbsv1.EvacuateStoppedActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.EvacuateStoppedActualLRPResponse, error)
	// EvacuateCrashedActualLRP reports an evacuating instance crashed.
	EvacuateCrashedActualLRP(ctx context.Context, in *bbsv1.EvacuateCrashedActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.EvacuateCrashedActualLRPResponse, error)
	// RemoveEvacuatingActualLRP removes an EVACUATING copy whose container is gone.
	RemoveEvacuatingActualLRP(ctx context.Context, in *bbsv1.RemoveEvacuatingActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.RemoveEvacuatingActualLRPResponse, error)
}

// Lister reads the BBS records of this cell for the bulk loop.
type Lister interface {
	// ActualLRPs lists the instances naming this cell.
	ActualLRPs(ctx context.Context, in *bbsv1.ActualLRPsRequest, opts ...grpc.CallOption) (*bbsv1.ActualLRPsResponse, error)
	// Tasks lists the tasks on this cell.
	Tasks(ctx context.Context, in *bbsv1.TasksRequest, opts ...grpc.CallOption) (*bbsv1.TasksResponse, error)
	// DesiredLRPs lists the LRPs of this cell's instances when the event stream (re)subscribes,
	// for the log drains changed while it was down.
	DesiredLRPs(ctx context.Context, in *bbsv1.DesiredLRPsRequest, opts ...grpc.CallOption) (*bbsv1.DesiredLRPsResponse, error)
}

// BBS is every BBS call the cell makes; bbsv1.BBSServiceClient satisfies it.
type BBS interface {
	LRPReporter
	TaskReporter
	Evacuator
	Lister
	LinkSource
}

// Hooks are executables run around every container. Each gets the container spec as JSON on
// stdin (see HookPayload); a failing on_create hook fails the container, a failing on_destroy
// hook is logged.
type Hooks struct {
	// OnCreate run, in order, before the container starts.
	OnCreate []string
	// OnDestroy run, in order, after the container stopped.
	OnDestroy []string
	// Timeout bounds each hook run.
	Timeout time.Duration
}

// Config describes the cell.
type Config struct {
	// CellID identifies the cell.
	CellID string
	// Zone is the cell's availability zone.
	Zone string
	// Capacity is the cell's total capacity.
	Capacity *modelsv1.CellCapacity
	// Tags are the cell's placement tags, lower-cased.
	Tags []string
	// Preloaded maps preloaded rootfs names to paths.
	Preloaded map[string]string
	// Providers are the rootfs URI schemes the cell fetches.
	Providers []string
	// Hooks run around every container.
	Hooks Hooks
	// StopGrace is how long a stopped container's processes get before they are killed.
	StopGrace time.Duration
	// EvacuationTimeout bounds Evacuate; instances still held then are stopped.
	EvacuationTimeout time.Duration
	// EvacuationPollInterval is how often Evacuate asks the BBS whether to keep each instance.
	EvacuationPollInterval time.Duration
	// CallTimeout bounds one BBS call attempt.
	CallTimeout time.Duration
	// Logger receives the cell's logs.
	Logger hclog.Logger
	// Observer is told what the cell does, for metrics; nil ignores it.
	Observer Observer
	// PresenceHeld reports whether the cell's presence in etcd is in place (presence.Held);
	// while it is not, State says so and Perform takes no work. Nil counts it always held.
	PresenceHeld func() bool
	// Logs captures every container's output and the cell's lifecycle lines for it; nil
	// captures nothing.
	Logs *logs.Store
	// Drains forwards the log lines of LRPs with log drains; nil forwards nothing.
	Drains *Drains
}

// Drains configures the forwarding of containers' log lines to their LRPs' syslog drains.
type Drains struct {
	// TLS verifies syslog-tls drains (nil: the system roots).
	TLS *tls.Config
	// Counters count the lines sent and dropped.
	Counters *drain.Counters
}

// Cell runs work on one cell.
type Cell struct {
	cfg      Config
	bbs      BBS
	backend  executor.Backend
	resolver Resolver
	log      hclog.Logger
	obs      Observer

	// base is the context of every lifecycle's BBS reports; cancelled at the end of shutdown.
	base       context.Context
	cancelBase context.CancelFunc
	wg         sync.WaitGroup

	// claims and starts batch the lifecycle's claims and RUNNING reports (batch.go).
	claims *batcher[*bbsv1.ClaimActualLRPRequest, *bbsv1.ClaimActualLRPResponse]
	starts *batcher[*bbsv1.StartActualLRPRequest, *bbsv1.StartActualLRPResponse]

	mu         sync.Mutex
	containers map[string]*container // by instance guid (LRP) or task guid (task)
	// removing holds the instance guids whose stop is removing their records: the bulk loop
	// leaves those records to the stop instead of racing it for them.
	removing   map[string]bool
	linksRev   map[string]int64 // by process guid: the revision of the last LinksChanged
	evacuating bool
	evacDone   chan struct{} // closed when the evacuation finished; nil before Evacuate
	closing    bool
}

// phase is where a container is in its life.
type phase int

const (
	phaseReserved phase = iota
	phaseStarting
	phaseRunning
	phaseCompleted
)

func (p phase) String() string {
	return [...]string{"reserved", "starting", "running", "completed"}[p]
}

// container is one container the cell holds. Fields below mu are guarded by Cell.mu.
type container struct {
	guid       string
	kind       executor.Kind
	key        *modelsv1.ActualLRPKey // LRP only
	trace      *modelsv1.TraceContext // the W3C trace context the work came with (pkg/tracing)
	domain     string                 // task only (LRPs carry it in key)
	resources  *modelsv1.Resources
	rootfs     string
	constraint *modelsv1.PlacementConstraint

	ctx    context.Context // ends when the container is stopped before it runs
	cancel context.CancelFunc
	done   chan struct{} // closed once released

	// report serialises the BBS reports of this container's lifecycle with the evacuation's.
	report sync.Mutex

	// guarded by Cell.mu
	phase    phase
	claimed  bool // LRP claimed / task started in the BBS
	healthy  bool // LRP reported RUNNING (or healthy during evacuation)
	routable bool // LRP: the routability last reported
	stopping bool // the rep stops it itself: its end is not a crash or a completion
	exec     executor.Container
	netInfo  *modelsv1.ActualLRPNetInfo
	links    *consumer   // set before exec, nil when the LRP consumes no links
	usage    usageSample // the latest resource sample (SampleUsage)

	// logs is the container's log, open from its creation to its release (nil without a
	// store); only its lifecycle goroutine sets it.
	logs *logs.Instance
	// drains forwards the container's lines to its syslog drains (nil without), set under
	// Cell.mu (switchDrains); drainURLs and drainApp are what it was opened with.
	drains    *drain.Set
	drainURLs []string
	drainApp  string
}

func (ctr *container) instanceKey(cellID string) *modelsv1.ActualLRPInstanceKey {
	return &modelsv1.ActualLRPInstanceKey{InstanceGuid: ctr.guid, CellId: cellID}
}

func (ctr *container) describe() string {
	if ctr.kind == executor.KindTask {
		return "task " + ctr.guid
	}
	return fmt.Sprintf("lrp %s/%d instance %s", ctr.key.GetProcessGuid(), ctr.key.GetIndex(), ctr.guid)
}

// New builds a cell over a BBS client, an executor backend and a rootfs resolver.
func New(cfg Config, bbs BBS, backend executor.Backend, resolver Resolver) *Cell {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Capacity == nil {
		cfg.Capacity = &modelsv1.CellCapacity{}
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 10 * time.Second
	}
	if cfg.EvacuationTimeout <= 0 {
		cfg.EvacuationTimeout = 10 * time.Minute
	}
	if cfg.EvacuationPollInterval <= 0 {
		cfg.EvacuationPollInterval = time.Second
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 10 * time.Second
	}
	if cfg.Hooks.Timeout <= 0 {
		cfg.Hooks.Timeout = 30 * time.Second
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.PresenceHeld == nil {
		cfg.PresenceHeld = func() bool { return true }
	}
	base, cancel := context.WithCancel(context.Background())
	c := &Cell{
		cfg:        cfg,
		bbs:        bbs,
		backend:    backend,
		resolver:   resolver,
		log:        cfg.Logger,
		obs:        cfg.Observer,
		base:       base,
		cancelBase: cancel,
		containers: map[string]*container{},
		linksRev:   map[string]int64{},
		removing:   map[string]bool{},
	}
	c.newBatchers()
	return c
}

// Run implements lifecycle.Runner: the cell adopts the containers an earlier run of the rep
// left (with a backend whose containers outlive the rep, see adopt) and is then ready; when
// ctx ends it stops every container (without reporting their ends to the BBS: the cell's
// presence goes away with the rep) and waits for their lifecycles.
func (c *Cell) Run(ctx context.Context, ready func()) error {
	c.adopt(ctx)
	ready()
	<-ctx.Done()
	c.shutdown()
	return nil
}

// shutdown stops every container and waits (bounded) for their lifecycles.
func (c *Cell) shutdown() {
	c.mu.Lock()
	c.closing = true
	held := make([]*container, 0, len(c.containers))
	for _, ctr := range c.containers {
		held = append(held, ctr)
	}
	c.mu.Unlock()
	if len(held) > 0 {
		c.log.Info("stopping containers", "count", len(held))
	}
	for _, ctr := range held {
		go c.stop(ctr)
	}
	waited := make(chan struct{})
	go func() { c.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(c.cfg.StopGrace + c.cfg.Hooks.Timeout + 5*time.Second):
		c.log.Warn("containers still stopping at shutdown")
	}
	c.cancelBase()
}

// State is the cell's state, with every instance and task it holds.
func (c *Cell) State() *repv1.StateResponse { return c.state(false) }

// StateSummary is the cell's state as placement needs it: the lrps and tasks lists are left
// out and LrpInstances counts the instances per process guid instead, without copying them.
func (c *Cell) StateSummary() *repv1.StateResponse { return c.state(true) }

func (c *Cell) state(summary bool) *repv1.StateResponse {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Plain copies of the capacity: proto.Clone costs more than the whole summary.
	capacity := func() *modelsv1.CellCapacity {
		return &modelsv1.CellCapacity{MemoryMb: c.cfg.Capacity.GetMemoryMb(), DiskMb: c.cfg.Capacity.GetDiskMb(), Containers: c.cfg.Capacity.GetContainers()}
	}
	avail := capacity()
	out := &repv1.StateResponse{
		CellId:             c.cfg.CellID,
		Zone:               c.cfg.Zone,
		TotalResources:     capacity(),
		AvailableResources: avail,
		PlacementTags:      append([]string(nil), c.cfg.Tags...),
		PreloadedRootfses:  sortedKeys(c.cfg.Preloaded),
		RootfsProviders:    append([]string(nil), c.cfg.Providers...),
		Evacuating:         c.evacuating,
		Notes:              c.backend.Notes(),
		PresenceLapsed:     !c.cfg.PresenceHeld(),
	}
	iso := c.backend.Isolation()
	out.Isolation, out.Enforced = iso.Kind, iso.Enforced
	count := func(ctr *container) {
		avail.MemoryMb -= ctr.resources.GetMemoryMb()
		avail.DiskMb -= ctr.resources.GetDiskMb()
		avail.Containers--
		if ctr.phase == phaseReserved || ctr.phase == phaseStarting {
			out.StartingContainerCount++
		}
	}
	if summary {
		// Placement needs counts only: no order, no copies. The map is sized once for every
		// container (an LRP's instances are mostly on different cells), not grown as it fills.
		for _, ctr := range c.containers {
			count(ctr)
			if ctr.kind == executor.KindLRP {
				if out.LrpInstances == nil {
					out.LrpInstances = make(map[string]int32, len(c.containers))
				}
				out.LrpInstances[ctr.key.GetProcessGuid()]++
			}
		}
		return out
	}
	for _, ctr := range c.sortedLocked() {
		count(ctr)
		if ctr.kind == executor.KindLRP {
			out.Lrps = append(out.Lrps, &repv1.LRPInstance{
				Key:                 ctr.key.CloneVT(),
				Resources:           ctr.resources.CloneVT(),
				Rootfs:              ctr.rootfs,
				PlacementConstraint: ctr.constraint.CloneVT(),
				InstanceGuid:        ctr.guid,
			})
		} else {
			out.Tasks = append(out.Tasks, &repv1.TaskWork{
				TaskGuid:            ctr.guid,
				Domain:              ctr.domain,
				Resources:           ctr.resources.CloneVT(),
				Rootfs:              ctr.rootfs,
				PlacementConstraint: ctr.constraint.CloneVT(),
			})
		}
	}
	return out
}

// sortedLocked lists the containers by guid. c.mu must be held.
func (c *Cell) sortedLocked() []*container {
	out := make([]*container, 0, len(c.containers))
	for _, ctr := range c.containers {
		out = append(out, ctr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].guid < out[j].guid })
	return out
}

// availableLocked is the capacity not reserved by containers. c.mu must be held.
func (c *Cell) availableLocked() (memory, disk, containers int32) {
	memory, disk, containers = c.cfg.Capacity.GetMemoryMb(), c.cfg.Capacity.GetDiskMb(), c.cfg.Capacity.GetContainers()
	for _, ctr := range c.containers {
		memory -= ctr.resources.GetMemoryMb()
		disk -= ctr.resources.GetDiskMb()
		containers--
	}
	return memory, disk, containers
}

// refusal says why the cell cannot take a piece of work, or "" when it can. c.mu must be held.
func (c *Cell) refusalLocked(rootfs string, res *modelsv1.Resources) string {
	switch {
	case c.closing:
		return "cell is shutting down"
	case c.evacuating:
		return "cell is evacuating"
	case !c.cfg.PresenceHeld():
		return "cell presence has lapsed"
	case !c.resolver.Supports(rootfs):
		return fmt.Sprintf("rootfs %q is not supported", rootfs)
	}
	memory, disk, containers := c.availableLocked()
	var short []string
	if res.GetMemoryMb() > memory {
		short = append(short, "memory")
	}
	if res.GetDiskMb() > disk {
		short = append(short, "disk")
	}
	if containers < 1 {
		short = append(short, "containers")
	}
	if len(short) > 0 {
		return "insufficient resources: " + strings.Join(short, ", ")
	}
	return ""
}

// Perform reserves room for each piece of work the cell can take and starts it in the
// background; it returns the work it could not take.
func (c *Cell) Perform(lrps []*repv1.LRPInstance, tasks []*repv1.TaskWork) (failedLRPs []*repv1.LRPInstance, failedTasks []*repv1.TaskWork) {
	var started []*container
	c.mu.Lock()
	for _, l := range lrps {
		if why := c.refusalLocked(l.GetRootfs(), l.GetResources()); why != "" || c.holdsLRPLocked(l.GetKey()) {
			if why == "" {
				why = "instance already held by this cell"
			}
			c.log.Info("refusing lrp", "process_guid", l.GetKey().GetProcessGuid(), "index", l.GetKey().GetIndex(), "reason", why)
			failedLRPs = append(failedLRPs, l)
			continue
		}
		ctr := c.reserveLocked(uuid.NewString(), executor.KindLRP, l.GetResources(), l.GetRootfs(), l.GetPlacementConstraint())
		ctr.key = l.GetKey().CloneVT()
		ctr.trace = l.GetTrace()
		started = append(started, ctr)
	}
	for _, t := range tasks {
		if why := c.refusalLocked(t.GetRootfs(), t.GetResources()); why != "" || c.containers[t.GetTaskGuid()] != nil {
			if why == "" {
				why = "task already held by this cell"
			}
			c.log.Info("refusing task", "task_guid", t.GetTaskGuid(), "reason", why)
			failedTasks = append(failedTasks, t)
			continue
		}
		ctr := c.reserveLocked(t.GetTaskGuid(), executor.KindTask, t.GetResources(), t.GetRootfs(), t.GetPlacementConstraint())
		ctr.domain = t.GetDomain()
		ctr.trace = t.GetTrace()
		started = append(started, ctr)
	}
	c.wg.Add(len(started))
	c.mu.Unlock()

	var instances []*container
	for _, ctr := range started {
		if ctr.kind == executor.KindLRP {
			instances = append(instances, ctr)
		} else {
			go c.runTask(ctr)
		}
	}
	c.startLRPs(instances)
	return failedLRPs, failedTasks
}

// holdsLRPLocked reports whether a live container holds the instance slot. c.mu must be held.
func (c *Cell) holdsLRPLocked(key *modelsv1.ActualLRPKey) bool {
	for _, ctr := range c.containers {
		if ctr.kind == executor.KindLRP && ctr.phase != phaseCompleted && !ctr.stopping &&
			ctr.key.GetProcessGuid() == key.GetProcessGuid() && ctr.key.GetIndex() == key.GetIndex() {
			return true
		}
	}
	return false
}

// reserveLocked adds a reserved container. c.mu must be held.
func (c *Cell) reserveLocked(guid string, kind executor.Kind, res *modelsv1.Resources, rootfs string, pc *modelsv1.PlacementConstraint) *container {
	ctx, cancel := context.WithCancel(c.base)
	if res == nil {
		res = &modelsv1.Resources{}
	}
	ctr := &container{
		guid:       guid,
		kind:       kind,
		resources:  res.CloneVT(),
		rootfs:     rootfs,
		constraint: pc.CloneVT(),
		ctx:        ctx,
		cancel:     cancel,
		done:       make(chan struct{}),
	}
	c.containers[guid] = ctr
	return ctr
}

// release drops a container from the registry, freeing its resources. Every lifecycle ends
// with it.
func (c *Cell) release(ctr *container) {
	c.mu.Lock()
	if c.containers[ctr.guid] == ctr {
		delete(c.containers, ctr.guid)
	}
	drains := ctr.drains
	ctr.drains = nil
	c.mu.Unlock()
	// After the removal: a follower told of it finds the container gone.
	if drains != nil {
		go drains.Close() // sends what is queued, bounded
	}
	switch {
	case ctr.logs != nil:
		ctr.logs.Close()
	case c.cfg.Logs != nil:
		c.cfg.Logs.Released(ctr.logKey())
	}
	ctr.cancel()
	close(ctr.done)
	c.wg.Done()
}

// setPhase moves a container on.
func (c *Cell) setPhase(ctr *container, p phase) {
	c.mu.Lock()
	ctr.phase = p
	c.mu.Unlock()
}

// isStopping reports whether the rep stops ctr itself.
func (c *Cell) isStopping(ctr *container) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ctr.stopping
}

// isEvacuating reports whether the cell drains.
func (c *Cell) isEvacuating() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.evacuating
}

// stop makes the rep stop ctr itself (its end is then not reported as a crash or a
// completion) and returns once its processes are gone. A container that has not been started
// yet is abandoned by its lifecycle.
func (c *Cell) stop(ctr *container) {
	c.mu.Lock()
	first := !ctr.stopping
	ctr.stopping = true
	exec := ctr.exec
	c.mu.Unlock()
	if first {
		c.obs.ContainerStopped(ctr.kind)
	}
	ctr.cancel()
	if exec != nil {
		exec.Stop(c.cfg.StopGrace)
	}
}

// setExec records the backend container; when a stop came first it stops it at once.
func (c *Cell) setExec(ctr *container, exec executor.Container) {
	c.mu.Lock()
	ctr.exec = exec
	ctr.phase = phaseStarting
	stopping := ctr.stopping
	c.mu.Unlock()
	c.obs.ContainerStarted(ctr.kind)
	if stopping {
		exec.Stop(c.cfg.StopGrace)
	}
}

// findLRP returns the container with the given instance guid holding key, if any.
func (c *Cell) findLRP(key *modelsv1.ActualLRPKey, instanceGuid string) *container {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctr := c.containers[instanceGuid]
	if ctr == nil || ctr.kind != executor.KindLRP || ctr.key.GetProcessGuid() != key.GetProcessGuid() || ctr.key.GetIndex() != key.GetIndex() {
		return nil
	}
	return ctr
}

// detached runs f in the background under the cell's context (bounded by timeout), so a
// caller that goes away does not abandon half a stop, and waits for it or for ctx.
func (c *Cell) detached(ctx context.Context, timeout time.Duration, f func(ctx context.Context) error) error {
	res := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(c.base, timeout)
		defer cancel()
		res <- f(dctx)
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("continuing in the background: %w", ctx.Err())
	}
}

// errWrongCell refuses a request about another cell's container.
func (c *Cell) errWrongCell(cellID string) error {
	return rpcerr.FailedPrecondition("instance key names cell %q, this is cell %q", cellID, c.cfg.CellID)
}

// Holds reports whether the cell holds a container f selects (reserved, starting, running or
// ending).
func (c *Cell) Holds(f logs.Filter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ctr := range c.containers {
		if f.Matches(ctr.logKey()) {
			return true
		}
	}
	return false
}

// logKey names the container's log.
func (ctr *container) logKey() logs.Key {
	if ctr.kind == executor.KindTask {
		return logs.Key{InstanceGuid: ctr.guid, TaskGuid: ctr.guid}
	}
	return logs.Key{ProcessGuid: ctr.key.GetProcessGuid(), Index: ctr.key.GetIndex(), InstanceGuid: ctr.guid}
}

// openLog opens the container's log (once) and makes spec's processes write to it; without a
// store, or when it cannot be opened (logged), nothing is captured.
func (c *Cell) openLog(ctr *container, spec *executor.Spec) {
	if c.cfg.Logs == nil {
		return
	}
	if ctr.logs == nil {
		source := logs.SourceLRP
		if ctr.kind == executor.KindTask {
			source = logs.SourceTaskPrefix + ctr.guid
		}
		l, err := c.cfg.Logs.Open(ctr.logKey(), source)
		if err != nil {
			c.log.Warn("cannot capture the container's logs", "guid", ctr.guid, "error", err)
			return
		}
		c.mu.Lock() // SetLogDrains reads ctr.logs under it
		ctr.logs = l
		c.switchDrains(ctr, spec.LogGuid, spec.LogDrains)
		c.mu.Unlock()
	}
	spec.Log = ctr.logs
}

// switchDrains makes urls the syslog drains of ctr's log (none when empty), closing the ones
// it had (they send what is queued, bounded). c.mu is held.
func (c *Cell) switchDrains(ctr *container, logGuid string, urls []string) {
	d := c.cfg.Drains
	if d == nil || ctr.logs == nil {
		return
	}
	old := ctr.drains
	ctr.drains, ctr.drainURLs, ctr.drainApp = nil, slices.Clone(urls), logGuid
	if len(urls) > 0 {
		k := ctr.logKey()
		app := logGuid
		if app == "" {
			app = k.ProcessGuid + k.TaskGuid // one of them is set
		}
		ctr.drains = drain.Open(urls, drain.Tags{Hostname: c.cfg.CellID, AppName: app, ProcessGuid: k.ProcessGuid,
			Index: k.Index, InstanceGuid: k.InstanceGuid, TaskGuid: k.TaskGuid}, d.TLS, d.Counters, c.log.Named("drain").With("guid", ctr.guid))
		ctr.logs.SetTap(ctr.drains.Line)
	} else if old != nil {
		ctr.logs.SetTap(nil)
	}
	if old != nil {
		go old.Close()
	}
}

// SetLogDrains switches the drains of the cell's containers of d (an LRP whose log drains
// changed) to d's; a container that already has them keeps its drains (and their queues).
func (c *Cell) SetLogDrains(d *modelsv1.DesiredLRP) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ctr := range c.containers {
		if ctr.kind == executor.KindLRP && ctr.key.GetProcessGuid() == d.GetProcessGuid() && ctr.logs != nil &&
			(!slices.Equal(ctr.drainURLs, d.GetLogDrains()) || ctr.drainApp != d.GetLogGuid()) {
			c.switchDrains(ctr, d.GetLogGuid(), d.GetLogDrains())
			n++
		}
	}
	if n > 0 {
		c.log.Info("log drains changed", "process_guid", d.GetProcessGuid(), "containers", n, "drains", len(d.GetLogDrains()))
	}
}

// drainedGuids lists the process guids of the LRP containers whose logs are open (those whose
// drains SetLogDrains may switch).
func (c *Cell) drainedGuids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]struct{}{}
	var out []string
	for _, ctr := range c.containers {
		if ctr.kind != executor.KindLRP || ctr.logs == nil {
			continue
		}
		if _, ok := seen[ctr.key.GetProcessGuid()]; !ok {
			seen[ctr.key.GetProcessGuid()] = struct{}{}
			out = append(out, ctr.key.GetProcessGuid())
		}
	}
	slices.Sort(out)
	return out
}

// ReconcileDrains reads the desired LRPs of the cell's running instances (one DesiredLRPs call
// for all of them) and switches the drains of the instances whose LRP's drains are not the
// ones they have: the changes made while the cell did not follow the BBS's events. An LRP that
// is gone keeps its instances' drains until they stop.
func (c *Cell) ReconcileDrains(ctx context.Context) error {
	if c.cfg.Drains == nil {
		return nil
	}
	guids := c.drainedGuids()
	if len(guids) == 0 {
		return nil
	}
	var resp *bbsv1.DesiredLRPsResponse
	err := c.call(ctx, "list desired LRPs", func(ctx context.Context) error {
		var err error
		resp, err = c.bbs.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: guids}})
		return err
	})
	if err != nil {
		return err
	}
	for _, d := range resp.GetDesiredLrps() {
		c.SetLogDrains(d)
	}
	return nil
}
