// Package bbs is Gavel's bulletin board: the API of record over etcd. Run serves the gRPC API
// (bbsv1.BBSService) from a watch-fed cache, writes every change as one compare-and-swap
// transaction, streams events, and delivers task completion callbacks.
package bbs

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/pkg/authz"
	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/reppool"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/serviceconfig"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/services/bbs/internal/api"
	"github.com/gavel-sched/gavel/services/bbs/internal/callback"
	"github.com/gavel-sched/gavel/services/bbs/internal/converge"
	"github.com/gavel-sched/gavel/services/bbs/internal/core"
	"github.com/gavel-sched/gavel/services/bbs/internal/peers"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
	"github.com/gavel-sched/gavel/services/bbs/internal/validate"
)

// Config is the BBS's configuration. Fields are set from a JSON config file and flags.
type Config struct {
	// Base is the API's listen address and TLS (tls, also presented to the auctioneer and
	// reps), log, metrics_address and authz.
	serviceconfig.Base
	// Etcd is the etcd client: etcd_endpoints and etcd_tls.
	serviceconfig.Etcd
	// Election is the lease of the convergence leadership: lock_ttl.
	serviceconfig.Election
	// AuctioneerAddress is the auctioneer's gRPC address; new instances and tasks are sent there
	// for placement. Empty leaves them UNCLAIMED/PENDING. Calls to the auctioneer and to reps
	// present the BBS's own certificate (tls).
	AuctioneerAddress string `json:"auctioneer_address"`
	// MaxInstances bounds a desired LRP's instance count; the desired record and all its
	// instances are written in one etcd transaction, so etcd's --max-txn-ops must exceed it.
	MaxInstances int32 `json:"max_instances"`
	// MaxTaskRejections fails a task after this many rejections.
	MaxTaskRejections int32 `json:"max_task_rejections"`
	// IncomingPortRange is the inclusive range of router ports ("start-end") that TCP and UDP
	// routes (cf-router incoming_port) may claim; a desire or update outside it is
	// InvalidArgument. Keep it equal to the router's incoming_port_range.
	IncomingPortRange string `json:"incoming_port_range"`
	// BookmarkInterval is how often an idle event subscriber gets a bookmark.
	BookmarkInterval Duration `json:"bookmark_interval"`
	// EventRing is how many events are kept in memory for resuming subscribers (the ring holds
	// between this and twice this many, whole revisions; older resumes get their own etcd watch).
	EventRing int `json:"event_ring"`
	// CallbackWorkers is how many task completion callbacks are delivered at once.
	CallbackWorkers int `json:"callback_workers"`
	// ConvergenceInterval is the time between convergence passes of the leader (which also
	// converges at once when a cell's presence disappears).
	ConvergenceInterval Duration `json:"convergence_interval"`
	// CompactionInterval is how often the leader compacts etcd's history, keeping at least
	// this much of it (a subscriber resuming from an older revision lists again). Zero never
	// compacts: leave it to etcd's --auto-compaction-* flags then, or etcd's database grows
	// with every change until it reaches its quota and refuses writes.
	CompactionInterval Duration `json:"compaction_interval"`
	// UnclaimedTimeout is how long an instance may stay UNCLAIMED before convergence auctions
	// it again; PENDING tasks and completed tasks' callbacks are retried after the same time.
	UnclaimedTimeout Duration `json:"unclaimed_timeout"`
	// DrainTimeout bounds drain-first stops: a RUNNING, routed instance the BBS stops (scale
	// down, removal, retirement, the end of an evacuation) is first withdrawn from routing, and
	// its cell is asked to stop it once every route-emitter has reported publishing that, or
	// after this long, whichever comes first. Zero stops instances without draining them.
	DrainTimeout Duration `json:"drain_timeout"`
	// ClaimedTimeout is how long an instance may stay CLAIMED on a cell that is present before
	// convergence unclaims it and auctions it again (its rep never reported it running).
	ClaimedTimeout Duration `json:"claimed_timeout"`
	// PendingTaskTimeout fails a task that has not started this long after it was desired.
	PendingTaskTimeout Duration `json:"pending_task_timeout"`
	// CompletedTaskTimeout deletes a completed task that was not resolved this long after it
	// completed (after its callback retries).
	CompletedTaskTimeout Duration `json:"completed_task_timeout"`
	// Transformers is the transformer plugin chain every desired LRP and task passes through,
	// in order, before it is stored (on desire, and on update over the merged result). Each
	// plugin is described at start-up: one that cannot be, under failure_policy "fail",
	// stops the BBS (see docs/plugins.md).
	Transformers []transform.PluginConfig `json:"transformers,omitempty"`
	// MaxInflightWrites bounds the write calls served at once (new work may hold half of
	// them); a write over the bound is refused at once with ResourceExhausted and a
	// retry-after of OverloadRetryAfter rather than queued until its deadline. Zero is
	// unbounded. It should stay above the auctioneer's max_inflight_starts: each starting
	// container brings a claim and a RUNNING report, and a bound below what the auctioneer
	// lets start makes those bounce (see docs/decisions/0013-overload-backpressure.md).
	MaxInflightWrites int `json:"max_inflight_writes"`
	// OverloadRetryAfter is how long a refused caller is told to wait.
	OverloadRetryAfter Duration `json:"overload_retry_after"`
	// EtcdUnreachableTimeout bounds how long a write waits for etcd to be reachable: past it
	// the write is answered Unavailable with retry advice and is never made (see
	// docs/architecture.md, "when etcd is down").
	EtcdUnreachableTimeout Duration `json:"etcd_unreachable_timeout"`
	// WriteTimeout bounds one write as a whole; a write sent to etcd that is not confirmed in
	// time is answered DeadlineExceeded: it may or may not have been made.
	WriteTimeout Duration `json:"write_timeout"`
	// Encryption seals the records that carry user data (run infos: env, actions, properties;
	// tasks) with AES-256-GCM under active_key_label, and opens those sealed under any key of
	// keys (files only, never flags). The leader re-encrypts records under an older key (or
	// clear) in the background. Absent: records are stored clear. See docs/operations.md,
	// "Encryption keys and rotation".
	Encryption sealing.Config `json:"encryption,omitzero"`
	// ReencryptBatch is how many records one re-encryption transaction of the leader rewrites
	// (one transaction in flight at a time).
	ReencryptBatch int `json:"reencrypt_batch"`
}

// DefaultCompactionInterval is the default of Config.CompactionInterval, the interval of
// Kubernetes' API server.
const DefaultCompactionInterval = 5 * time.Minute

// DefaultIncomingPortRange is the default of Config.IncomingPortRange: every unprivileged port.
const DefaultIncomingPortRange = "1024-65535"

// Duration is a time.Duration written as a string ("10s") in config files and flags.
type Duration = config.Duration

// Default is the configuration of a BBS next to a local etcd.
func Default() Config {
	return Config{
		Base:              serviceconfig.DefaultBase("127.0.0.1:8889"),
		Etcd:              serviceconfig.DefaultEtcd(),
		Election:          serviceconfig.DefaultElection(),
		MaxInstances:      models.DefaultLimits().MaxInstances,
		MaxTaskRejections: 3,
		IncomingPortRange: DefaultIncomingPortRange,
		BookmarkInterval:  Duration(10 * time.Second),
		EventRing:         100_000,
		CallbackWorkers:   8,
		ReencryptBatch:    64,
		// About a quarter second of the group committer's throughput at full batches.
		MaxInflightWrites:  4096,
		OverloadRetryAfter: Duration(100 * time.Millisecond),

		EtcdUnreachableTimeout: Duration(store.DefaultUnreachableTimeout),
		WriteTimeout:           Duration(store.DefaultWriteTimeout),

		ConvergenceInterval:  Duration(converge.DefaultInterval),
		CompactionInterval:   Duration(DefaultCompactionInterval),
		DrainTimeout:         Duration(core.DefaultDrainTimeout),
		UnclaimedTimeout:     Duration(converge.DefaultUnclaimedTimeout),
		ClaimedTimeout:       Duration(converge.DefaultClaimedTimeout),
		PendingTaskTimeout:   Duration(converge.DefaultPendingTaskTimeout),
		CompletedTaskTimeout: Duration(converge.DefaultCompletedTaskTimeout),
	}
}

// LoadFile overlays the JSON config file at path on c.
func (c *Config) LoadFile(path string) error { return config.LoadJSON(path, c) }

// Flags binds the BBS's command-line flags to c: the shared ones (serviceconfig: -listen, the
// server TLS flags, -metrics-address, -log-level, -log-format; -etcd-endpoints and the etcd
// TLS flags; -lock-ttl) and the BBS's own.
func (c *Config) Flags(fs *flag.FlagSet) {
	serviceconfig.BaseFlags(fs, &c.Base, "server (also presented to the auctioneer and reps)")
	serviceconfig.EtcdFlags(fs, &c.Etcd)
	serviceconfig.ElectionFlags(fs, &c.Election)
	fs.StringVar(&c.AuctioneerAddress, "auctioneer-address", c.AuctioneerAddress, "auctioneer gRPC address for placing new work; several comma-separated addresses of HA auctioneers: the leader among them is followed")
	fs.Var(&c.ConvergenceInterval, "convergence-interval", "time between convergence passes of the leader")
	fs.Var(&c.CompactionInterval, "compaction-interval", "how often the leader compacts etcd's history, keeping at least this much of it (0: never; leave it to etcd)")
	fs.Var(&c.DrainTimeout, "drain-timeout", "how long an instance being stopped waits, unrouted, for the route-emitters to publish that before its cell stops it (0: no drain)")
	fs.Var(&c.UnclaimedTimeout, "unclaimed-timeout", "re-auction instances UNCLAIMED (and retry pending tasks and callbacks) after this long")
	fs.Var(&c.ClaimedTimeout, "claimed-timeout", "unclaim and re-auction instances CLAIMED this long on a present cell without being reported running")
	fs.Var(&c.EtcdUnreachableTimeout, "etcd-unreachable-timeout", "answer a write Unavailable (never made) when etcd cannot be reached for this long")
	fs.Var(&c.WriteTimeout, "write-timeout", "answer a write sent to etcd but not confirmed this long DeadlineExceeded (may have been made)")
	fs.Var(&c.PendingTaskTimeout, "pending-task-timeout", "fail tasks not started within this long")
	fs.Var(&c.CompletedTaskTimeout, "completed-task-timeout", "delete completed tasks not resolved within this long")
	fs.Var(transform.Flag{Plugins: &c.Transformers}, "transformer", "transformer plugin NAME=SOCKET[,kinds=desired_lrp+task][,timeout=2s][,failure_policy=fail|ignore][,check_determinism=true][,max_concurrency=32]; repeat for a chain, in order (see docs/plugins.md)")
}

// Validate reports every problem that would stop the BBS from starting.
func (c Config) Validate() error {
	errs := []error{c.Base.Validate(), c.Etcd.Validate(), c.Election.Validate()}
	if _, _, err := config.ParsePortRange(c.IncomingPortRange); err != nil {
		errs = append(errs, fmt.Errorf("incoming_port_range: %w", err))
	}
	if c.MaxInstances <= 0 {
		errs = append(errs, fmt.Errorf("max_instances must be positive, got %d", c.MaxInstances))
	}
	if c.MaxTaskRejections <= 0 {
		errs = append(errs, fmt.Errorf("max_task_rejections must be positive, got %d", c.MaxTaskRejections))
	}
	if c.BookmarkInterval <= 0 {
		errs = append(errs, errors.New("bookmark_interval must be positive"))
	}
	if c.EventRing <= 0 {
		errs = append(errs, errors.New("event_ring must be positive"))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, errors.New("drain_timeout must not be negative"))
	}
	if c.CompactionInterval < 0 {
		errs = append(errs, errors.New("compaction_interval must not be negative"))
	}
	if c.CallbackWorkers <= 0 {
		errs = append(errs, errors.New("callback_workers must be positive"))
	}
	if err := transform.ValidateChain(c.Transformers); err != nil {
		errs = append(errs, err)
	}
	if err := c.Encryption.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.ReencryptBatch <= 0 || c.ReencryptBatch > 128 {
		errs = append(errs, fmt.Errorf("reencrypt_batch must be between 1 and 128 (etcd's default --max-txn-ops), got %d", c.ReencryptBatch))
	}
	if c.MaxInflightWrites < 0 {
		errs = append(errs, fmt.Errorf("max_inflight_writes must not be negative, got %d", c.MaxInflightWrites))
	}
	if c.MaxInflightWrites > 0 && c.OverloadRetryAfter <= 0 {
		errs = append(errs, errors.New("overload_retry_after must be positive with max_inflight_writes"))
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{
		{"convergence_interval", c.ConvergenceInterval},
		{"unclaimed_timeout", c.UnclaimedTimeout},
		{"claimed_timeout", c.ClaimedTimeout},
		{"pending_task_timeout", c.PendingTaskTimeout},
		{"completed_task_timeout", c.CompletedTaskTimeout},
		{"etcd_unreachable_timeout", c.EtcdUnreachableTimeout},
		{"write_timeout", c.WriteTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", d.name))
		}
	}
	return errors.Join(errs...)
}

// Service is a running BBS.
type Service struct {
	cfg        Config
	log        hclog.Logger
	store      *store.Store
	core       *core.Core
	callbacks  *callback.Worker
	background *core.Background // runs the work requests promise but do not wait for
	drainer    *core.Drainer    // stops the instances this BBS drains once they are drained
	server     *grpcx.Server

	reps       *reppool.Pool
	auctioneer *peers.Auctioneer // nil without an auctioneer address

	converger      *converge.Converger
	manualConverge bool
	registry       *prometheus.Registry
	metrics        *metrics.Server // nil without a metrics address
	transformers   *transform.Chain
	etcd           *clientv3.Client
	election       atomic.Pointer[etcdx.Election]
	keyring        *sealing.Keyring // nil: encryption off
}

// Option adjusts a BBS beyond its Config (tests and embedding).
type Option func(*options)

type options struct {
	now            func() time.Time
	manual         bool
	listener       net.Listener
	cells          CellClient
	suspectsPerTxn int
}

// CellClient is how the BBS asks a cell's rep to stop an instance or cancel a task (see
// WithCellClient).
type CellClient interface {
	// StopLRPInstance asks the rep of cell to stop the instance key/instance.
	StopLRPInstance(ctx context.Context, cell *modelsv1.CellPresence, key *modelsv1.ActualLRPKey, instance *modelsv1.ActualLRPInstanceKey) error
	// CancelTask asks the rep of cell to cancel the task taskGuid.
	CancelTask(ctx context.Context, cell *modelsv1.CellPresence, taskGuid string) error
}

// WithClock makes the BBS read time from now (lifecycle timestamps, crash backoff and
// convergence deadlines); tests use it to move time without sleeping.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithManualConvergence runs no convergence loop and campaigns for no leadership: the caller
// drives convergence itself (the package's tests, through export_test.go).
func WithManualConvergence() Option { return func(o *options) { o.manual = true } }

// WithSuspectsPerTransaction sets how many instances of one lost cell convergence replaces in
// one transaction (default 64; 1 replaces each in its own transaction, as before decision 0050),
// for the benchmark that compares the two.
func WithSuspectsPerTransaction(n int) Option { return func(o *options) { o.suspectsPerTxn = n } }

// WithListener makes the BBS serve its API on l, bound by the caller, instead of listening on
// listen_address (which then only names the address): callers that must know the address
// before the BBS starts bind first instead of picking a free port for later.
func WithListener(l net.Listener) Option { return func(o *options) { o.listener = l } }

// WithCellClient makes the BBS reach reps through cells instead of its gRPC rep clients (tests
// that need a rep that hangs or fails).
func WithCellClient(cells CellClient) Option { return func(o *options) { o.cells = cells } }

// New builds a BBS over an etcd client; Run starts it.
func New(cfg Config, logger hclog.Logger, etcd *clientv3.Client, opts ...Option) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bbs config: %w", err)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	keyring, err := cfg.Encryption.Keyring()
	if err != nil {
		return nil, fmt.Errorf("bbs config: %w", err)
	}
	registry := metrics.NewRegistry()
	convergeMetrics := converge.NewMetrics(registry)
	limits := models.DefaultLimits()
	limits.MaxInstances = cfg.MaxInstances
	portMin, portMax, _ := config.ParsePortRange(cfg.IncomingPortRange) // checked by Validate
	limits.IncomingPortMin, limits.IncomingPortMax = uint32(portMin), uint32(portMax)
	// Every plugin is described now: a bad one stops the BBS before it serves.
	transformers, err := transform.Load(context.Background(), cfg.Transformers, logger.Named("transform"), registry, transform.WithLimits(limits))
	if err != nil {
		return nil, fmt.Errorf("transformers: %w", err)
	}
	// Outgoing calls (auctioneer, reps) present the BBS's own certificate.
	clientCfg := grpcx.ClientConfig{TLS: cfg.TLS}
	// Connections to reps are closed when their cell's presence disappears.
	repPool := reppool.New(clientCfg)
	txnDuration := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gavel_bbs_store_transaction_duration_seconds",
		Help:    "How long each etcd transaction of the store's group committer took (the BBS's etcd write latency).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)})
	registry.MustRegister(txnDuration)
	writeWait := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gavel_bbs_store_write_wait_seconds",
		Help:    "How long each committed write waited: stage=commit for the group committer's answer (its queue and transaction), stage=cache for this BBS's cache to reflect it.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"stage"})
	registry.MustRegister(writeWait)
	commitWait, cacheWait := writeWait.WithLabelValues("commit"), writeWait.WithLabelValues("cache")
	st := store.New(etcd, store.Options{Logger: logger.Named("store"), EventRing: cfg.EventRing, CellsLeft: repPool.Retain,
		ObserveTransaction: func(d time.Duration) { txnDuration.Observe(d.Seconds()) },
		ObserveWrite: func(commit, cache time.Duration) {
			commitWait.Observe(commit.Seconds())
			cacheWait.Observe(cache.Seconds())
		},
		UnreachableTimeout: time.Duration(cfg.EtcdUnreachableTimeout), WriteTimeout: time.Duration(cfg.WriteTimeout),
		Keyring: keyring, ResealBatch: cfg.ReencryptBatch})
	callbackQueue := callback.NewQueue(0, logger.Named("callback"))
	reps := peers.NewReps(repPool)
	coreCfg := core.Config{
		Limits:            limits,
		MaxTaskRejections: cfg.MaxTaskRejections,
		Logger:            logger.Named("core"),
		Callbacks:         callbackQueue,
		Cells:             core.CellClient(reps),
		Now:               o.now,
		Auctions:          convergeMetrics,
		Background:        core.NewBackground(0, 0, logger.Named("background")),
		DrainTimeout:      time.Duration(cfg.DrainTimeout),
		Drainer:           core.NewDrainer(logger.Named("drainer")),
	}
	if cfg.DrainTimeout == 0 {
		coreCfg.DrainTimeout = -1 // stop at once
	}
	if o.cells != nil {
		coreCfg.Cells = o.cells
	}
	if transformers.Len() > 0 {
		coreCfg.Transformer = transformers
	}
	var auctioneer *peers.Auctioneer
	if cfg.AuctioneerAddress != "" {
		a, err := peers.DialAuctioneers([]string{cfg.AuctioneerAddress}, clientCfg, 10*time.Millisecond, logger.Named("auctioneer-client"))
		if err != nil {
			_ = transformers.Close()
			return nil, fmt.Errorf("auctioneer client: %w", err)
		}
		a.CountFailures(convergeMetrics)
		auctioneer = a
		coreCfg.Auctioneer = auctioneer
	}
	c := core.New(st, coreCfg)
	callbacks := callback.New(callback.Config{Workers: cfg.CallbackWorkers, Logger: logger.Named("callback")}, callbackQueue, c.Tasks)
	v := validate.Validator{Limits: limits}
	audit := logger.Named("audit")
	authorizer := authz.New(cfg.Authz, api.Policy(cfg.Authz, api.Lookup{DesiredLRP: c.DesiredLRPs.DesiredLRP, Task: c.Tasks.Task}), audit)
	server, err := grpcx.NewServer(grpcx.ServerConfig{ListenAddress: cfg.ListenAddress, TLS: cfg.TLS}, logger.Named("grpc"),
		grpcx.WithListener(o.listener),
		grpcx.WithUnaryInterceptors(authorizer.Unary(),
			api.NewAdmission(cfg.MaxInflightWrites, time.Duration(cfg.OverloadRetryAfter), logger.Named("admission")).UnaryServerInterceptor(),
			rpcerr.UnaryServerInterceptor(rpcerr.WithLogger(logger.Named("grpc")))),
		grpcx.WithStreamInterceptors(authorizer.Stream(), rpcerr.StreamServerInterceptor(rpcerr.WithLogger(logger.Named("grpc")))),
		grpcx.WithValidator(func(req any) error { return rpcerr.ToStatus(v.Request(req)) }),
		grpcx.WithMetrics(registry),
		grpcx.WithServerOptions(grpc.ForceServerCodecV2(api.Codec())),
	)
	if err != nil {
		_ = transformers.Close()
		return nil, err
	}
	bbsv1.RegisterBBSServiceServer(server.GRPC, api.New(c, st, time.Duration(cfg.BookmarkInterval), api.WithLogs(reps), api.WithInstanceAccess(reps, audit)))
	conv := converge.New(c, st, converge.Config{
		Interval:             time.Duration(cfg.ConvergenceInterval),
		UnclaimedTimeout:     time.Duration(cfg.UnclaimedTimeout),
		ClaimedTimeout:       time.Duration(cfg.ClaimedTimeout),
		PendingTaskTimeout:   time.Duration(cfg.PendingTaskTimeout),
		CompletedTaskTimeout: time.Duration(cfg.CompletedTaskTimeout),
		DrainTimeout:         time.Duration(cfg.DrainTimeout),
		Logger:               logger.Named("converge"),
		Metrics:              convergeMetrics,
		SuspectsPerTxn:       o.suspectsPerTxn,
	})
	svc := &Service{cfg: cfg, log: logger, store: st, core: c, callbacks: callbacks, server: server, background: coreCfg.Background,
		reps: repPool, auctioneer: auctioneer, transformers: transformers,
		drainer: coreCfg.Drainer, converger: conv, manualConverge: o.manual, registry: registry, etcd: etcd, keyring: keyring}
	svc.metrics = cfg.MetricsServer(registry)
	registerCommitMetrics(registry, st)
	registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gavel_bbs_records_to_reencrypt",
		Help: "Stored records (run infos and tasks) not yet sealed under the active encryption key; the leader re-encrypts them in the background."},
		func() float64 { return float64(st.ToReseal()) }))
	registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gavel_bbs_compacted_revision",
		Help: "The etcd revision this instance, as leader, last compacted etcd's history up to (compaction_interval); zero before its first compaction."},
		func() float64 { return float64(st.CompactedRevision()) }))
	return svc, nil
}

// registerCommitMetrics exports the store's group-commit counts.
func registerCommitMetrics(reg prometheus.Registerer, st *store.Store) {
	counter := func(name, help string, v func(store.CommitStats) int64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(v(st.CommitStats())) }))
	}
	counter("gavel_bbs_store_transactions_total", "etcd transactions sent by the store's group committer.",
		func(s store.CommitStats) int64 { return s.Transactions })
	counter("gavel_bbs_store_batched_transactions_total", "etcd transactions that carried more than one change request.",
		func(s store.CommitStats) int64 { return s.Batched })
	counter("gavel_bbs_store_commit_requests_total", "change requests committed by the store.",
		func(s store.CommitStats) int64 { return s.Requests })
	counter("gavel_bbs_store_commit_retried_alone_total", "requests of a batch etcd refused as too big, sent again alone.",
		func(s store.CommitStats) int64 { return s.RetriedAlone })
	counter("gavel_bbs_store_commit_conflicts_total", "requests of a grouped transaction whose own compare failed (a lost race).",
		func(s store.CommitStats) int64 { return s.Conflicts })
	counter("gavel_bbs_store_commit_resent_total", "requests of a grouped transaction that failed on another request's compare, sent again together.",
		func(s store.CommitStats) int64 { return s.Resent })
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gavel_bbs_cell_presences_lost_total",
		Help: "Cell presences this BBS saw disappear from etcd (a lease expired or was revoked: a cell was lost or stopped)."},
		func() float64 { return float64(st.CellsLost()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gavel_bbs_present_cells",
		Help: "Cells whose presence is registered in etcd."},
		func() float64 { cells, _ := st.Cells(); return float64(len(cells)) }))
}

// CommitStats counts the store's group commits since the BBS started: how many etcd
// transactions it sent and how many change requests they carried (the scale harness reports
// requests per transaction).
type CommitStats = store.CommitStats

// CommitStats counts the store's group commits since the BBS started.
func (s *Service) CommitStats() CommitStats { return s.store.CommitStats() }

// Run fills the cache from etcd, then serves the API until ctx ends; ready is called once the
// API is serving.
func (s *Service) Run(ctx context.Context, ready func()) error {
	defer func() { _ = s.reps.Close() }() // closing idle connections at exit cannot fail usefully
	defer s.transformers.Close()
	members := []lifecycle.Member{
		{Name: "layout", Runner: lifecycle.RunFunc(s.runLayout)},
		{Name: "store", Runner: lifecycle.RunFunc(s.store.Run)},
		{Name: "callbacks", Runner: lifecycle.RunFunc(s.callbacks.Run)},
		// Stops after the API and convergence, which queue its work.
		{Name: "background", Runner: lifecycle.RunFunc(s.background.Run)},
		// Waits for drains the API and convergence start; queues stops on background.
		{Name: "drainer", Runner: lifecycle.RunFunc(s.drainer.Run)},
	}
	if s.auctioneer != nil {
		defer s.auctioneer.Close()
		members = append(members, lifecycle.Member{Name: "auctioneer-client", Runner: lifecycle.RunFunc(s.auctioneer.Run)})
	}
	members = append(members, s.metrics.Members()...)
	if !s.manualConverge {
		members = append(members, lifecycle.Member{Name: "converger", Runner: lifecycle.RunFunc(s.runConvergence)})
	}
	members = append(members, lifecycle.Member{Name: "grpc", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
		return s.server.Run(ctx, func() {
			r()
			ready()
		})
	})})
	return lifecycle.Run(ctx, s.log, members...)
}

// runLayout brings the store to the layout this BBS knows before anything else starts, and
// stops the BBS when a newer release begins migrating it (layout.Serve).
func (s *Service) runLayout(ctx context.Context, ready func()) error {
	return layout.Serve(ctx, s.etcd, layout.Options{
		Service:    store.LayoutService,
		Current:    store.LayoutVersion,
		Migrations: store.Migrations(s.keyring),
		LockTTL:    time.Duration(s.cfg.LockTTL),
		Logger:     s.log.Named("layout"),
	}, ready)
}

// runConvergence campaigns for the BBS leadership (etcd election "bbs") and, while leading,
// converges on the timer and whenever a cell disappears, re-encrypts the records not sealed
// under the active key, and compacts etcd's history. Every instance serves the API either way.
func (s *Service) runConvergence(ctx context.Context, ready func()) error {
	e, err := s.cfg.NewElection(s.etcd, LeaderService, s.cfg.ListenAddress, s.log.Named("election"))
	if err != nil {
		return err
	}
	s.election.Store(e)
	ready()
	return e.Run(ctx, func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return s.converger.Run(ctx, s.store.CellGone()) })
		if s.keyring != nil {
			g.Go(func() error { return s.reencrypt(ctx) })
		}
		if every := time.Duration(s.cfg.CompactionInterval); every > 0 {
			g.Go(func() error { return s.store.CompactHistory(ctx, every) })
		}
		return g.Wait()
	})
}

// reencrypt rewrites, in bounded batches, every run info and task not sealed under the active
// key, once the cache is full; see sealing.Rotation.
func (s *Service) reencrypt(ctx context.Context) error {
	select {
	case <-s.store.Synced():
	case <-ctx.Done():
		return nil
	}
	return sealing.Rotation{
		Step: func(ctx context.Context) (int, int, error) {
			n, err := s.store.Reseal(ctx)
			return n, s.store.ToReseal(), err
		},
		Active:   s.keyring.Active(),
		Interval: time.Duration(s.cfg.ConvergenceInterval),
		Logger:   s.log.Named("reencrypt"),
	}.Run(ctx)
}

// LeaderService is the election the BBS instances campaign in (key /gavel/v1/lock/bbs); the
// leader runs convergence.
const LeaderService = "bbs"

// RecordsToReencrypt counts the stored run infos and tasks not yet sealed under the active key
// (gavel_bbs_records_to_reencrypt), as of this instance's cache; zero with encryption off.
func (s *Service) RecordsToReencrypt() int { return s.store.ToReseal() }

// IsLeader reports whether this instance leads (and so runs convergence).
func (s *Service) IsLeader() bool {
	e := s.election.Load()
	return e != nil && e.IsLeader()
}

// MetricsAddr is the metrics listener's bound address once Run has called ready (nil when
// metrics are off).
func (s *Service) MetricsAddr() net.Addr { return s.metrics.Addr() }

// Addr is the API's bound address once Run has called ready.
func (s *Service) Addr() net.Addr { return s.server.Addr() }

// LayoutVersion is the version of the key layout this BBS reads and writes (pkg/layout): it
// migrates an older store before serving and refuses a newer one.
const LayoutVersion = store.LayoutVersion
