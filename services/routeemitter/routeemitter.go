// Package routeemitter is Gavel's route-emitter: it builds the routing table from the BBS (the
// cf-router routes of desired LRPs joined with their running, routable instances) by
// list-then-watch plus a periodic full sync, and serves it to routers over gRPC
// (routeemitterv1.RouteEmitterService) as a snapshot followed by versioned deltas.
package routeemitter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/pkg/authz"
	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/config"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/serviceconfig"
	"github.com/gavel-sched/gavel/services/routeemitter/internal/api"
	"github.com/gavel-sched/gavel/services/routeemitter/internal/syncer"
	"github.com/gavel-sched/gavel/services/routeemitter/internal/table"
)

// Config is the route-emitter's configuration. Fields are set from a JSON config file and flags.
type Config struct {
	// Base is where the gRPC API (RouteEmitterService) listens and its TLS, log,
	// metrics_address and authz. The route-emitter has no etcd and elects no leader.
	serviceconfig.Base
	// Config is how the service reaches the BBS: bbs_address (or bbs_addresses) and bbs_tls.
	bbsclient.Config
	// SyncInterval is how often the whole BBS is listed again and diffed against the table, to
	// repair anything the event stream missed.
	SyncInterval Duration `json:"sync_interval"`
	// WatchHistory is how many versions of deltas are kept so a router that reconnects with
	// its table_id and version gets only what it missed (older: a snapshot).
	WatchHistory int `json:"watch_history"`
	// WatchQueue is how many deltas may wait for one slow router; one that falls further
	// behind is sent a fresh snapshot instead.
	WatchQueue int `json:"watch_queue"`
}

// Duration is a time.Duration written as a string ("10s") in config files and flags.
type Duration = config.Duration

// Default is the configuration of a route-emitter next to a local BBS.
func Default() Config {
	return Config{
		Base:         serviceconfig.DefaultBase("127.0.0.1:8893"),
		Config:       bbsclient.Default(),
		SyncInterval: Duration(60 * time.Second),
		WatchHistory: api.DefaultHistory,
		WatchQueue:   api.DefaultQueue,
	}
}

// LoadFile overlays the JSON config file at path on c.
func (c *Config) LoadFile(path string) error { return config.LoadJSON(path, c) }

// Flags binds the route-emitter's command-line flags to c: the shared ones (serviceconfig:
// -listen, the server TLS flags, -metrics-address, -log-level, -log-format), the BBS client's
// (bbsclient.Flags) and -sync-interval.
func (c *Config) Flags(fs *flag.FlagSet) {
	serviceconfig.BaseFlags(fs, &c.Base, "server")
	bbsclient.Flags(fs, &c.Config)
	fs.Var(&c.SyncInterval, "sync-interval", "how often the whole BBS is listed again")
}

// Validate reports every problem that would stop the route-emitter from starting.
func (c Config) Validate() error {
	errs := []error{c.Base.Validate(), c.Config.Validate()} // the latter: the BBS client's fields
	if c.SyncInterval <= 0 {
		errs = append(errs, errors.New("sync_interval must be positive"))
	}
	if c.WatchHistory <= 0 {
		errs = append(errs, fmt.Errorf("watch_history must be positive, got %d", c.WatchHistory))
	}
	if c.WatchQueue <= 0 {
		errs = append(errs, fmt.Errorf("watch_queue must be positive, got %d", c.WatchQueue))
	}
	return errors.Join(errs...)
}

// Service is a running route-emitter.
type Service struct {
	cfg           Config
	log           hclog.Logger
	hub           *api.Hub
	syncer        *syncer.Syncer
	reporter      *reporter
	server        *grpcx.Server
	metricsServer *metrics.Server // nil without metrics_address
}

// Option adjusts a route-emitter beyond its Config (tests and embedding).
type Option func(*options)

type options struct {
	listener net.Listener
}

// WithListener makes the route-emitter serve its API on l, bound by the caller, instead of
// listening on listen_address (which then only names the address): callers that must know the
// address before the route-emitter starts bind first instead of picking a free port for later.
func WithListener(l net.Listener) Option { return func(o *options) { o.listener = l } }

// New builds a route-emitter reading the BBS through bbs; Run starts it.
func New(cfg Config, logger hclog.Logger, bbs bbsv1.BBSServiceClient, opts ...Option) (*Service, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("route-emitter config: %w", err)
	}
	if bbs == nil {
		return nil, errors.New("route-emitter: a BBS client is required")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	hub := api.NewHub(api.HubOptions{History: cfg.WatchHistory, Queue: cfg.WatchQueue})
	m := newServiceMetrics(hub)
	sy, err := syncer.New(syncer.Config{
		BBS:          bbs,
		Table:        table.New(logger.Named("table")),
		Publisher:    hub,
		Logger:       logger.Named("syncer"),
		SyncInterval: time.Duration(cfg.SyncInterval),
		Observer:     m,
	})
	if err != nil {
		return nil, fmt.Errorf("route-emitter: %w", err)
	}
	authorizer := authz.New(cfg.Authz, Policy, logger.Named("audit"))
	server, err := grpcx.NewServer(grpcx.ServerConfig{ListenAddress: cfg.ListenAddress, TLS: cfg.TLS}, logger.Named("grpc"),
		grpcx.WithListener(o.listener),
		grpcx.WithUnaryInterceptors(authorizer.Unary(), rpcerr.UnaryServerInterceptor()),
		grpcx.WithStreamInterceptors(authorizer.Stream(), rpcerr.StreamServerInterceptor()),
		grpcx.WithMetrics(m.registry),
	)
	if err != nil {
		return nil, fmt.Errorf("route-emitter: %w", err)
	}
	routeemitterv1.RegisterRouteEmitterServiceServer(server.GRPC, api.New(hub))
	logger.Info("route-emitter table", "table_id", hub.TableID())
	svc := &Service{cfg: cfg, log: logger, hub: hub, syncer: sy, server: server,
		reporter: &reporter{bbs: bbs, src: sy, id: hub.TableID(), log: logger.Named("report")}}
	svc.metricsServer = cfg.MetricsServer(m.registry)
	return svc, nil
}

// Run follows the BBS and serves the table until ctx ends; ready is called once the API is
// serving (and, with metrics_address, the metrics). Until the first sync RoutingTable answers
// Unavailable and WatchRoutes waits.
func (s *Service) Run(ctx context.Context, ready func()) error {
	return lifecycle.Run(ctx, s.log, append(s.metricsServer.Members(),
		lifecycle.Member{Name: "syncer", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
			r()
			return s.syncer.Run(ctx)
		})},
		lifecycle.Member{Name: "reporter", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
			r()
			return s.reporter.run(ctx)
		})},
		lifecycle.Member{Name: "grpc", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
			// End the watch streams first so the graceful stop does not wait for them.
			stop := context.AfterFunc(ctx, s.hub.Close)
			defer stop()
			return s.server.Run(ctx, func() {
				r()
				ready()
			})
		})},
	)...)
}

// MetricsAddr is the bound address of the metrics server once Run has called ready; nil
// without metrics_address.
func (s *Service) MetricsAddr() net.Addr { return s.metricsServer.Addr() }

// Addr is the API's bound address once Run has called ready.
func (s *Service) Addr() net.Addr { return s.server.Addr() }

// Synced is closed once the table reflects a first full listing of the BBS; until then
// RoutingTable answers Unavailable and WatchRoutes waits.
func (s *Service) Synced() <-chan struct{} { return s.hub.Synced() }

// TableID is this process's table id; it changes at every start.
func (s *Service) TableID() string { return s.hub.TableID() }

// Stats counts the syncer's listings, subscriptions, compaction re-lists and failures, and
// the BBS revision the table reflects.
type Stats struct {
	// Lists is how many full listings were applied.
	Lists uint64
	// Subscriptions is how many event streams were opened.
	Subscriptions uint64
	// OutOfRange is how many resumes the BBS refused because the revision was compacted.
	OutOfRange uint64
	// Failures is how many listings or streams failed.
	Failures uint64
	// Revision is the BBS revision the table reflects.
	Revision int64
}

// Stats reports the syncer's counters.
func (s *Service) Stats() Stats {
	st := s.syncer.Stats()
	return Stats{Lists: st.Lists, Subscriptions: st.Subscriptions, OutOfRange: st.OutOfRange, Failures: st.Failures, Revision: st.Revision}
}

// Policy is the least-privilege rule of this service's gRPC API (see pkg/authz); admin may
// make every call.
var Policy = authz.Methods{
	Service: routeemitterv1.RouteEmitterService_ServiceDesc.ServiceName,
	Reads:   []string{"RoutingTable", "WatchRoutes"},
}
