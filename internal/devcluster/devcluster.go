// Package devcluster runs a whole Gavel cluster in one process: an embedded etcd, the BBS, the
// auctioneer, any number of reps, and optionally nsync and the routing tier. `gavel dev` runs
// it with process-backed cells; integration tests and the scale benchmark run it with
// simulated cells.
package devcluster

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/services/auctioneer"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/nsync"
	"github.com/gavel-sched/gavel/services/rep"
	"github.com/gavel-sched/gavel/services/routeemitter"
	"github.com/gavel-sched/gavel/services/router"
)

// Cell describes one rep of the cluster.
type Cell struct {
	// Config is the rep's configuration; devcluster fills in addresses, TLS and etcd.
	Config rep.Config
}

// Config describes the cluster.
type Config struct {
	// Dir holds etcd's data and the reps' work directories.
	Dir string
	// BBSAddress and AuctioneerAddress are the listen addresses ("127.0.0.1:0" picks a port).
	BBSAddress, AuctioneerAddress string
	// UnsafeNoFsync turns etcd's fsync off (tests, benchmarks).
	UnsafeNoFsync bool
	// Cells are the reps to run.
	Cells []Cell
	// Logger receives every component's logs.
	Logger hclog.Logger
	// Routing runs the route-emitter and the router too.
	Routing bool
	// RouteEmitterAddress is the route-emitter's listen address ("127.0.0.1:0" picks a port).
	RouteEmitterAddress string
	// RouterHTTPAddress, RouterHTTPSAddress and RouterAdminAddress are the router's listeners;
	// the HTTPS listener uses a development certificate written under Dir.
	RouterHTTPAddress, RouterHTTPSAddress, RouterAdminAddress string
	// RepBBSInterceptor, when set, intercepts every call the reps make to the BBS (benchmarks
	// time them with it).
	RepBBSInterceptor grpc.UnaryClientInterceptor
	// BBSInterceptors, when set, intercept every call the auctioneer, nsync and the
	// route-emitter make to the BBS, by identity ("auctioneer", "nsync", "route-emitter"). Like
	// RepBBSInterceptor they sit inside the BBS connection's own interceptors
	// (bbsclient.RetryOverloaded), so they see every attempt.
	BBSInterceptors map[string]grpc.UnaryClientInterceptor
	// Transformers is the BBS's transformer plugin chain (each plugin is described at
	// start-up; see docs/plugins.md).
	Transformers []transform.PluginConfig
	// TLS runs every gRPC hop with mutual TLS: a development PKI is written under Dir/pki
	// (see Cluster.PKI) and each component presents its own identity (bbs, auctioneer,
	// rep/<cell>, route-emitter, router), so the role-based authorization of
	// docs/architecture.md §11 is in force. Without it every hop is plaintext. etcd stays
	// plaintext on loopback either way.
	TLS bool
	// ConfigureBBS and ConfigureAuctioneer, when set, adjust those configurations last.
	ConfigureBBS func(*bbs.Config)
	// BBSOptions are further options of the BBS service (e.g. bbs.WithCellClient, to observe
	// the stops it asks of reps).
	BBSOptions          []bbs.Option
	ConfigureAuctioneer func(*auctioneer.Config)
	// ConfigureRouteEmitter, when set, adjusts the route-emitter's configuration last (with
	// Routing).
	ConfigureRouteEmitter func(*routeemitter.Config)
	// ConfigureRouter, when set, adjusts the router's configuration last (with Routing).
	ConfigureRouter func(*router.Config)
	// Nsync runs nsync too, on NsyncAddress ("127.0.0.1:0" picks a port), with NsyncStacks as
	// its stack → rootfs map (nil: nsync's default).
	Nsync        bool
	NsyncAddress string
	NsyncStacks  map[string]string
	// ConfigureNsync, when set, adjusts nsync's configuration last.
	ConfigureNsync func(*nsync.Config)
	// CellsPerHost groups the reps, in order, into simulated hosts of this many cells; each
	// host keeps its cells' presence on its own etcd connection, which DisconnectHost cuts.
	// Zero puts every rep on one host. Presence never shares a connection with the BBS, so
	// data-path load cannot starve the lease keepalives.
	CellsPerHost int
	// EtcdEndpoints, when set, are the client URLs of an etcd the cluster uses instead of
	// starting its own embedded one (a test's multi-member etcd, to stop and restart).
	EtcdEndpoints []string
	// Encryption is the BBS's and nsync's encryption at rest (their "encryption" section);
	// the zero value stores records clear.
	Encryption sealing.Config
}

// Cluster is a running cluster; its fields are valid once Run has called ready.
type Cluster struct {
	cfg       Config
	listeners []net.Listener // bound by Run for the services; closed when Run returns

	// Etcd is a client of the cluster's etcd.
	Etcd *clientv3.Client
	// EtcdEndpoints are the embedded etcd's client URLs.
	EtcdEndpoints []string
	// BBS is a client of the BBS.
	BBS bbsv1.BBSServiceClient
	// BBSService is the running BBS (for in-process observers such as the scale harness).
	BBSService *bbs.Service
	// BBSAddress and AuctioneerAddress are where those services listen.
	BBSAddress, AuctioneerAddress string
	// RouteEmitterAddress is where the route-emitter listens (with Config.Routing).
	RouteEmitterAddress string
	// Router is the running router (with Config.Routing).
	Router *router.Router
	// RouterCA is the CA file of the router's HTTPS certificate (with Config.Routing).
	RouterCA string
	// Nsync is a client of nsync and NsyncAddress where it listens (with Config.Nsync).
	Nsync        nsyncv1.NsyncServiceClient
	NsyncAddress string
	// Auctioneer is the running auctioneer.
	Auctioneer *auctioneer.Service
	// Reps are the running reps, in the order of Config.Cells.
	Reps []*rep.Service
	// PKI holds the certificates by identity name (with Config.TLS): every component's, and
	// "admin" and "read-only" for clients, and "prometheus" (no role: it scrapes /metrics over
	// mutual TLS). BBS is a client with the admin identity.
	PKI map[string]tlsx.Config

	hostsMu sync.Mutex
	hosts   map[int]*clientv3.Client // presence connection of each simulated host
}

// New returns a cluster; Run starts it.
func New(cfg Config) *Cluster {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Cluster{cfg: cfg}
}

var insecure = tlsx.Config{Insecure: true}

// tlsFor is the TLS configuration of identity name: its certificate with Config.TLS, else
// plaintext.
func (c *Cluster) tlsFor(name string) tlsx.Config {
	if cfg, ok := c.PKI[name]; ok {
		return cfg
	}
	return insecure
}

// listen binds addr now (a ":0" port becomes a concrete one), so that peers can be told each
// other's addresses before they start; the listener is handed to the service that serves it
// (never closed and bound again, which another process could take meanwhile). Run closes the
// listeners that no service took.
func (c *Cluster) listen(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	c.listeners = append(c.listeners, l)
	return l, nil
}

// externalEtcd is an etcd the cluster does not run: its runner only waits.
type externalEtcd []string

// Endpoints are the etcd's client URLs.
func (e externalEtcd) Endpoints() []string { return e }

// Run implements lifecycle.Runner.
func (e externalEtcd) Run(ctx context.Context, ready func()) error {
	ready()
	<-ctx.Done()
	return nil
}

// repStarts bounds the reps that start at once: each waits for its presence and first listings.
const repStarts = 16

// Run starts etcd, the BBS, the auctioneer and the reps in that order (the reps repStarts at a
// time), calls ready, and stops them in reverse order when ctx ends (the reps together).
func (c *Cluster) Run(ctx context.Context, ready func()) error {
	log := c.cfg.Logger
	defer func() {
		for _, l := range c.listeners {
			_ = l.Close() // already closed by the service that served it, or never used
		}
	}()
	bbsListener, err := c.listen(c.cfg.BBSAddress)
	if err != nil {
		return fmt.Errorf("bbs address: %w", err)
	}
	auctioneerListener, err := c.listen(c.cfg.AuctioneerAddress)
	if err != nil {
		return fmt.Errorf("auctioneer address: %w", err)
	}
	c.BBSAddress, c.AuctioneerAddress = bbsListener.Addr().String(), auctioneerListener.Addr().String()
	if c.cfg.TLS {
		names := []string{"bbs", "auctioneer", "route-emitter", "router", "nsync", "admin", "read-only", "prometheus"}
		for _, cell := range c.cfg.Cells {
			names = append(names, "rep/"+cell.Config.CellID)
		}
		if c.PKI, err = tlsx.GenerateDevPKI(filepath.Join(c.cfg.Dir, "pki"), names...); err != nil {
			return fmt.Errorf("dev pki: %w", err)
		}
	}
	var etcd interface {
		lifecycle.Runner
		Endpoints() []string
	}
	if len(c.cfg.EtcdEndpoints) > 0 {
		etcd = externalEtcd(c.cfg.EtcdEndpoints)
	} else if etcd, err = etcdembed.New(etcdembed.Config{Dir: filepath.Join(c.cfg.Dir, "etcd"), UnsafeNoFsync: c.cfg.UnsafeNoFsync, Quiet: true, FastElection: true}); err != nil {
		return err
	}
	var conns []*grpc.ClientConn
	var connsMu sync.Mutex // the reps dial side by side
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	keep := func(conn *grpc.ClientConn, err error) (*grpc.ClientConn, error) {
		if err == nil {
			connsMu.Lock()
			conns = append(conns, conn)
			connsMu.Unlock()
		}
		return conn, err
	}
	dial := func(addr, identity string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
		return keep(grpcx.Dial(addr, grpcx.ClientConfig{TLS: c.tlsFor(identity)}, opts...))
	}
	// Every component reaches the BBS with the same client configuration and dial, presenting
	// its own identity.
	bbsCfg := func(identity string) bbsclient.Config {
		return bbsclient.Config{BBSAddress: c.BBSAddress, BBSTLS: c.tlsFor(identity)}
	}
	dialBBS := func(identity string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
		return keep(bbsclient.Dial(bbsCfg(identity), opts...))
	}
	// bbsAs is a BBS client with identity's certificate: the shared admin client when the
	// cluster is plaintext and nothing intercepts, otherwise a connection of its own.
	bbsAs := func(identity string, intercept grpc.UnaryClientInterceptor) (bbsv1.BBSServiceClient, error) {
		if c.PKI == nil && intercept == nil {
			return c.BBS, nil
		}
		var opts []grpc.DialOption
		if intercept != nil {
			opts = append(opts, grpc.WithChainUnaryInterceptor(intercept))
		}
		conn, err := dialBBS(identity, opts...)
		if err != nil {
			return nil, err
		}
		return bbsv1.NewBBSServiceClient(conn), nil
	}

	members := []lifecycle.Member{
		{Name: "etcd", Runner: etcd},
		{Name: "etcd-client", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			cli, err := etcdx.NewClient(etcdx.Config{Endpoints: etcd.Endpoints()}, log.Named("etcd-client"))
			if err != nil {
				return err
			}
			c.Etcd, c.EtcdEndpoints = cli, etcd.Endpoints()
			ready()
			<-ctx.Done()
			return cli.Close()
		})},
		// The simulated hosts' presence connections close once every rep has stopped and
		// before etcd does: an open keepalive stream would hold etcd's graceful stop.
		{Name: "presence-connections", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			ready()
			<-ctx.Done()
			c.closeHosts()
			return nil
		})},
		{Name: "bbs", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			cfg := bbs.Default()
			cfg.ListenAddress, cfg.AuctioneerAddress = c.BBSAddress, c.AuctioneerAddress
			cfg.TLS, cfg.EtcdTLS = c.tlsFor("bbs"), insecure
			cfg.EtcdEndpoints = c.EtcdEndpoints
			cfg.Transformers = c.cfg.Transformers
			cfg.Encryption = c.cfg.Encryption
			if c.cfg.ConfigureBBS != nil {
				c.cfg.ConfigureBBS(&cfg)
			}
			// The BBS's data path has its own etcd connection (as a BBS process would).
			cli, err := etcdx.NewClient(etcdx.Config{Endpoints: c.EtcdEndpoints}, log.Named("bbs-etcd"))
			if err != nil {
				return err
			}
			defer cli.Close()
			svc, err := bbs.New(cfg, log.Named("bbs"), cli, append([]bbs.Option{bbs.WithListener(bbsListener)}, c.cfg.BBSOptions...)...)
			if err != nil {
				return err
			}
			conn, err := dialBBS("admin")
			if err != nil {
				return err
			}
			c.BBS = bbsv1.NewBBSServiceClient(conn)
			c.BBSService = svc
			return svc.Run(ctx, ready)
		})},
		{Name: "auctioneer", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			cfg := auctioneer.Default()
			cfg.ListenAddress, cfg.Config = c.AuctioneerAddress, bbsCfg("auctioneer")
			cfg.TLS, cfg.RepTLS, cfg.EtcdTLS = c.tlsFor("auctioneer"), c.tlsFor("auctioneer"), insecure
			cfg.EtcdEndpoints = c.EtcdEndpoints
			if c.cfg.ConfigureAuctioneer != nil {
				c.cfg.ConfigureAuctioneer(&cfg)
			}
			bbsClient, err := bbsAs("auctioneer", c.cfg.BBSInterceptors["auctioneer"])
			if err != nil {
				return err
			}
			svc, err := auctioneer.New(cfg, log.Named("auctioneer"), c.Etcd, bbsClient, auctioneer.WithListener(auctioneerListener))
			if err != nil {
				return err
			}
			c.Auctioneer = svc
			// The auctioneer calls ready from its election member just before campaigning:
			// waiting for the leadership there would hold the campaign back until waitLeader
			// gave up. Wait beside it instead, and join that wait before returning.
			lctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			return svc.Run(lctx, func() {
				wg.Go(func() {
					waitLeader(lctx, svc)
					ready()
				})
			})
		})},
	}
	// The reps start repStarts at a time and stop together (lifecycle.Parallel): stopped one
	// after another, 5,000 of them took 3.5 minutes.
	c.Reps = make([]*rep.Service, len(c.cfg.Cells))
	reps := make([]lifecycle.Member, len(c.cfg.Cells))
	for i := range c.cfg.Cells {
		cell := c.cfg.Cells[i].Config
		host := c.hostOf(i)
		reps[i] = lifecycle.Member{Name: "rep-" + cell.CellID, Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			id := "rep/" + cell.CellID
			cell.Config, cell.EtcdEndpoints = bbsCfg(id), c.EtcdEndpoints
			cell.TLS, cell.EtcdTLS = c.tlsFor(id), insecure
			if cell.ListenAddress == "" || cell.ListenAddress == rep.Default().ListenAddress {
				cell.ListenAddress = "127.0.0.1:0"
			}
			if cell.WorkDir == "" || cell.WorkDir == rep.Default().WorkDir {
				cell.WorkDir = filepath.Join(c.cfg.Dir, "cells", cell.CellID)
			}
			bbsClient, err := bbsAs(id, c.cfg.RepBBSInterceptor)
			if err != nil {
				return err
			}
			presenceEtcd, err := c.hostEtcd(host, log)
			if err != nil {
				return err
			}
			svc, err := rep.New(cell, log.Named("rep").With("cell_id", cell.CellID), presenceEtcd, bbsClient)
			if err != nil {
				return err
			}
			c.Reps[i] = svc
			return svc.Run(ctx, ready)
		})}
	}
	members = append(members, lifecycle.Member{Name: "reps", Runner: lifecycle.Parallel(repStarts, reps...)})
	if c.cfg.Nsync {
		members = append(members, c.nsyncMember(log, dial, bbsAs))
	}
	if c.cfg.Routing {
		routing, err := c.routingMembers(log, dial, bbsAs)
		if err != nil {
			return err
		}
		members = append(members, routing...)
	}
	members = append(members, lifecycle.Member{Name: "ready", Runner: lifecycle.RunFunc(func(ctx context.Context, r func()) error {
		r()
		ready()
		<-ctx.Done()
		return nil
	})})
	return lifecycle.Run(ctx, log, members...)
}

// nsyncMember runs nsync over the cluster's etcd and BBS.
func (c *Cluster) nsyncMember(log hclog.Logger, dial func(addr, identity string, opts ...grpc.DialOption) (*grpc.ClientConn, error),
	bbsAs func(identity string, intercept grpc.UnaryClientInterceptor) (bbsv1.BBSServiceClient, error)) lifecycle.Member {
	return lifecycle.Member{Name: "nsync", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
		cfg := nsync.Default()
		cfg.ListenAddress, cfg.BBSAddress = c.cfg.NsyncAddress, c.BBSAddress
		if cfg.ListenAddress == "" {
			cfg.ListenAddress = "127.0.0.1:0"
		}
		cfg.TLS, cfg.BBSTLS, cfg.EtcdTLS = c.tlsFor("nsync"), c.tlsFor("nsync"), insecure
		cfg.EtcdEndpoints = c.EtcdEndpoints
		if c.cfg.NsyncStacks != nil {
			cfg.Stacks = c.cfg.NsyncStacks
		}
		cfg.Encryption = c.cfg.Encryption
		if c.cfg.ConfigureNsync != nil {
			c.cfg.ConfigureNsync(&cfg)
		}
		bbsClient, err := bbsAs("nsync", c.cfg.BBSInterceptors["nsync"])
		if err != nil {
			return err
		}
		svc, err := nsync.New(cfg, log.Named("nsync"), c.Etcd, bbsClient)
		if err != nil {
			return err
		}
		return svc.Run(ctx, func() {
			c.NsyncAddress = svc.Addr().String()
			conn, err := dial(c.NsyncAddress, "admin")
			if err == nil {
				c.Nsync = nsyncv1.NewNsyncServiceClient(conn)
			}
			ready()
		})
	})}
}

// hostOf is the simulated host of the i-th cell.
func (c *Cluster) hostOf(i int) int {
	if c.cfg.CellsPerHost <= 0 {
		return 0
	}
	return i / c.cfg.CellsPerHost
}

// Hosts is the number of simulated hosts the cells are grouped into.
func (c *Cluster) Hosts() int {
	if len(c.cfg.Cells) == 0 {
		return 0
	}
	return c.hostOf(len(c.cfg.Cells)-1) + 1
}

// HostCells are the cell ids of a simulated host.
func (c *Cluster) HostCells(host int) []string {
	var ids []string
	for i, cell := range c.cfg.Cells {
		if c.hostOf(i) == host {
			ids = append(ids, cell.Config.CellID)
		}
	}
	return ids
}

// hostEtcd is the presence connection of a simulated host, dialled on first use.
func (c *Cluster) hostEtcd(host int, log hclog.Logger) (*clientv3.Client, error) {
	c.hostsMu.Lock()
	defer c.hostsMu.Unlock()
	if cli, ok := c.hosts[host]; ok {
		return cli, nil
	}
	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: c.EtcdEndpoints}, log.Named("presence-etcd"))
	if err != nil {
		return nil, fmt.Errorf("presence connection of host %d: %w", host, err)
	}
	if c.hosts == nil {
		c.hosts = map[int]*clientv3.Client{}
	}
	c.hosts[host] = cli
	return cli, nil
}

// DisconnectHost cuts a simulated host's etcd connection without revoking its leases, as a
// host that crashes or is partitioned away: its cells' presence expires after the lease TTL
// and they cannot register again. Their containers and APIs keep running.
func (c *Cluster) DisconnectHost(host int) error {
	c.hostsMu.Lock()
	cli, ok := c.hosts[host]
	c.hostsMu.Unlock()
	if !ok {
		return fmt.Errorf("no simulated host %d", host)
	}
	// The connection goes first: closing the client alone ends its watches before its
	// connection, and a rep that sees its presence watch end revokes its lease, which could
	// still get through.
	if err := cli.ActiveConnection().Close(); err != nil {
		return fmt.Errorf("cut host %d: %w", host, err)
	}
	_ = cli.Close() // reports the connection closed above
	return nil
}

// closeHosts closes every presence connection.
func (c *Cluster) closeHosts() {
	c.hostsMu.Lock()
	defer c.hostsMu.Unlock()
	for _, cli := range c.hosts {
		_ = cli.Close()
	}
}

// waitLeader waits (bounded) until the auctioneer leads, so work sent at once is placed.
func waitLeader(ctx context.Context, svc *auctioneer.Service) {
	deadline := time.Now().Add(15 * time.Second)
	for !svc.IsLeader() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
}

// routingMembers runs the route-emitter over the BBS and the router over the route-emitter.
func (c *Cluster) routingMembers(log hclog.Logger, dial func(addr, identity string, opts ...grpc.DialOption) (*grpc.ClientConn, error),
	bbsAs func(identity string, intercept grpc.UnaryClientInterceptor) (bbsv1.BBSServiceClient, error)) ([]lifecycle.Member, error) {
	emitterListener, err := c.listen(c.cfg.RouteEmitterAddress)
	if err != nil {
		return nil, fmt.Errorf("route-emitter address: %w", err)
	}
	c.RouteEmitterAddress = emitterListener.Addr().String()
	pki, err := tlsx.GenerateDevPKI(filepath.Join(c.cfg.Dir, "pki"), "router")
	if err != nil {
		return nil, fmt.Errorf("router certificate: %w", err)
	}
	c.RouterCA = pki["router"].CAFile
	return []lifecycle.Member{
		{Name: "route-emitter", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			cfg := routeemitter.Default()
			cfg.ListenAddress, cfg.Config = c.RouteEmitterAddress, bbsclient.Config{BBSAddress: c.BBSAddress, BBSTLS: c.tlsFor("route-emitter")}
			cfg.TLS = c.tlsFor("route-emitter")
			if c.cfg.ConfigureRouteEmitter != nil {
				c.cfg.ConfigureRouteEmitter(&cfg)
			}
			bbsClient, err := bbsAs("route-emitter", c.cfg.BBSInterceptors["route-emitter"])
			if err != nil {
				return err
			}
			svc, err := routeemitter.New(cfg, log.Named("route-emitter"), bbsClient, routeemitter.WithListener(emitterListener))
			if err != nil {
				return err
			}
			return svc.Run(ctx, ready)
		})},
		{Name: "router", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			cfg := router.Default()
			cfg.HTTPAddress, cfg.AdminAddress = c.cfg.RouterHTTPAddress, c.cfg.RouterAdminAddress
			if c.cfg.RouterHTTPSAddress != "" {
				cfg.HTTPSAddress, cfg.HTTPSCertFile, cfg.HTTPSKeyFile = c.cfg.RouterHTTPSAddress, pki["router"].CertFile, pki["router"].KeyFile
			}
			cfg.RouteEmitterAddress, cfg.RouteEmitterTLS = c.RouteEmitterAddress, c.tlsFor("router")
			cfg.TCPBindAddress = "127.0.0.1"
			if c.cfg.ConfigureRouter != nil {
				c.cfg.ConfigureRouter(&cfg)
			}
			conn, err := dial(c.RouteEmitterAddress, "router")
			if err != nil {
				return err
			}
			r, err := router.New(cfg, log.Named("router"), routeemitterv1.NewRouteEmitterServiceClient(conn))
			if err != nil {
				return err
			}
			c.Router = r
			return r.Run(ctx, ready)
		})},
	}, nil
}
