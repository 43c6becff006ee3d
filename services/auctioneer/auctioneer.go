// Package auctioneer is Gavel's placement service. The elected auctioneer batches start
// requests from the BBS, asks every cell for its state, places each LRP instance and task on a
// compatible cell with room (filters and scores in internal/placement), hands the work to the
// cells with Perform and reports what could not be placed back to the BBS. Standby instances
// refuse requests until they win the election.
package auctioneer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gavel-sched/gavel/pkg/authz"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/config"
	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/pkg/reppool"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/serviceconfig"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/api"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/auction"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/batch"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

// ElectionName is the name auctioneers campaign under: the lock prefix is
// etcdx.LockKey(ElectionName), "/gavel/v1/lock/auctioneer".
const ElectionName = "auctioneer"

// ServiceName is the gRPC service name whose health is SERVING only on the leader.
var ServiceName = auctioneerv1.AuctioneerService_ServiceDesc.ServiceName

// A round that could not list cells is retried this many times (waiting roundRetryDelay
// between rounds) before its work is dropped; the BBS's convergence re-auctions it.
const (
	maxRoundAttempts = 3
	roundRetryDelay  = time.Second
	// inflightRetryDelay is the least wait before a round for work deferred by the in-flight
	// limit: the containers it waits for take about that long to start.
	inflightRetryDelay = 200 * time.Millisecond
)

// Config is the auctioneer's configuration. Fields are set from a JSON config file and flags.
type Config struct {
	// Base is where the gRPC API (AuctioneerService, health, reflection) listens and its
	// TLS, log, metrics_address and authz.
	serviceconfig.Base
	// Etcd is the etcd client used for leader election: etcd_endpoints and etcd_tls.
	serviceconfig.Etcd
	// Election is the lease of the leadership: lock_ttl.
	serviceconfig.Election
	// Config is how the service reaches the BBS: bbs_address (or bbs_addresses) and bbs_tls.
	bbsclient.Config
	// RepTLS is the client certificate, key and CA for calling reps (State, Perform); or
	// insecure for plaintext.
	RepTLS tlsx.Config `json:"rep_tls"`
	// BatchInterval is the batch window: requests arriving while a round runs wait until this
	// long after the round started, so they are placed together. A request arriving while the
	// auctioneer is idle is placed at once.
	BatchInterval Duration `json:"batch_interval"`
	// CellStateTimeout bounds each cell's State call in a round; cells that do not answer in
	// time are skipped for the round.
	CellStateTimeout Duration `json:"cell_state_timeout"`
	// CellStateMaxAge is how long a cell's last known state (the state its last Perform answered
	// with, once it had taken its work, or its last State answer) stands in for a State call in
	// the next rounds. Zero asks every cell for its State every round.
	CellStateMaxAge Duration `json:"cell_state_max_age"`
	// PerformTimeout bounds each cell's Perform call; a cell that does not answer in time is
	// treated as having refused its work, which is retried once on another cell.
	PerformTimeout Duration `json:"perform_timeout"`
	// MaxInflightStarts limits how many containers may be starting at once across all cells
	// (those the cells report plus those placed in the round). Work over the limit waits in
	// the auctioneer's queue for a later round (at least inflightRetryDelay later), so a burst
	// reaches the cells and the BBS at the pace they start work. Zero means unlimited.
	MaxInflightStarts int `json:"max_inflight_starts"`
	// SampleCells, when positive, is the fewest cells a round asks for their states: a round of
	// W items (counting at most max_inflight_starts of them) asks a random sample of
	// max(sample_cells, W/4) of the registered cells instead of every cell, and places what
	// the sample cannot take over every cell in the same round.
	// Zero asks every cell every round (see docs/decisions/0049-auction-samples-cells.md).
	SampleCells int `json:"sample_cells"`
}

// Duration is a time.Duration written as a string ("10s") in config files and flags.
type Duration = config.Duration

// Default is the configuration of an auctioneer next to a local BBS and etcd.
func Default() Config {
	return Config{
		Base:          serviceconfig.DefaultBase("127.0.0.1:8890"),
		Etcd:          serviceconfig.DefaultEtcd(),
		Election:      serviceconfig.DefaultElection(),
		Config:        bbsclient.Default(),
		BatchInterval: Duration(50 * time.Millisecond),
		// About a second of starts at what one BBS over one etcd absorbs (claim and start are
		// two writes each). Measured at 1,000 cells on two cores: 2,000 capped a burst at about
		// 2,400/s and a stream at 1,950/s; 3,000 placed 2,957/s and sustained over 2,000/s with
		// the event → route p99 still under 100 ms; 4,000 pushed it to 130 ms (see
		// docs/performance.md).
		MaxInflightStarts: 3000,
		CellStateTimeout:  Duration(2 * time.Second),
		// About two rounds at 1,000 cells under a burst: a cell that took work last round is
		// not asked again (see docs/performance.md).
		CellStateMaxAge: Duration(time.Second),
		PerformTimeout:  Duration(10 * time.Second),
		// 5% of 5,000 cells: a small round at 5,000 cells asked every cell, 2 s of State calls
		// for a handful of instances (docs/performance.md).
		SampleCells: 256,
	}
}

// LoadFile overlays the JSON config file at path on c.
func (c *Config) LoadFile(path string) error { return config.LoadJSON(path, c) }

// Flags binds the auctioneer's command-line flags to c: the shared ones (serviceconfig: -listen,
// the server TLS flags, -metrics-address, -log-level, -log-format; -etcd-endpoints and the etcd
// TLS flags; -lock-ttl), the BBS client's (bbsclient.Flags), the rep client TLS flags and the
// auctioneer's own.
func (c *Config) Flags(fs *flag.FlagSet) {
	serviceconfig.BaseFlags(fs, &c.Base, "server")
	serviceconfig.EtcdFlags(fs, &c.Etcd)
	serviceconfig.ElectionFlags(fs, &c.Election)
	bbsclient.Flags(fs, &c.Config)
	config.TLSFlags(fs, &c.RepTLS, "rep", "rep-insecure", "rep client")
	fs.Var(&c.BatchInterval, "batch-interval", "batch window between auction rounds")
	fs.Var(&c.CellStateTimeout, "cell-state-timeout", "timeout of each cell's State call")
	fs.Var(&c.CellStateMaxAge, "cell-state-max-age", "how long a cell's last known state (from its last Perform or State) stands in for a State call (0: ask every round)")
	fs.Var(&c.PerformTimeout, "perform-timeout", "timeout of each cell's Perform call")
	fs.IntVar(&c.MaxInflightStarts, "max-inflight-starts", c.MaxInflightStarts, "most containers starting at once (0: unlimited)")
	fs.IntVar(&c.SampleCells, "sample-cells", c.SampleCells, "fewest cells a round asks for their states, a random sample of max(this, work/4) (0: every cell)")
}

// Validate reports every problem that would stop the auctioneer from starting.
func (c Config) Validate() error {
	errs := []error{c.Base.Validate(), c.Etcd.Validate(), c.Election.Validate(),
		c.Config.Validate()} // the last: the BBS client's fields
	if err := c.RepTLS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("rep_tls: %w", err))
	}
	if c.BatchInterval <= 0 {
		errs = append(errs, fmt.Errorf("batch_interval must be positive, got %s", c.BatchInterval))
	}
	if c.CellStateTimeout <= 0 {
		errs = append(errs, fmt.Errorf("cell_state_timeout must be positive, got %s", c.CellStateTimeout))
	}
	if c.CellStateMaxAge < 0 {
		errs = append(errs, fmt.Errorf("cell_state_max_age must not be negative, got %s", c.CellStateMaxAge))
	}
	if c.PerformTimeout <= 0 {
		errs = append(errs, fmt.Errorf("perform_timeout must be positive, got %s", c.PerformTimeout))
	}
	if c.MaxInflightStarts < 0 {
		errs = append(errs, fmt.Errorf("max_inflight_starts must not be negative, got %d", c.MaxInflightStarts))
	}
	if c.SampleCells < 0 {
		errs = append(errs, fmt.Errorf("sample_cells must not be negative, got %d", c.SampleCells))
	}
	return errors.Join(errs...)
}

// Service is a running auctioneer.
type Service struct {
	cfg           Config
	log           hclog.Logger
	etcd          *clientv3.Client
	batch         *batch.Batch
	pool          *reppool.Pool
	runner        *auction.Runner
	server        *grpcx.Server
	leading       atomic.Bool
	rounds        atomic.Int64
	stats         stats
	metrics       *serviceMetrics
	metricsServer *metrics.Server // nil without metrics_address
}

// Option adjusts an auctioneer beyond its Config (tests and embedding).
type Option func(*options)

type options struct {
	listener net.Listener
}

// WithListener makes the auctioneer serve its API on l, bound by the caller, instead of
// listening on listen_address (which then only names the address): callers that must know the
// address before the auctioneer starts bind first instead of picking a free port for later.
func WithListener(l net.Listener) Option { return func(o *options) { o.listener = l } }

// New builds an auctioneer that elects its leader over etcd and talks to the BBS through bbs;
// Run starts it. Reps are dialled with cfg.RepTLS as cells appear. logger may be nil.
func New(cfg Config, logger hclog.Logger, etcd *clientv3.Client, bbs bbsv1.BBSServiceClient, opts ...Option) (*Service, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("auctioneer config: %w", err)
	}
	if etcd == nil || bbs == nil {
		return nil, errors.New("auctioneer: etcd and bbs clients are required")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	pool := reppool.New(grpcx.ClientConfig{TLS: cfg.RepTLS})
	s := &Service{
		metrics: newServiceMetrics(),
		cfg:     cfg,
		log:     logger,
		etcd:    etcd,
		batch:   batch.New(),
		pool:    pool,
		runner: auction.NewRunner(bbs, pool, auction.Config{
			StateTimeout:   time.Duration(cfg.CellStateTimeout),
			StateMaxAge:    time.Duration(cfg.CellStateMaxAge),
			PerformTimeout: time.Duration(cfg.PerformTimeout),
			MaxInFlight:    cfg.MaxInflightStarts,
			DeferOverLimit: true,
			SampleCells:    cfg.SampleCells,
		}, logger.Named("auction")),
	}
	authorizer := authz.New(cfg.Authz, Policy, logger.Named("audit"))
	server, err := grpcx.NewServer(grpcx.ServerConfig{ListenAddress: cfg.ListenAddress, TLS: cfg.TLS}, logger.Named("grpc"),
		grpcx.WithListener(o.listener),
		grpcx.WithUnaryInterceptors(authorizer.Unary(), rpcerr.UnaryServerInterceptor()),
		grpcx.WithStreamInterceptors(authorizer.Stream(), rpcerr.StreamServerInterceptor()),
		grpcx.WithValidator(api.Validate),
		grpcx.WithMetrics(s.metrics.registry),
	)
	if err != nil {
		return nil, fmt.Errorf("auctioneer: %w", err)
	}
	auctioneerv1.RegisterAuctioneerServiceServer(server.GRPC, api.New(queue{s}))
	s.server = server
	s.metricsServer = cfg.MetricsServer(s.metrics.registry)
	return s, nil
}

// Run serves the API and campaigns for leadership until ctx ends; while leading it runs
// auctions. ready is called once the API is serving (as leader or standby).
func (s *Service) Run(ctx context.Context, ready func()) error {
	defer func() {
		if err := s.pool.Close(); err != nil {
			s.log.Warn("close rep connections", "error", err)
		}
	}()
	return lifecycle.Run(ctx, s.log, append(s.metricsServer.Members(),
		lifecycle.Member{Name: "grpc", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
			return s.server.Run(ctx, func() {
				// A standby until elected.
				s.server.Health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
				r()
			})
		})},
		lifecycle.Member{Name: "election", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
			el, err := s.cfg.NewElection(s.etcd, ElectionName, s.Addr().String(), s.log.Named("election"))
			if err != nil {
				return fmt.Errorf("auctioneer election: %w", err)
			}
			r()
			ready()
			return el.Run(ctx, s.lead)
		})},
	)...)
}

// MetricsAddr is the bound address of the metrics server once Run has called ready; nil
// without metrics_address.
func (s *Service) MetricsAddr() net.Addr { return s.metricsServer.Addr() }

// Addr is the API's bound address once Run has called ready.
func (s *Service) Addr() net.Addr { return s.server.Addr() }

// IsLeader reports whether this auctioneer is the elected leader running auctions.
func (s *Service) IsLeader() bool { return s.leading.Load() }

// Timings is the cumulative wall time of the phases of auction rounds.
type Timings struct {
	// ListCells is the time spent listing the cells from the BBS.
	ListCells time.Duration
	// FetchStates is the time spent asking the cells for their State.
	FetchStates time.Duration
	// Place is the time spent filtering and scoring.
	Place time.Duration
	// Perform is the time spent handing work to the cells.
	Perform time.Duration
	// Report is the time spent reporting what could not be placed to the BBS.
	Report time.Duration
}

// Stats is the cumulative wall time of every round's phases, for benchmarks and operators.
func (s *Service) Stats() Timings {
	t := s.stats.get()
	return Timings{ListCells: t.ListCells, FetchStates: t.FetchStates, Place: t.Place, Perform: t.Perform, Report: t.Report}
}

// stats accumulates round timings.
type stats struct {
	mu  sync.Mutex
	sum auction.Timings
}

func (st *stats) add(t auction.Timings) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sum.ListCells += t.ListCells
	st.sum.FetchStates += t.FetchStates
	st.sum.Place += t.Place
	st.sum.Perform += t.Perform
	st.sum.Report += t.Report
}

func (st *stats) get() auction.Timings {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.sum
}

// Rounds is the number of auction rounds run so far.
func (s *Service) Rounds() int64 { return s.rounds.Load() }

// lead runs auctions for as long as this auctioneer leads: it drains the batch at most once per
// batch interval, at once when a request arrives while idle.
func (s *Service) lead(ctx context.Context) error {
	s.batch.Reset()
	s.leading.Store(true)
	s.metrics.leader.Set(1)
	s.server.Health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.log.Info("leading: running auctions", "batch_interval", s.cfg.BatchInterval)
	defer func() {
		s.leading.Store(false)
		s.metrics.leader.Set(0)
		s.server.Health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
		dropped := s.batch.Len()
		s.batch.Reset()
		s.log.Info("standing by", "dropped_requests", dropped)
	}()
	// While leading, connections to the cells are made ahead of rounds.
	aside, stopAside := context.WithCancel(ctx)
	var helpers sync.WaitGroup
	helpers.Go(func() { s.connectCells(aside) })
	defer func() {
		stopAside()
		helpers.Wait()
	}()
	interval := time.Duration(s.cfg.BatchInterval)
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.batch.Ready():
		}
		if wait := time.Until(last.Add(interval)); wait > 0 && !retry.Sleep(ctx, wait) {
			return nil
		}
		entries := s.batch.Drain()
		if len(entries) == 0 {
			continue
		}
		last = time.Now()
		if !s.round(ctx, entries) && !retry.Sleep(ctx, roundRetryDelay) {
			return nil
		}
	}
}

// cellConnectInterval is how often a leader lists the cells to connect to new ones (and to
// wake connections gRPC let go idle) ahead of their first round.
const cellConnectInterval = 5 * time.Second

// connectCells connects to every registered cell at once and then every cellConnectInterval
// until ctx ends (leadership is lost), so that rounds find their connections ready. A listing
// that fails is logged and tried at the next interval: rounds dial on their own anyway.
func (s *Service) connectCells(ctx context.Context) {
	for {
		if err := s.runner.Connect(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("could not list cells to connect to them ahead of rounds", "error", err)
		}
		if !retry.Sleep(ctx, cellConnectInterval) {
			return
		}
	}
}

// round runs one auction over entries. When the round could not run, it requeues the entries
// that have attempts left and reports false.
func (s *Service) round(ctx context.Context, entries []batch.Entry) bool {
	s.rounds.Add(1)
	s.metrics.rounds.Inc()
	works := make([]*placement.Work, len(entries))
	for i, e := range entries {
		works[i] = e.Work
	}
	res, err := s.runner.Run(ctx, works)
	if err == nil {
		s.stats.add(res.Timings)
		s.metrics.observeRound(entries, res)
		if len(res.Deferred) > 0 {
			byKey := make(map[string]batch.Entry, len(entries))
			for _, e := range entries {
				byKey[e.Work.Key()] = e
			}
			deferred := make([]batch.Entry, 0, len(res.Deferred))
			for _, w := range res.Deferred {
				deferred = append(deferred, byKey[w.Key()])
			}
			s.batch.Requeue(deferred)
			retry.Sleep(ctx, inflightRetryDelay)
		}
		return true
	}
	if ctx.Err() != nil {
		return true
	}
	s.metrics.roundErrors.Inc()
	var retry []batch.Entry
	for _, e := range entries {
		if e.Attempts+1 < maxRoundAttempts {
			e.Attempts++
			retry = append(retry, e)
		}
	}
	s.log.Error("auction round failed", "error", err, "requeued", len(retry), "dropped", len(entries)-len(retry))
	s.batch.Requeue(retry)
	return false
}

// queue adapts the service to api.Queue.
type queue struct{ s *Service }

// Leading implements api.Queue.
func (q queue) Leading() bool { return q.s.leading.Load() }

// Enqueue implements api.Queue.
func (q queue) Enqueue(works []*placement.Work) { q.s.batch.Add(works...) }

// Policy is the least-privilege rule of this service's gRPC API (see pkg/authz); admin may
// make every call.
var Policy = authz.Methods{
	Service: auctioneerv1.AuctioneerService_ServiceDesc.ServiceName,
	Grants:  map[string][]string{authz.BBS: {"RequestLRPAuctions", "RequestTaskAuctions"}},
	// The BBS asks for an auction with every instance and task to place: audited only when
	// the request fails.
	Quiet: map[string][]string{authz.BBS: {"RequestLRPAuctions", "RequestTaskAuctions"}},
}
