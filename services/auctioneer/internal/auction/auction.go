// Package auction runs auction rounds: it lists the cells from the BBS, fetches the State of
// every cell (or of a random sample, for a round small next to the cluster) in parallel,
// places each piece of work with the placement stack, hands the work to the chosen cells with
// Perform (retrying what a cell refuses once on the next best cell), and reports what could not
// be placed back to the BBS.
package auction

import (
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

// BBS is what a round needs from the BBS; bbsv1.BBSServiceClient satisfies it.
type BBS interface {
	Cells(ctx context.Context, in *bbsv1.CellsRequest, opts ...grpc.CallOption) (*bbsv1.CellsResponse, error)
	FailActualLRP(ctx context.Context, in *bbsv1.FailActualLRPRequest, opts ...grpc.CallOption) (*bbsv1.FailActualLRPResponse, error)
	RejectTask(ctx context.Context, in *bbsv1.RejectTaskRequest, opts ...grpc.CallOption) (*bbsv1.RejectTaskResponse, error)
}

// Reps gives a client of a cell's rep at the address it registered; *reppool.Pool implements
// it.
type Reps interface {
	Client(cellID, address string) (repv1.RepServiceClient, error)
}

// retainer is a Reps that closes the connections of cells that departed (*reppool.Pool).
type retainer interface {
	Retain(present []*modelsv1.CellPresence)
}

// connector is a Reps that connects to cells ahead of the first call (*reppool.Pool).
type connector interface {
	Connect(present []*modelsv1.CellPresence)
}

// Defaults of Config's zero fields.
const (
	// DefaultStateTimeout bounds each cell's State call.
	DefaultStateTimeout = 2 * time.Second
	// DefaultPerformTimeout bounds each cell's Perform call.
	DefaultPerformTimeout = 10 * time.Second
	// DefaultBBSTimeout bounds each call to the BBS.
	DefaultBBSTimeout = 10 * time.Second
	// DefaultParallelism bounds concurrent State calls, Perform calls and BBS reports. More at
	// once (1,024) made rounds at 2,000 cells shorter, but rounds near the in-flight limit ask
	// every cell, so shorter rounds asked more often: at 1,000 cells and 100,000 instances the
	// run spent a fifth more CPU and placed a burst slower (docs/performance.md).
	DefaultParallelism = 64
	// DefaultWorkPerSampledCell is the work a sampled round asks one cell for per item: a
	// round of W items asks max(SampleCells, W/DefaultWorkPerSampledCell) cells.
	DefaultWorkPerSampledCell = 4
)

// Config tunes a Runner; zero fields take the defaults above.
type Config struct {
	// StateTimeout bounds each cell's State call; a cell that does not answer in time is
	// skipped for the round.
	StateTimeout time.Duration
	// PerformTimeout bounds each cell's Perform call.
	PerformTimeout time.Duration
	// BBSTimeout bounds each call to the BBS.
	BBSTimeout time.Duration
	// MaxInFlight limits the containers starting at once across all cells; zero is unlimited.
	MaxInFlight int
	// DeferOverLimit hands work over MaxInFlight back in Result.Deferred, for a later round,
	// instead of reporting it to the BBS as an IN_FLIGHT_LIMIT failure.
	DeferOverLimit bool
	// Parallelism bounds concurrent State calls, Perform calls and placement error reports.
	Parallelism int
	// StateMaxAge is how long a cell's last known state stands in for a State call: the state
	// its last Perform answered with (taken once it had taken the round's work), or its last
	// State answer. Zero asks every cell every round, and so does a round that follows one
	// that ended with at least half of MaxInFlight containers starting. Only Perform adds work to a cell,
	// so a reused state can only understate its room (containers that ended since) and
	// overstate its starting containers; a cell that began evacuating or lost its presence
	// since refuses the work, which is then placed on the next best cell.
	StateMaxAge time.Duration
	// SampleCells, when positive, is the fewest cells a round asks for their states: a round
	// of W items asks a random sample of max(SampleCells, W/WorkPerSampledCell) of the
	// registered cells (all of them when that is as many), instead of every cell, as
	// Kubernetes scores a share of its nodes. W counts at most MaxInFlight items: no more can
	// start in one round. Work the sample cannot take (no sampled cell compatible, available
	// or with room) is placed again, in the same round, over every cell.
	// The in-flight limit is judged on the sample's starting containers scaled to all cells.
	// Zero asks every cell every round.
	SampleCells int
	// WorkPerSampledCell is how many items a sampled round asks one cell for, on average.
	WorkPerSampledCell int
}

func (c Config) withDefaults() Config {
	if c.StateTimeout <= 0 {
		c.StateTimeout = DefaultStateTimeout
	}
	if c.PerformTimeout <= 0 {
		c.PerformTimeout = DefaultPerformTimeout
	}
	if c.BBSTimeout <= 0 {
		c.BBSTimeout = DefaultBBSTimeout
	}
	if c.Parallelism <= 0 {
		c.Parallelism = DefaultParallelism
	}
	if c.WorkPerSampledCell <= 0 {
		c.WorkPerSampledCell = DefaultWorkPerSampledCell
	}
	return c
}

// Runner runs auction rounds. One round runs at a time.
type Runner struct {
	bbs    BBS
	reps   Reps
	stack  *placement.Stack
	cfg    Config
	logger hclog.Logger
	// retain, when set, is told the cells of each round (reppool.Pool.Retain).
	retain func([]*modelsv1.CellPresence)
	// connect, when set, starts connecting to cells ahead of a round (reppool.Pool.Connect).
	connect func([]*modelsv1.CellPresence)

	mu       sync.Mutex
	states   map[string]knownState // by cell id, with StateMaxAge
	starting int                   // the containers starting across cells after the last round
	// cells and cellsRev are the last list of cells the BBS sent and its revision: the next
	// listing asks whether it changed and decodes it again only when it did.
	cells    []*modelsv1.CellPresence
	cellsRev int64
}

// knownState is the last state a cell answered, from State or Perform.
type knownState struct {
	address string // the rep address it came from
	state   *repv1.StateResponse
	at      time.Time
}

// NewRunner builds a runner. When reps can retain (a *reppool.Pool), connections to cells that
// left or moved are closed after each round's listing.
func NewRunner(bbs BBS, reps Reps, cfg Config, logger hclog.Logger) *Runner {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	r := &Runner{bbs: bbs, reps: reps, stack: placement.NewStack(), cfg: cfg.withDefaults(), logger: logger, states: map[string]knownState{}}
	if p, ok := reps.(retainer); ok {
		r.retain = p.Retain
	}
	if p, ok := reps.(connector); ok {
		r.connect = p.Connect
	}
	return r
}

// Connect lists the cells and starts connecting to those the reps have no ready connection to,
// without waiting for the connections: a leader that does so before its first round and now
// and then afterwards finds the cells' connections (a TLS handshake each) ready when work
// comes, instead of making every cell's handshake in the round (2,000 cells: the first round's
// States took 7–9 s). The connections of cells that left are closed, as after a round's
// listing, so an idle leader does not keep redialling them. It does nothing when the reps
// cannot connect ahead.
func (r *Runner) Connect(ctx context.Context) error {
	if r.connect == nil {
		return nil
	}
	presences, err := r.listCells(ctx)
	if err != nil {
		return err
	}
	r.connect(presences)
	return nil
}

// listCells lists the registered cells from the BBS within BBSTimeout (an error wraps
// ErrListCells); a new list drops the known states of cells not among them and has the reps
// close their connections. It sends the revision of the last list it holds: a BBS that finds
// the cells unchanged since then answers without them, and that list stands (no state or
// connection then belongs to a departed cell).
func (r *Runner) listCells(ctx context.Context) ([]*modelsv1.CellPresence, error) {
	lctx, cancel := context.WithTimeout(ctx, r.cfg.BBSTimeout)
	defer cancel()
	r.mu.Lock()
	held, known := r.cells, r.cellsRev
	r.mu.Unlock()
	listed, err := r.bbs.Cells(lctx, &bbsv1.CellsRequest{KnownRevision: known})
	if err != nil {
		return nil, fmt.Errorf("%w from the bbs: %w", ErrListCells, err)
	}
	if listed.GetUnchanged() && known != 0 {
		return held, nil
	}
	r.mu.Lock()
	if listed.GetRevision() >= r.cellsRev { // a concurrent listing may have brought a later one
		r.cells, r.cellsRev = listed.GetCells(), listed.GetRevision()
	}
	r.mu.Unlock()
	r.keepStatesOf(listed.GetCells())
	if r.retain != nil {
		r.retain(listed.GetCells())
	}
	return listed.GetCells(), nil
}

// Result is what a round did.
type Result struct {
	// Placed maps each placed work key to its cell id.
	Placed map[string]string
	// Failed maps each unplaced work key to its placement failure (reported to the BBS).
	Failed map[string]*placement.Failure
	// Deferred is the work over the in-flight limit, with Config.DeferOverLimit: not
	// reported, for the caller to place in a later round.
	Deferred []*placement.Work
	// Cells is the number of registered cells.
	Cells int
	// Asked is the number of cells whose states the round used: every registered cell, or a
	// sample (Config.SampleCells), or a sample and then every cell for the work it could not
	// take (Widened).
	Asked int
	// Widened is set when work the sample could not take was placed again over every cell.
	Widened bool
	// Unreachable is the number of cells that did not answer State.
	Unreachable int
	// Reused is the number of cells whose last known state stood in for a State call
	// (Config.StateMaxAge).
	Reused int
	// ReportErrors counts placement failures the BBS did not accept.
	ReportErrors int
	// Timings split the round's wall time by phase.
	Timings Timings
}

// Timings is the wall time of a round's phases.
type Timings struct {
	// ListCells is the BBS Cells call.
	ListCells time.Duration
	// FetchStates is the parallel State calls to every cell.
	FetchStates time.Duration
	// Place is filtering and scoring every work item.
	Place time.Duration
	// Perform is handing work to the cells, retries included.
	Perform time.Duration
	// Report is sending placement failures to the BBS.
	Report time.Duration
}

// ErrListCells wraps a failure to list cells from the BBS: the round did not run and the work
// may be retried.
var ErrListCells = errors.New("list cells")

// Run runs one round over works. It returns an error wrapping ErrListCells, having done
// nothing, when the BBS cannot list the cells; every other problem ends in Result.Failed.
func (r *Runner) Run(ctx context.Context, works []*placement.Work) (Result, error) {
	start := time.Now()
	res := Result{Placed: map[string]string{}, Failed: map[string]*placement.Failure{}}
	presences, err := r.listCells(ctx)
	if err != nil {
		return res, err
	}

	res.Timings.ListCells = time.Since(start)
	mark := time.Now()
	asked, rest := r.sample(presences, r.placeable(len(works)))
	cells, reused := r.fetchStates(ctx, asked)
	res.Reused = reused
	res.Timings.FetchStates = time.Since(mark)
	mark = time.Now()
	inflight := placement.InFlight{Limit: r.cfg.MaxInFlight, Starting: startingAcross(cells, len(presences))}
	res.Cells, res.Asked = len(presences), len(cells)

	placement.Order(works)
	byCell := map[*placement.Cell][]*placement.Work{}
	var missed []*placement.Work // work the sample could not take, for every cell
	for _, w := range works {
		c, f := r.place(w, cells, nil, &inflight)
		switch {
		case f == nil:
			byCell[c] = append(byCell[c], w)
		case len(rest) > 0 && f.Code != modelsv1.PlacementError_CODE_IN_FLIGHT_LIMIT:
			missed = append(missed, w)
		default:
			res.Failed[w.Key()] = f
		}
	}
	if len(missed) > 0 {
		// Another cell may take it: ask the others, and place it over every cell, the
		// sample's reservations included.
		fetch := time.Now()
		more, moreReused := r.fetchStates(ctx, rest)
		res.Reused += moreReused
		res.Timings.FetchStates += time.Since(fetch)
		cells = append(cells, more...)
		sort.Slice(cells, func(i, j int) bool { return cells[i].ID < cells[j].ID })
		inflight.Starting = startingAcross(cells, len(cells))
		res.Asked, res.Widened = len(cells), true
		for _, w := range missed {
			if c, f := r.place(w, cells, nil, &inflight); f != nil {
				res.Failed[w.Key()] = f
			} else {
				byCell[c] = append(byCell[c], w)
			}
		}
	}
	for _, c := range cells {
		if c.Unreachable {
			res.Unreachable++
		}
	}
	res.Timings.Place = time.Since(mark)
	mark = time.Now()
	// Ask the cells for their states only when the next round could reuse them.
	r.performWithRetry(ctx, works, cells, byCell, &inflight, r.reusable(inflight.Starting), &res)
	res.Timings.Perform = time.Since(mark)
	r.setStarting(inflight.Starting) // the cells' starting containers and this round's
	if r.cfg.DeferOverLimit {
		for _, w := range works {
			if f, ok := res.Failed[w.Key()]; ok && f.Code == modelsv1.PlacementError_CODE_IN_FLIGHT_LIMIT {
				delete(res.Failed, w.Key())
				res.Deferred = append(res.Deferred, w)
			}
		}
	}
	mark = time.Now()
	res.ReportErrors = r.report(ctx, works, res.Failed)
	res.Timings.Report = time.Since(mark)
	r.logger.Info("auction round",
		"work", len(works), "placed", len(res.Placed), "failed", len(res.Failed), "deferred", len(res.Deferred),
		"cells", res.Cells, "cells_asked", res.Asked, "widened", res.Widened, "cells_unreachable", res.Unreachable, "states_reused", res.Reused, "duration", time.Since(start),
		"list", res.Timings.ListCells, "fetch", res.Timings.FetchStates, "place", res.Timings.Place,
		"perform", res.Timings.Perform, "report", res.Timings.Report)
	return res, nil
}

// performWithRetry hands byCell to the cells (first wave). Whatever a cell hands back, or
// could not receive because its Perform failed (the cell is then unreachable for the rest of the
// round), is placed once more on the next best cell other than the one that refused it, and
// performed in a second wave. Work placed on no cell ends in res.Failed as CELL_COMMUNICATION.
// works is the round's work in placement order; retries keep that order.
func (r *Runner) performWithRetry(ctx context.Context, works []*placement.Work, cells []*placement.Cell,
	byCell map[*placement.Cell][]*placement.Work, inflight *placement.InFlight, askState bool, res *Result) {
	pos := make(map[string]int, len(works))
	for i, w := range works {
		pos[w.Key()] = i
	}
	refusals := r.perform(ctx, byCell, askState, res.Placed)
	sort.SliceStable(refusals, func(i, j int) bool { return pos[refusals[i].work.Key()] < pos[refusals[j].work.Key()] })
	// Release everything first, so each retry sees all the room the refusals freed.
	for _, rf := range refusals {
		rf.cell.Release(rf.work)
		inflight.Add(-1)
	}
	firstCell := make(map[string]string, len(refusals))
	retry := map[*placement.Cell][]*placement.Work{}
	for _, rf := range refusals {
		firstCell[rf.work.Key()] = rf.cell.ID
		c, f := r.place(rf.work, cells, placement.Refused{rf.cell.ID: true}, inflight)
		if f != nil {
			res.Failed[rf.work.Key()] = &placement.Failure{
				Code:    modelsv1.PlacementError_CODE_CELL_COMMUNICATION,
				Message: fmt.Sprintf("cell %s could not start it (%s), and no other cell could take it: %s", rf.cell.ID, rf.why, f.Message),
			}
			continue
		}
		retry[c] = append(retry[c], rf.work)
	}
	for _, rf := range r.perform(ctx, retry, askState, res.Placed) {
		res.Failed[rf.work.Key()] = &placement.Failure{
			Code:    modelsv1.PlacementError_CODE_CELL_COMMUNICATION,
			Message: fmt.Sprintf("cells %s and %s could not start it (%s)", firstCell[rf.work.Key()], rf.cell.ID, rf.why),
		}
	}
}

// place selects a cell for w and reserves it there, or explains why it cannot.
func (r *Runner) place(w *placement.Work, cells []*placement.Cell, refused placement.Refused, inflight *placement.InFlight) (*placement.Cell, *placement.Failure) {
	if f := inflight.Admit(); f != nil {
		return nil, f
	}
	c, f := r.stack.Select(w, cells, refused)
	if f != nil {
		return nil, f
	}
	c.Reserve(w)
	inflight.Add(1)
	return c, nil
}

// placeable is the most of a round's n items it can place: all of them, or at most
// Config.MaxInFlight, since every placement is a container starting. The sample is sized on
// it: a round drains the whole queue, and under a backlog of 100,000 items a sample sized on
// the queue was every cell, each admitted item scored against all of them and every cell
// asked for its state, where the in-flight limit let at most MaxInFlight items be placed.
func (r *Runner) placeable(n int) int {
	if r.cfg.MaxInFlight > 0 {
		return min(n, r.cfg.MaxInFlight)
	}
	return n
}

// sample splits the registered cells into those a round of n items asks for their states and
// the rest: every cell without Config.SampleCells, or when the sample would be as many;
// otherwise a uniformly random sample of max(SampleCells, n/WorkPerSampledCell), so each
// round spreads its work over different cells.
func (r *Runner) sample(presences []*modelsv1.CellPresence, n int) (asked, rest []*modelsv1.CellPresence) {
	size := max(r.cfg.SampleCells, (n+r.cfg.WorkPerSampledCell-1)/r.cfg.WorkPerSampledCell)
	if r.cfg.SampleCells <= 0 || size >= len(presences) {
		return presences, nil
	}
	shuffled := slices.Clone(presences)
	for i := range size { // a partial Fisher–Yates shuffle: the first size are the sample
		j := i + rand.IntN(len(shuffled)-i)
		shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
	}
	return shuffled[:size], shuffled[size:]
}

// startingAcross is the containers starting across all registered cells, judged on cells
// (every registered cell, or a sample of them): the reachable cells' starting containers,
// scaled by registered/len(cells) when cells are a sample.
func startingAcross(cells []*placement.Cell, registered int) int {
	starting := 0
	for _, c := range cells {
		if !c.Unreachable {
			starting += c.Starting
		}
	}
	if len(cells) == 0 || len(cells) >= registered {
		return starting
	}
	return (starting*registered + len(cells) - 1) / len(cells)
}

// fetchStates asks each of the given cells for its State in parallel, each bounded by StateTimeout, except
// (when the last round ended far enough from the in-flight limit, reusable) the cells whose last
// known state is younger than StateMaxAge, and returns the round's view of
// the cells ordered by id and how many states were reused. Cells that fail to answer are
// included as unreachable.
func (r *Runner) fetchStates(ctx context.Context, presences []*modelsv1.CellPresence) ([]*placement.Cell, int) {
	cells := make([]*placement.Cell, len(presences))
	reused := 0
	r.mu.Lock()
	reuse := r.reusable(r.starting)
	r.mu.Unlock()
	var g errgroup.Group
	g.SetLimit(r.cfg.Parallelism)
	for i, p := range presences {
		if reuse {
			if st := r.knownState(p); st != nil {
				cells[i] = cellFromState(p, st)
				reused++
				continue
			}
		}
		g.Go(func() error {
			state, err := r.state(ctx, p)
			if err != nil {
				r.logger.Warn("cell did not report state", "cell_id", p.GetCellId(), "rep_address", p.GetRepAddress(), "error", err)
				r.forgetState(p.GetCellId())
				cells[i] = unreachableCell(p)
				return nil
			}
			r.rememberState(p.GetCellId(), p.GetRepAddress(), state)
			cells[i] = cellFromState(p, state)
			return nil
		})
	}
	_ = g.Wait() // every call records its own failure in cells
	sort.Slice(cells, func(i, j int) bool { return cells[i].ID < cells[j].ID })
	return cells, reused
}

// knownState is p's last known state when it is younger than StateMaxAge and came from the
// address p registers now, or nil.
func (r *Runner) knownState(p *modelsv1.CellPresence) *repv1.StateResponse {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, ok := r.states[p.GetCellId()]
	if !ok || k.address != p.GetRepAddress() || time.Since(k.at) >= r.cfg.StateMaxAge {
		return nil
	}
	return k.state
}

// reusable reports whether known states may stand in for State calls in a round that follows
// one ending with starting containers: StateMaxAge is set, and the in-flight limit (if any) is
// more than twice that. Near the limit states are not reused: it is judged on starting counts,
// which a reused state overstates (its containers may have started since), and deferring work
// on stale counts would slow a burst down. Besides starting it reads only the configuration.
func (r *Runner) reusable(starting int) bool {
	return r.cfg.StateMaxAge > 0 && (r.cfg.MaxInFlight <= 0 || 2*starting < r.cfg.MaxInFlight)
}

// rememberState records a state cellID answered from address, with StateMaxAge.
func (r *Runner) rememberState(cellID, address string, state *repv1.StateResponse) {
	if r.cfg.StateMaxAge <= 0 || state == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states[cellID] = knownState{address: address, state: state, at: time.Now()}
}

// forgetState drops cellID's last known state (a call to it failed).
func (r *Runner) forgetState(cellID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.states, cellID)
}

// setStarting records the containers starting across cells after this round.
func (r *Runner) setStarting(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starting = n
}

// keepStatesOf drops the known states of cells that are no longer registered.
func (r *Runner) keepStatesOf(presences []*modelsv1.CellPresence) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.states) == 0 {
		return
	}
	present := make(map[string]bool, len(presences))
	for _, p := range presences {
		present[p.GetCellId()] = true
	}
	for id := range r.states {
		if !present[id] {
			delete(r.states, id)
		}
	}
}

func (r *Runner) state(ctx context.Context, p *modelsv1.CellPresence) (*repv1.StateResponse, error) {
	client, err := r.reps.Client(p.GetCellId(), p.GetRepAddress())
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, r.cfg.StateTimeout)
	defer cancel()
	state, err := client.State(sctx, &repv1.StateRequest{Summary: true})
	if err != nil {
		return nil, fmt.Errorf("state of cell %s at %s: %w", p.GetCellId(), p.GetRepAddress(), err)
	}
	return state, nil
}

// refusal is work a cell did not take.
type refusal struct {
	work *placement.Work
	cell *placement.Cell
	why  string
}

// perform sends each cell its work in parallel, records what was taken in placed and returns
// what was not. A cell whose Perform call fails is marked unreachable.
func (r *Runner) perform(ctx context.Context, byCell map[*placement.Cell][]*placement.Work, askState bool, placed map[string]string) []refusal {
	type outcome struct {
		cell    *placement.Cell
		works   []*placement.Work
		refused map[string]bool
		state   *repv1.StateResponse // the cell's state after taking the work (StateMaxAge)
		err     error
	}
	outcomes := make([]outcome, 0, len(byCell))
	for c, works := range byCell {
		outcomes = append(outcomes, outcome{cell: c, works: works})
	}
	sort.Slice(outcomes, func(i, j int) bool { return outcomes[i].cell.ID < outcomes[j].cell.ID })
	var g errgroup.Group
	g.SetLimit(r.cfg.Parallelism)
	for i := range outcomes {
		o := &outcomes[i]
		g.Go(func() error {
			o.refused, o.state, o.err = r.performOn(ctx, o.cell, o.works, askState)
			return nil
		})
	}
	_ = g.Wait() // each outcome holds its own error
	var out []refusal
	for _, o := range outcomes {
		if o.err != nil {
			r.logger.Warn("perform failed", "cell_id", o.cell.ID, "rep_address", o.cell.Address, "work", len(o.works), "error", o.err)
			o.cell.Unreachable = true
			r.forgetState(o.cell.ID)
		} else {
			r.rememberState(o.cell.ID, o.cell.Address, o.state)
		}
		for _, w := range o.works {
			switch {
			case o.err != nil:
				out = append(out, refusal{work: w, cell: o.cell, why: "perform failed: " + errText(o.err)})
			case o.refused[w.Key()]:
				out = append(out, refusal{work: w, cell: o.cell, why: "the cell refused it"})
			default:
				placed[w.Key()] = o.cell.ID
			}
		}
	}
	return out
}

// performOn hands works to cell c and returns the keys it refused and, with askState, its state
// once it took the rest.
func (r *Runner) performOn(ctx context.Context, c *placement.Cell, works []*placement.Work, askState bool) (map[string]bool, *repv1.StateResponse, error) {
	client, err := r.reps.Client(c.ID, c.Address)
	if err != nil {
		return nil, nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PerformTimeout)
	defer cancel()
	spans, traces := placeSpans(ctx, c, works)
	req := performRequest(works, traces)
	req.IncludeState = askState
	resp, err := client.Perform(pctx, req)
	if err != nil {
		endPlaceSpans(spans, works, nil, err)
		return nil, nil, fmt.Errorf("perform on cell %s at %s: %w", c.ID, c.Address, err)
	}
	refused := failedKeys(resp)
	endPlaceSpans(spans, works, refused, nil)
	return refused, resp.GetState(), nil
}

// placeSpans starts, for each piece of work handed to cell c, an "auctioneer.place" span in
// the trace of the request that asked for it, and returns the spans and the trace contexts
// the cell's spans for each work are to join.
func placeSpans(ctx context.Context, c *placement.Cell, works []*placement.Work) ([]trace.Span, []*modelsv1.TraceContext) {
	tracer := tracing.Tracer("auctioneer")
	spans := make([]trace.Span, len(works))
	traces := make([]*modelsv1.TraceContext, len(works))
	for i, w := range works {
		sctx, span := tracer.Start(tracing.Join(ctx, w.Trace), "auctioneer.place",
			trace.WithAttributes(attribute.String("gavel.work", w.Key()), attribute.String("gavel.cell_id", c.ID)))
		spans[i], traces[i] = span, tracing.Carry(sctx)
	}
	return spans, traces
}

// endPlaceSpans ends the spans of placeSpans, marking the works the cell refused, or every
// work when the call failed.
func endPlaceSpans(spans []trace.Span, works []*placement.Work, refused map[string]bool, err error) {
	for i, span := range spans {
		switch {
		case err != nil:
			span.SetStatus(otelcodes.Error, err.Error())
		case refused[works[i].Key()]:
			span.SetStatus(otelcodes.Error, "refused by the cell")
		}
		span.End()
	}
}

// report sends each failure to the BBS in parallel: FailActualLRP for instances, RejectTask for
// tasks. It returns how many reports failed.
func (r *Runner) report(ctx context.Context, works []*placement.Work, failed map[string]*placement.Failure) int {
	var g errgroup.Group
	g.SetLimit(r.cfg.Parallelism)
	var errCount atomic.Int32
	for _, w := range works {
		f, ok := failed[w.Key()]
		if !ok {
			continue
		}
		g.Go(func() error {
			if err := r.reportOne(ctx, w, f); err != nil {
				level := hclog.Warn
				if c := status.Code(err); c == codes.FailedPrecondition || c == codes.NotFound {
					level = hclog.Debug // claimed, removed or completed meanwhile
				}
				r.logger.Log(level, "could not report placement failure", "work", w.String(), "error", err)
				errCount.Add(1)
				return nil
			}
			r.logger.Info("placement failed", "work", w.String(), "code", f.Code.String(), "reason", f.Message)
			return nil
		})
	}
	_ = g.Wait() // failures are counted, not returned
	return int(errCount.Load())
}

// reportOne reports one failure within BBSTimeout. A BBS that sheds load is waited for, and
// asked again, by the BBS connection (bbsclient.RetryOverloaded).
func (r *Runner) reportOne(ctx context.Context, w *placement.Work, f *placement.Failure) error {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.BBSTimeout)
	defer cancel()
	if w.Kind == placement.KindTask {
		if _, err := r.bbs.RejectTask(rctx, &bbsv1.RejectTaskRequest{TaskGuid: w.TaskGuid, RejectionReason: f.Message, PlacementError: f.Proto()}); err != nil {
			return fmt.Errorf("reject task %s: %w", w.TaskGuid, err)
		}
		return nil
	}
	if _, err := r.bbs.FailActualLRP(rctx, &bbsv1.FailActualLRPRequest{ProcessGuid: w.ProcessGuid, Index: w.Index, PlacementError: f.Proto()}); err != nil {
		return fmt.Errorf("fail actual lrp %s/%d: %w", w.ProcessGuid, w.Index, err)
	}
	return nil
}

// errText is the message of a gRPC error without its code prefix.
func errText(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return strings.TrimSpace(se.GRPCStatus().Message())
	}
	return err.Error()
}
