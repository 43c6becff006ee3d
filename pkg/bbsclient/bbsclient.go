// Package bbsclient is how every Gavel component reaches the BBS: one configuration (the
// addresses of the BBS instances and the client TLS), one set of command-line flags and one
// dial, balanced round-robin over the instances that answer, with keepalives, a reconnect
// backoff short enough that a restarted BBS is followed quickly, and the BBS's load-shedding
// contract honoured for every caller: a call the BBS refused as overloaded is sent again after
// the wait it named (RetryOverloaded), so no component keeps a loop of its own for it.
package bbsclient

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// DefaultAddress is where a development BBS listens.
const DefaultAddress = "127.0.0.1:8889"

// Settings of Dial's connections.
const (
	// Keepalive is how long a connection may be idle before the client pings the BBS, so a
	// silent network failure under a long event stream is noticed.
	Keepalive = 30 * time.Second
	// MaxReconnectDelay caps the wait between reconnection attempts (gRPC's default grows to
	// two minutes).
	MaxReconnectDelay = 5 * time.Second
)

// Config is how a component reaches the BBS. Service configurations embed it, so its fields
// sit at the top level of their JSON files ("bbs_address", "bbs_addresses", "bbs_tls").
type Config struct {
	// BBSAddress is the BBS's gRPC address, or several comma-separated addresses of BBS
	// instances (any of them serves any request).
	BBSAddress string `json:"bbs_address"`
	// BBSAddresses lists the BBS instances' gRPC addresses; when set it replaces bbs_address.
	BBSAddresses []string `json:"bbs_addresses,omitempty"`
	// BBSTLS is the client certificate, key and CA for the BBS; or insecure for plaintext.
	BBSTLS tlsx.Config `json:"bbs_tls"`
}

// Default is a configuration for a development BBS on this host (TLS still to be set).
func Default() Config { return Config{BBSAddress: DefaultAddress} }

// BBSTargets returns the BBS addresses to dial: bbs_addresses when set, otherwise the
// comma-separated bbs_address.
func (c Config) BBSTargets() []string {
	if len(c.BBSAddresses) > 0 {
		return grpcx.SplitTargets(c.BBSAddresses...)
	}
	return grpcx.SplitTargets(c.BBSAddress)
}

// Validate reports every problem of c, naming the configuration field.
func (c Config) Validate() error {
	var errs []error
	if len(c.BBSTargets()) == 0 {
		errs = append(errs, errors.New("bbs_address (or bbs_addresses) is required"))
	}
	if err := c.BBSTLS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("bbs_tls: %w", err))
	}
	return errors.Join(errs...)
}

// Flags binds -bbs-address, the BBS client TLS flags (-bbs-cert, -bbs-key, -bbs-ca,
// -bbs-insecure) and -bbs-server-name to c.
func Flags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.BBSAddress, "bbs-address", c.BBSAddress, "BBS gRPC address, or several comma-separated BBS addresses")
	config.TLSFlags(fs, &c.BBSTLS, "bbs", "bbs-insecure", "BBS client")
	fs.StringVar(&c.BBSTLS.ServerName, "bbs-server-name", c.BBSTLS.ServerName, "name checked against the BBS's certificate (default: its host)")
}

// Dial connects to the BBS instances of c (round-robin over those that answer) with c's TLS,
// keepalives every Keepalive, reconnection attempts at most MaxReconnectDelay apart and
// RetryOverloaded on every unary call. opts (e.g. interceptors) are applied after those, so an
// interceptor given here sees each attempt RetryOverloaded makes. The caller closes the
// connection.
func Dial(c Config, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("bbs client: %w", err)
	}
	all := append([]grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: MaxReconnectDelay},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithChainUnaryInterceptor(RetryOverloaded()),
	}, opts...)
	conn, err := grpcx.DialMulti(c.BBSTargets(), grpcx.ClientConfig{TLS: c.BBSTLS, KeepaliveTime: Keepalive}, all...)
	if err != nil {
		return nil, fmt.Errorf("bbs client: %w", err)
	}
	return conn, nil
}
