// Package nsync is Gavel's bridge from a platform to the BBS: it speaks in apps, spaces, stacks
// and placement pools (nsyncv1.NsyncService), turns them into DesiredLRPs (domain cf-apps) and
// tasks (domain cf-tasks) through the transformer chain, restarts apps without downtime, and
// keeps the BBS in step with its own records in etcd by a leader-elected bulk loop that
// refreshes the cf-apps domain only after a complete pass.
package nsync

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/authz"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/serviceconfig"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/services/nsync/internal/api"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
	"github.com/gavel-sched/gavel/services/nsync/internal/core"
	"github.com/gavel-sched/gavel/services/nsync/internal/store"
)

// Config is nsync's configuration. Fields are set from a JSON config file and flags.
type Config struct {
	// Base is where the gRPC API (NsyncService) listens and its TLS, log, metrics_address and
	// authz (admin may make every call, read-only may list apps and pools, every other
	// identity is refused).
	serviceconfig.Base
	// Etcd is the etcd client of nsync's own records (and its election): etcd_endpoints and
	// etcd_tls.
	serviceconfig.Etcd
	// Election is the lease of the bulk loop's leadership (lock_ttl): a vanished leader is
	// replaced this long afterwards.
	serviceconfig.Election
	// Config is how nsync reaches the BBS: bbs_address (or bbs_addresses) and bbs_tls.
	bbsclient.Config
	// Stacks maps each stack a platform may name to its rootfs URI, e.g.
	// {"cflinuxfs4": "preloaded:cflinuxfs4"}. Stack names are lower case.
	Stacks map[string]string `json:"stacks"`
	// BulkInterval is the time between bulk passes of the leader.
	BulkInterval Duration `json:"bulk_interval"`
	// DomainTTL is how long the cf-apps domain stays fresh after a complete bulk pass; longer
	// than bulk_interval, so that one slow pass does not let it lapse.
	DomainTTL Duration `json:"domain_ttl"`
	// RestartTimeout bounds how long RestartApp waits for the new version to run before it
	// gives up (the old version keeps serving).
	RestartTimeout Duration `json:"restart_timeout"`
	// RouteDrain is how long a restart's old version keeps running without routes before it
	// is removed: long enough for routers to drop it and for its requests in flight to finish.
	RouteDrain Duration `json:"route_drain"`
	// ProgressDeadline is how long a deployment may go without progress (a new instance
	// healthy, an old one retired) before it fails; a deploy's progress_deadline_ms overrides it.
	ProgressDeadline Duration `json:"progress_deadline"`
	// DeployPoll is how often the leader steps every deployment.
	DeployPoll Duration `json:"deploy_poll"`
	// Plugins is the transformer chain every LRP and task nsync builds passes through, in
	// order, before it is validated and sent to the BBS (CF apps only; the BBS has its own
	// chain for everything). See pkg/transform and docs/plugins.md.
	Plugins []transform.PluginConfig `json:"plugins,omitempty"`
	// MaxInstances is the largest instance count of an app (the BBS's max_instances).
	MaxInstances int32 `json:"max_instances"`
	// Encryption seals app records (they carry env, command and routes) with AES-256-GCM under
	// active_key_label and opens those sealed under any key of keys (files only), as the BBS's
	// section of the same name; the bulk leader re-encrypts records under an older key (or
	// clear). Absent: records are stored clear. See docs/operations.md.
	Encryption sealing.Config `json:"encryption,omitzero"`
}

// Duration is a time.Duration written as a string ("10s") in config files and flags.
type Duration = config.Duration

// Default is the configuration of an nsync next to a local BBS and etcd.
func Default() Config {
	return Config{
		Base:             serviceconfig.DefaultBase("127.0.0.1:8895"),
		Etcd:             serviceconfig.DefaultEtcd(),
		Election:         serviceconfig.DefaultElection(),
		Config:           bbsclient.Default(),
		Stacks:           map[string]string{"cflinuxfs4": "preloaded:cflinuxfs4"},
		BulkInterval:     Duration(30 * time.Second),
		DomainTTL:        Duration(2 * time.Minute),
		RestartTimeout:   Duration(2 * time.Minute),
		RouteDrain:       Duration(5 * time.Second),
		ProgressDeadline: Duration(5 * time.Minute),
		DeployPoll:       Duration(250 * time.Millisecond),
		MaxInstances:     models.DefaultMaxInstances,
	}
}

// LoadFile overlays the JSON config file at path on c. A file that sets stacks replaces the
// default stacks (JSON would merge the maps).
func (c *Config) LoadFile(path string) error {
	defaults := c.Stacks
	c.Stacks = nil
	if err := config.LoadJSON(path, c); err != nil {
		c.Stacks = defaults
		return err
	}
	if c.Stacks == nil {
		c.Stacks = defaults
	}
	return nil
}

// Flags binds nsync's command-line flags to c: the shared ones (serviceconfig: -listen, the
// server TLS flags, -metrics-address, -log-level, -log-format; -etcd-endpoints and the etcd TLS
// flags; -lock-ttl), the BBS client's (bbsclient.Flags) and nsync's own.
func (c *Config) Flags(fs *flag.FlagSet) {
	serviceconfig.BaseFlags(fs, &c.Base, "server")
	serviceconfig.EtcdFlags(fs, &c.Etcd)
	serviceconfig.ElectionFlags(fs, &c.Election)
	bbsclient.Flags(fs, &c.Config)
	fs.Var(config.JSONMap{Values: &c.Stacks}, "stacks", `stacks as JSON name→rootfs URI, e.g. '{"cflinuxfs4":"preloaded:cflinuxfs4"}'`)
	fs.Var(transform.Flag{Plugins: &c.Plugins}, "plugin", "transformer plugin NAME=SOCKET[,kinds=desired_lrp+task][,timeout=2s][,failure_policy=fail|ignore][,check_determinism=true][,max_concurrency=32] run on what nsync builds; repeat for a chain, in order (see docs/plugins.md)")
	fs.Var(&c.BulkInterval, "bulk-interval", "time between bulk passes of the leader")
	fs.Var(&c.DomainTTL, "domain-ttl", "how long cf-apps stays fresh after a complete bulk pass")
	fs.Var(&c.RestartTimeout, "restart-timeout", "how long a restart waits for the new version to run")
	fs.Var(&c.RouteDrain, "route-drain", "how long a restarted app's old version runs unrouted before it is removed")
	fs.Var(&c.ProgressDeadline, "progress-deadline", "how long a deployment may go without progress before it fails")
	fs.Var(&c.DeployPoll, "deploy-poll", "how often the leader steps every deployment")
}

// Validate reports every problem that would stop nsync from starting.
func (c Config) Validate() error {
	errs := []error{c.Base.Validate(), c.Etcd.Validate(), c.Election.Validate(),
		c.Config.Validate()} // the last: the BBS client's fields
	if len(c.Stacks) == 0 {
		errs = append(errs, errors.New("stacks: at least one stack is required"))
	}
	for name, rootfs := range c.Stacks {
		if name == "" || name != strings.ToLower(name) {
			errs = append(errs, fmt.Errorf("stacks: stack name %q must be non-empty and lower case", name))
		}
		if err := models.ValidateRootfs("stacks["+name+"]", rootfs); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"bulk_interval", c.BulkInterval}, {"domain_ttl", c.DomainTTL}, {"restart_timeout", c.RestartTimeout}, {"route_drain", c.RouteDrain}, {"progress_deadline", c.ProgressDeadline}, {"deploy_poll", c.DeployPoll}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", d.name))
		}
	}
	if c.DomainTTL > 0 && c.DomainTTL <= c.BulkInterval {
		errs = append(errs, fmt.Errorf("domain_ttl (%s) must be longer than bulk_interval (%s)", c.DomainTTL, c.BulkInterval))
	}
	if c.MaxInstances <= 0 {
		errs = append(errs, fmt.Errorf("max_instances must be positive, got %d", c.MaxInstances))
	}
	if err := transform.ValidateChain(c.Plugins); err != nil {
		errs = append(errs, fmt.Errorf("plugins: %w", err))
	}
	if err := c.Encryption.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Transformer augments the LRPs and tasks nsync builds before they reach the BBS; the chain
// loaded from Config.Plugins is one.
type Transformer interface {
	// DesiredLRP returns the transformed LRP.
	DesiredLRP(ctx context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error)
	// Task returns the transformed task.
	Task(ctx context.Context, t *modelsv1.Task) (*modelsv1.Task, error)
}

// Option adjusts nsync beyond its Config (tests and embedding).
type Option func(*options)

type options struct {
	transformer Transformer
}

// WithTransformer makes nsync pass what it builds through tr instead of the chain of
// Config.Plugins (tests and embedding); a nil tr keeps the chain.
func WithTransformer(tr Transformer) Option { return func(o *options) { o.transformer = tr } }

// LayoutVersion is the version of the key layout this nsync reads and writes (pkg/layout): it
// migrates an older store before serving and refuses a newer one.
const LayoutVersion = store.LayoutVersion

// LeaderService is the election nsync instances campaign in (key /gavel/v1/lock/nsync); the
// leader runs the bulk loop. Every instance serves the API.
const LeaderService = "nsync"

// Service is a running nsync.
type Service struct {
	cfg      Config
	log      hclog.Logger
	core     *core.Core
	etcd     *clientv3.Client
	server   *grpcx.Server
	metrics  *metrics.Server // nil without metrics_address
	m        *serviceMetrics
	chain    *transform.Chain
	election atomic.Pointer[etcdx.Election]
	store    *store.Store
	keyring  *sealing.Keyring // nil: encryption off
}

// New builds nsync over an etcd client (its records and election) and a BBS client. It loads
// the transformer chain of cfg.Plugins (describing every plugin, so a bad one stops nsync
// here), unless WithTransformer gives another. Run starts it.
func New(cfg Config, logger hclog.Logger, etcd *clientv3.Client, bbs bbsv1.BBSServiceClient, opts ...Option) (*Service, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("nsync config: %w", err)
	}
	if etcd == nil || bbs == nil {
		return nil, errors.New("nsync: an etcd client and a BBS client are required")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	keyring, err := cfg.Encryption.Keyring()
	if err != nil {
		return nil, fmt.Errorf("nsync config: %w", err)
	}
	m := newServiceMetrics()
	st := store.New(etcdx.Guard(etcd, etcdx.DefaultUnreachableTimeout), keyring)
	limits := models.DefaultLimits()
	limits.MaxInstances = cfg.MaxInstances
	chain, err := transform.Load(context.Background(), cfg.Plugins, logger.Named("transform"), m.registry, transform.WithLimits(limits))
	if err != nil {
		return nil, fmt.Errorf("nsync plugins: %w", err)
	}
	var tr core.Transformer
	switch {
	case o.transformer != nil:
		tr = o.transformer
	case chain.Len() > 0:
		tr = chain
	}
	c := core.New(st, bbs, core.Config{
		Stacks:           build.Stacks(cfg.Stacks),
		Limits:           limits,
		Transformer:      tr,
		RestartTimeout:   time.Duration(cfg.RestartTimeout),
		RouteDrain:       time.Duration(cfg.RouteDrain),
		DomainTTL:        time.Duration(cfg.DomainTTL),
		ProgressDeadline: time.Duration(cfg.ProgressDeadline),
		DeployPoll:       time.Duration(cfg.DeployPoll),
		Logger:           logger.Named("core"),
		Observer:         m,
	})
	authorizer := authz.New(cfg.Authz, Policy, logger.Named("audit"))
	server, err := grpcx.NewServer(grpcx.ServerConfig{ListenAddress: cfg.ListenAddress, TLS: cfg.TLS}, logger.Named("grpc"),
		grpcx.WithUnaryInterceptors(authorizer.Unary(), rpcerr.UnaryServerInterceptor(rpcerr.WithLogger(logger.Named("grpc")))),
		grpcx.WithStreamInterceptors(authorizer.Stream(), rpcerr.StreamServerInterceptor(rpcerr.WithLogger(logger.Named("grpc")))),
		grpcx.WithMetrics(m.registry),
	)
	if err != nil {
		_ = chain.Close()
		return nil, fmt.Errorf("nsync: %w", err)
	}
	nsyncv1.RegisterNsyncServiceServer(server.GRPC, api.New(c, st))
	svc := &Service{cfg: cfg, log: logger, core: c, etcd: etcd, server: server, m: m, chain: chain, store: st, keyring: keyring}
	svc.metrics = cfg.MetricsServer(m.registry)
	return svc, nil
}

// Run serves the API and campaigns for the bulk loop until ctx ends; ready is called once the
// API is serving. It first brings its store's layout up to date (layout.Serve: the migrations,
// or a refusal of a store newer than the code), then reads every app record once: one the keyring cannot open (sealed
// under a label it lacks) stops nsync before it serves, naming the label.
func (s *Service) Run(ctx context.Context, ready func()) error {
	defer s.chain.Close()
	return lifecycle.Run(ctx, s.log, append(s.metrics.Members(),
		lifecycle.Member{Name: "layout", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			return layout.Serve(ctx, s.etcd, layout.Options{Service: store.LayoutService, Current: store.LayoutVersion,
				Migrations: store.Migrations(s.keyring), LockTTL: time.Duration(s.cfg.LockTTL), Logger: s.log.Named("layout")}, ready)
		})},
		lifecycle.Member{Name: "keys", Runner: lifecycle.RunFunc(s.checkKeys)},
		lifecycle.Member{Name: "bulk", Runner: lifecycle.RunFunc(s.runBulk)},
		lifecycle.Member{Name: "grpc", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
			return s.server.Run(ctx, func() {
				r()
				ready()
			})
		})},
	)...)
}

// runBulk campaigns for the leadership and, while leading, runs a bulk pass at once and then
// every bulk_interval, and steps every deployment every deploy_poll.
func (s *Service) runBulk(ctx context.Context, ready func()) error {
	e, err := s.cfg.NewElection(s.etcd, LeaderService, s.cfg.ListenAddress, s.log.Named("election"))
	if err != nil {
		return err
	}
	s.election.Store(e)
	ready()
	return e.Run(ctx, func(ctx context.Context) error {
		deploying := make(chan struct{})
		go func() {
			defer close(deploying)
			s.core.RunDeployments(ctx) // returns when leadership (ctx) ends
		}()
		defer func() { <-deploying }()
		if s.keyring != nil {
			done := make(chan struct{})
			go func() {
				defer close(done)
				s.reencrypt(ctx) // returns when leadership (ctx) ends
			}()
			defer func() { <-done }()
		}
		t := time.NewTicker(time.Duration(s.cfg.BulkInterval))
		defer t.Stop()
		for {
			pctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.BulkInterval))
			res, err := s.core.Bulk(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				s.log.Warn("bulk pass incomplete; cf-apps not refreshed", "error", err)
			} else if err == nil {
				s.log.Debug("bulk pass", "desired", res.Desired, "updated", res.Updated, "removed", res.Removed)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	})
}

// checkKeys reads every app record, retrying while etcd cannot be read, and fails on one the
// keyring cannot open; then it is ready and waits for ctx.
func (s *Service) checkKeys(ctx context.Context, ready func()) error {
	err := retry.Do(ctx, checkKeysRetry, 0, func() error {
		_, _, err := s.store.Apps(ctx)
		var unknown *sealing.UnknownKeyError
		if errors.As(err, &unknown) || errors.Is(err, sealing.ErrCorrupt) {
			return retry.Permanent(err)
		}
		return err
	}, func(err error, next time.Duration) {
		s.log.Warn("reading the app records failed; retrying", "error", err, "backoff", next)
	})
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("app records: %w", err)
	}
	ready()
	<-ctx.Done()
	return nil
}

// checkKeysRetry is the wait between failed readings of the app records at start-up.
var checkKeysRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// reencryptBatch is how many app records one re-encryption step rewrites.
const reencryptBatch = 64

// reencrypt rewrites, in bounded batches, every app record not sealed under the active key
// while this instance leads, and reports what is left as gavel_nsync_records_to_reencrypt.
func (s *Service) reencrypt(ctx context.Context) {
	_ = sealing.Rotation{
		Step: func(ctx context.Context) (int, int, error) {
			n, left, err := s.store.ResealApps(ctx, reencryptBatch)
			if err == nil {
				s.m.toReencrypt.Set(float64(left))
			}
			return n, left, err
		},
		Active:   s.keyring.Active(),
		Interval: time.Duration(s.cfg.BulkInterval),
		Logger:   s.log.Named("reencrypt"),
	}.Run(ctx) // returns nil when ctx ends
}

// IsLeader reports whether this instance leads (and so runs the bulk loop).
func (s *Service) IsLeader() bool {
	e := s.election.Load()
	return e != nil && e.IsLeader()
}

// Addr is the API's bound address once Run has called ready.
func (s *Service) Addr() net.Addr { return s.server.Addr() }

// MetricsAddr is the metrics listener's bound address once Run has called ready (nil when
// metrics are off).
func (s *Service) MetricsAddr() net.Addr { return s.metrics.Addr() }

// Policy is the least-privilege rule of nsync's gRPC API (see pkg/authz): admin may make every
// call, read-only may list apps and placement pools, and no other role may call nsync at all
// (nsync is the platform's entry point, driven by operators, not by other Gavel services).
// Every call but the two lists is audited.
var Policy = authz.Methods{
	Service: nsyncv1.NsyncService_ServiceDesc.ServiceName,
	Reads:   []string{"Apps", "PlacementPools", "GetDeployment", "ListDeployments", "AppVersions"},
	Check: func(role authz.Role, method string, _ any) error {
		if role.Kind != authz.ReadOnly {
			return fmt.Errorf("role %s has no calls on nsync", role)
		}
		return nil
	},
}
