// Package etcdembed runs a single-node etcd server inside this process, for `gavel dev` and tests.
// It is the only package that links the etcd server; production binaries connect to an etcd
// cluster through etcdx and never import it.
package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
)

const (
	// DefaultClientAddr makes the embedded etcd pick a free loopback port.
	DefaultClientAddr = "127.0.0.1:0"
	// DefaultMaxTxnOps is the default operation limit per transaction;
	// etcd's own default of 128 is too small for batched writes.
	DefaultMaxTxnOps = 2048
	// DefaultMaxRequestBytes is the default request size limit.
	DefaultMaxRequestBytes = 8 << 20
	// ReadyTimeout bounds how long Start waits for the server
	// to become ready when the context has no earlier deadline.
	ReadyTimeout = 60 * time.Second

	// embeddedName is the member name of the single-node cluster.
	embeddedName = "default"
	// startAttempts bounds retries when a port picked for etcd was taken
	// between being probed and being bound.
	startAttempts = 5
)

// Config describes a single-node etcd running inside this process.
type Config struct {
	// Dir is the data directory; required. Reusing a directory restarts the
	// same member with its data.
	Dir string
	// ClientAddr is the host:port clients connect to; port 0 picks a free
	// port. Empty means DefaultClientAddr.
	ClientAddr string
	// UnsafeNoFsync disables fsync: much faster, loses data on a crash.
	// Only for tests.
	UnsafeNoFsync bool
	// MaxTxnOps limits operations per transaction; zero means
	// DefaultMaxTxnOps.
	MaxTxnOps uint
	// MaxRequestBytes limits the size of a client request; zero means
	// DefaultMaxRequestBytes.
	MaxRequestBytes uint
	// SnapshotCount is the number of applied entries between raft
	// snapshots; zero keeps etcd's default.
	SnapshotCount uint64
	// Name is the member's name; empty means a lone member's default name.
	Name string
	// PeerAddr is the host:port other members reach this one at; port 0 (or empty, which
	// means 127.0.0.1:0) picks a free port. A member of a cluster restarts with the same one.
	PeerAddr string
	// InitialCluster is "name=http://host:port,..." naming every member of a new cluster, this
	// one included; empty means a cluster of this member alone.
	InitialCluster string
	// Quiet makes the etcd server log at error level only.
	Quiet bool
	// FastElection ticks raft every 10ms with a 100ms election timeout instead of etcd's 100ms
	// and 1s, so the member leads within about 100ms of starting instead of up to a second. A
	// lone member has no peer to lose its leadership to, so this only shortens the start; for
	// tests and development clusters.
	FastElection bool
}

// Validate reports the first problem with the configuration, if any.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("embedded etcd config: data dir is required")
	}
	if c.ClientAddr != "" {
		if _, _, err := splitClientAddr(c.ClientAddr); err != nil {
			return fmt.Errorf("embedded etcd config: client addr: %w", err)
		}
	}
	return nil
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.ClientAddr == "" {
		c.ClientAddr = DefaultClientAddr
	}
	if c.MaxTxnOps == 0 {
		c.MaxTxnOps = DefaultMaxTxnOps
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	return c
}

// splitClientAddr splits a host:port client address and checks both halves.
func splitClientAddr(addr string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("parse %q: %w", addr, err)
	}
	if host == "" {
		return "", 0, fmt.Errorf("%q: host is required", addr)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: invalid port %q", addr, p)
	}
	return host, port, nil
}

// Server is a single-node etcd server running in this process. Create it
// with Start, or with New and then Start or Run.
type Server struct {
	cfg Config

	mu        sync.Mutex
	etcd      *embed.Etcd
	endpoints []string
	closed    bool
	// closing is set when Close starts; see newServerLogger.
	closing atomic.Bool
}

// New validates cfg and returns a Server that is not started yet.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg.withDefaults()}, nil
}

// Start starts a single-node etcd and waits until it serves clients,
// for at most ReadyTimeout or until ctx is done.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	e, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.Start(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// Start starts the server and waits until it is ready, for at most
// ReadyTimeout or until ctx is done. Starting a started server is a
// no-op; starting a closed one is an error.
func (e *Server) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("start embedded etcd: already closed")
	}
	if e.etcd != nil {
		return nil
	}

	var (
		etcd *embed.Etcd
		ecfg *embed.Config
		err  error
	)
	for attempt := 1; ; attempt++ {
		ecfg, err = e.etcdConfig()
		if err != nil {
			return fmt.Errorf("start embedded etcd in %s: %w", e.cfg.Dir, err)
		}
		etcd, err = embed.StartEtcd(ecfg)
		if err == nil {
			break
		}
		// A port picked by etcdConfig can be taken by someone else before
		// etcd binds it; pick new ones and try again.
		if !isAddrInUse(err) || attempt == startAttempts {
			return fmt.Errorf("start embedded etcd in %s: %w", e.cfg.Dir, err)
		}
	}

	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	select {
	case <-etcd.Server.ReadyNotify():
	case err := <-etcd.Err():
		etcd.Close()
		return fmt.Errorf("start embedded etcd in %s: server failed before ready: %w", e.cfg.Dir, serveErr(err))
	case <-etcd.Server.StopNotify():
		etcd.Close()
		return fmt.Errorf("start embedded etcd in %s: server stopped before ready", e.cfg.Dir)
	case <-ctx.Done():
		etcd.Close()
		return fmt.Errorf("start embedded etcd in %s: wait for ready: %w", e.cfg.Dir, ctx.Err())
	}

	e.etcd = etcd
	for _, u := range ecfg.AdvertiseClientUrls {
		e.endpoints = append(e.endpoints, u.String())
	}
	return nil
}

// etcdConfig builds etcd's configuration, picking free ports where needed.
func (e *Server) etcdConfig() (*embed.Config, error) {
	host, port, err := splitClientAddr(e.cfg.ClientAddr)
	if err != nil {
		return nil, err
	}
	if port == 0 {
		if port, err = freePort(host); err != nil {
			return nil, fmt.Errorf("pick client port: %w", err)
		}
	}
	// A single member never talks to peers, but etcd needs a peer URL to
	// identify the member; keep it on loopback.
	peerHost, peerPort := "127.0.0.1", 0
	if e.cfg.PeerAddr != "" {
		if peerHost, peerPort, err = splitClientAddr(e.cfg.PeerAddr); err != nil {
			return nil, fmt.Errorf("peer addr: %w", err)
		}
	}
	if peerPort == 0 {
		if peerPort, err = freePort(peerHost); err != nil {
			return nil, fmt.Errorf("pick peer port: %w", err)
		}
	}
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort(host, strconv.Itoa(port))}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort(peerHost, strconv.Itoa(peerPort))}
	name := e.cfg.Name
	if name == "" {
		name = embeddedName
	}

	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = e.cfg.Dir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = name + "=" + peerURL.String()
	if e.cfg.InitialCluster != "" {
		cfg.InitialCluster = e.cfg.InitialCluster
	}
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.UnsafeNoFsync = e.cfg.UnsafeNoFsync
	if e.cfg.FastElection {
		cfg.TickMs, cfg.ElectionMs = 10, 100
	}
	cfg.MaxTxnOps = e.cfg.MaxTxnOps
	cfg.MaxRequestBytes = e.cfg.MaxRequestBytes
	if e.cfg.SnapshotCount != 0 {
		cfg.SnapshotCount = e.cfg.SnapshotCount
	}
	// Retention "0" disables auto-compaction; callers compact explicitly.
	cfg.AutoCompactionMode = embed.CompactorModeRevision
	cfg.AutoCompactionRetention = "0"
	level := zapcore.InfoLevel
	if e.cfg.Quiet {
		level = zapcore.ErrorLevel
	}
	lg, err := newServerLogger(level, &e.closing)
	if err != nil {
		return nil, err
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	return cfg, nil
}

// freePort asks the kernel for a free TCP port on host and releases it.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("listen on %s: %w", host, err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("release probe port %d: %w", port, err)
	}
	return port, nil
}

// isAddrInUse reports whether err comes from binding a port already in use.
func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// serveErr turns a value received from embed.Etcd.Err into an error: etcd
// also reports serving goroutines that returned without error, and closes the
// channel when it shuts down.
func serveErr(err error) error {
	if err == nil {
		return errors.New("serving stopped unexpectedly")
	}
	return err
}

// Endpoints returns the client URLs, e.g. "http://127.0.0.1:41235"; nil
// before the server is started.
func (e *Server) Endpoints() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.endpoints)
}

// Close stops the server, releasing its ports and its lock on the data
// directory; the data stay. It is safe to call more than once and on a server
// that was never started. The error result, always nil, lets Server satisfy
// io.Closer: etcd reports no shutdown errors.
func (e *Server) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	e.closing.Store(true)
	if e.etcd != nil {
		e.etcd.Close()
	}
	return nil
}

// Run starts the server if needed, calls ready (if not nil) once it serves
// clients, and blocks until ctx is done or the server fails; then it closes
// the server. It returns nil after ctx is done, otherwise the failure.
func (e *Server) Run(ctx context.Context, ready func()) error {
	defer e.Close()
	if err := e.Start(ctx); err != nil {
		return err
	}
	e.mu.Lock()
	etcd := e.etcd
	e.mu.Unlock()
	if ready != nil {
		ready()
	}
	var failure error
	select {
	case <-ctx.Done():
		return nil
	case err := <-etcd.Err():
		failure = serveErr(err)
	case <-etcd.Server.StopNotify():
		failure = errors.New("server stopped")
	}
	if e.isClosed() {
		// Stopped by an explicit Close, not by a failure.
		return nil
	}
	return fmt.Errorf("embedded etcd in %s: %w", e.cfg.Dir, failure)
}

// isClosed reports whether Close has been called.
func (e *Server) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}
