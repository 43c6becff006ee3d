// Package etcdx holds Gavel's shared etcd plumbing: the client configuration
// every service uses to reach etcd, and a single-node etcd that runs inside the
// current process for `gavel dev` and for tests.
package etcdx

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

const (
	// DefaultDialTimeout is used when Config.DialTimeout is zero.
	DefaultDialTimeout = 5 * time.Second
	// MaxReconnectDelay is the longest wait between attempts to reach a lost etcd member.
	MaxReconnectDelay = time.Second
	// DialKeepAliveTime is how often the client pings an idle connection.
	DialKeepAliveTime = 10 * time.Second
	// DialKeepAliveTimeout is how long the client waits for a keepalive
	// answer before it considers the connection dead.
	DialKeepAliveTimeout = 5 * time.Second
	// MaxCallRecvMsgSize is the largest response the client accepts (large
	// range reads when a cache is rebuilt).
	MaxCallRecvMsgSize = 256 << 20
	// MaxCallSendMsgSize is the largest request the client sends.
	MaxCallSendMsgSize = 16 << 20
)

// Config describes how a service reaches etcd.
type Config struct {
	// Endpoints lists the etcd client URLs, e.g. "https://10.0.0.1:2379".
	// At least one is required. Plain "host:port" is accepted too.
	Endpoints []string
	// TLS is the client TLS configuration; nil means plaintext. It must be
	// set for https:// and unixs:// endpoints and must be nil for http://.
	TLS *tls.Config
	// DialTimeout bounds connecting and the initial connectivity check;
	// zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// Username and Password authenticate against etcd's auth; both or
	// neither must be set.
	Username, Password string
}

// Validate reports the first problem with the configuration, if any.
func (c Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return errors.New("etcd config: at least one endpoint is required")
	}
	for _, ep := range c.Endpoints {
		if err := c.validateEndpoint(ep); err != nil {
			return fmt.Errorf("etcd config: endpoint %q: %w", ep, err)
		}
	}
	if c.DialTimeout < 0 {
		return fmt.Errorf("etcd config: dial timeout must not be negative, got %s", c.DialTimeout)
	}
	if (c.Username == "") != (c.Password == "") {
		return errors.New("etcd config: username and password must be set together")
	}
	return nil
}

// validateEndpoint checks one endpoint's syntax and that its scheme agrees
// with whether TLS is configured.
func (c Config) validateEndpoint(ep string) error {
	if strings.TrimSpace(ep) != ep || ep == "" {
		return errors.New("empty or surrounded by whitespace")
	}
	if !strings.Contains(ep, "://") {
		// A bare host:port; the client uses TLS exactly when it is configured.
		return nil
	}
	u, err := url.Parse(ep)
	if err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	switch u.Scheme {
	case "http":
		if c.TLS != nil {
			return errors.New("plaintext http:// endpoint while TLS is configured; use https://")
		}
	case "https", "unixs":
		if c.TLS == nil {
			return fmt.Errorf("%s:// endpoint requires TLS to be configured", u.Scheme)
		}
	case "unix":
	default:
		return fmt.Errorf("unsupported scheme %q (want http, https, unix or unixs)", u.Scheme)
	}
	if u.Host == "" && u.Path == "" {
		return errors.New("missing address")
	}
	return nil
}

// reconnect is how the client dials a member again after losing it: gRPC's default backoff
// grows to two minutes, so a client that lost etcd for half a minute could take as long again
// to notice it back, past a presence lease's TTL; capped at MaxReconnectDelay instead.
var reconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: MaxReconnectDelay},
	MinConnectTimeout: 2 * time.Second,
}

// dialTimeout returns the effective dial timeout.
func (c Config) dialTimeout() time.Duration {
	if c.DialTimeout == 0 {
		return DefaultDialTimeout
	}
	return c.DialTimeout
}

// NewClient validates cfg, builds an etcd client and checks that the first
// endpoint answers a Status call within the dial timeout. etcd's own client
// log lines at error level and above are forwarded to logger (nil discards
// them). The caller owns the returned client and must Close it.
func NewClient(cfg Config, logger hclog.Logger) (*clientv3.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	timeout := cfg.dialTimeout()
	deadline := time.Now().Add(timeout)
	eps := strings.Join(cfg.Endpoints, ",")

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		TLS:                  cfg.TLS,
		DialTimeout:          timeout,
		DialKeepAliveTime:    DialKeepAliveTime,
		DialKeepAliveTimeout: DialKeepAliveTimeout,
		MaxCallRecvMsgSize:   MaxCallRecvMsgSize,
		MaxCallSendMsgSize:   MaxCallSendMsgSize,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               newZapLogger(logger),
		// Fixed windows, as Gavel's own clients have: no BDP PING and ack per
		// presence renewal or single-key transaction on a quiet connection.
		DialOptions: append([]grpc.DialOption{grpc.WithConnectParams(reconnect)}, grpcx.StaticWindows()...),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd at %s: %w", eps, err)
	}

	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if _, err := cli.Status(ctx, cfg.Endpoints[0]); err != nil {
		// The check's outcome is what matters; a close error adds nothing.
		_ = cli.Close()
		return nil, fmt.Errorf("etcd at %s not reachable within %s: %w", eps, timeout, err)
	}
	logger.Debug("connected to etcd", "endpoints", eps)
	return cli, nil
}

// Connect is NewClient for a service's configuration: endpoints and a tlsx client config.
func Connect(endpoints []string, tlsCfg tlsx.Config, logger hclog.Logger) (*clientv3.Client, error) {
	t, err := tlsCfg.ClientTLS()
	if err != nil {
		return nil, fmt.Errorf("etcd tls: %w", err)
	}
	return NewClient(Config{Endpoints: endpoints, TLS: t}, logger)
}
