// Package serviceconfig holds the configuration every Gavel service shares, in parts a service
// embeds in its own Config the way it embeds bbsclient.Config: Base (the gRPC API's listen
// address and TLS, log, metrics and authorization), Etcd (the etcd client) and Election (the
// leader election's lease). A service embeds only the parts it uses, so its file and flags
// offer nothing it would ignore: the route-emitter has no etcd, the rep elects no leader.
// Embedded without a JSON tag, each part's fields sit at the top level of the service's JSON
// file ("listen_address", "etcd_endpoints", "lock_ttl", …), where they always were. Each part
// has a default, a Validate naming the file's keys, and one function binding its flags.
package serviceconfig

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/authz"
	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// DefaultEtcdEndpoint is where a development etcd listens.
const DefaultEtcdEndpoint = "http://127.0.0.1:2379"

// Base is what every service serving a gRPC API configures the same way.
type Base struct {
	// ListenAddress is where the service's gRPC API listens.
	ListenAddress string `json:"listen_address"`
	// TLS is the API's server certificate, key and client CA; or insecure for plaintext.
	TLS tlsx.Config `json:"tls"`
	// Log sets the log level and format.
	Log logging.Config `json:"log"`
	// MetricsAddress is where Prometheus metrics are served over plain HTTP at /metrics (e.g.
	// "127.0.0.1:9090"); empty serves none.
	MetricsAddress string `json:"metrics_address,omitempty"`
	// MetricsTLS serves /metrics over mutual TLS instead, with tls's certificate and CA: a
	// scraper presents a certificate of the cluster's CA (deployments/docker's Prometheus has
	// spiffe://gavel/prometheus). Requires tls (not insecure).
	MetricsTLS bool `json:"metrics_tls,omitempty"`
	// Authz maps client certificate identities to roles (least privilege); enforced whenever
	// tls is on.
	Authz authz.Config `json:"authz"`
	// Tracing sends OpenTelemetry spans to an OTLP collector; off without an endpoint.
	Tracing tracing.Config `json:"tracing"`
}

// DefaultBase is the Base of a service listening on listen, logging text at info, with the
// default roles (TLS still to be set).
func DefaultBase(listen string) Base {
	return Base{
		ListenAddress: listen,
		Log:           logging.Config{Level: "info", Format: "text"},
		Authz:         authz.Default(),
		Tracing:       tracing.Default(),
	}
}

// Validate reports every problem of b, naming the configuration field.
func (b Base) Validate() error {
	var errs []error
	if b.ListenAddress == "" {
		errs = append(errs, errors.New("listen_address is required"))
	}
	if err := b.TLS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("tls: %w", err))
	}
	if b.MetricsTLS && b.TLS.Insecure {
		errs = append(errs, errors.New("metrics_tls: needs tls (the metrics endpoint presents the API's certificate and checks scrapers against its CA), but tls is insecure"))
	}
	if err := b.Log.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("log: %w", err))
	}
	if err := b.Authz.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("authz: %w", err))
	}
	if err := b.Tracing.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// BaseFlags binds -listen, the server TLS flags (-tls-cert, -tls-key, -tls-ca, -insecure),
// -metrics-address, -metrics-tls, -log-level, -log-format and the tracing flags (-otlp-endpoint,
// -otlp-insecure, -trace-sampling-ratio) to b. tlsWho names the server in the TLS
// flags' help ("server" when empty). The roles (authz) come from the config file only.
func BaseFlags(fs *flag.FlagSet, b *Base, tlsWho string) {
	if tlsWho == "" {
		tlsWho = "server"
	}
	fs.StringVar(&b.ListenAddress, "listen", b.ListenAddress, "gRPC listen address")
	config.TLSFlags(fs, &b.TLS, "tls", "insecure", tlsWho)
	fs.StringVar(&b.MetricsAddress, "metrics-address", b.MetricsAddress, "serve Prometheus metrics at http://ADDRESS/metrics (empty: none)")
	fs.BoolVar(&b.MetricsTLS, "metrics-tls", b.MetricsTLS, "serve /metrics over mutual TLS with the API's certificate and CA (https://ADDRESS/metrics; scrapers present a certificate of the CA)")
	config.LogFlags(fs, &b.Log)
	tracing.Flags(fs, &b.Tracing)
}

// MetricsServer is the service's /metrics server for reg: none without metrics_address, over
// mutual TLS with metrics_tls.
func (b Base) MetricsServer(reg *prometheus.Registry) *metrics.Server {
	if b.MetricsTLS {
		return metrics.NewServerIf(b.MetricsAddress, reg, metrics.WithTLS(b.TLS.ServerTLS))
	}
	return metrics.NewServerIf(b.MetricsAddress, reg)
}

// Etcd is how a service reaches etcd.
type Etcd struct {
	// EtcdEndpoints are the etcd client URLs.
	EtcdEndpoints []string `json:"etcd_endpoints"`
	// EtcdTLS is the client certificate, key and CA for etcd; or insecure for plaintext.
	EtcdTLS tlsx.Config `json:"etcd_tls"`
}

// DefaultEtcd is a client of a development etcd on this host (TLS still to be set).
func DefaultEtcd() Etcd { return Etcd{EtcdEndpoints: []string{DefaultEtcdEndpoint}} }

// Validate reports every problem of e, naming the configuration field.
func (e Etcd) Validate() error {
	var errs []error
	if len(e.EtcdEndpoints) == 0 {
		errs = append(errs, errors.New("etcd_endpoints: at least one endpoint is required"))
	}
	if err := e.EtcdTLS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("etcd_tls: %w", err))
	}
	return errors.Join(errs...)
}

// EtcdFlags binds -etcd-endpoints and the etcd client TLS flags (-etcd-cert, -etcd-key,
// -etcd-ca, -etcd-insecure) to e.
func EtcdFlags(fs *flag.FlagSet, e *Etcd) {
	fs.Var(config.List{Values: &e.EtcdEndpoints}, "etcd-endpoints", "comma-separated etcd client URLs")
	config.TLSFlags(fs, &e.EtcdTLS, "etcd", "etcd-insecure", "etcd client")
}

// Connect dials the etcd of e and checks that it answers (etcdx.Connect). The caller closes
// the client.
func (e Etcd) Connect(logger hclog.Logger) (*clientv3.Client, error) {
	return etcdx.Connect(e.EtcdEndpoints, e.EtcdTLS, logger)
}

// Election is the lease of a service's leader election.
type Election struct {
	// LockTTL is the TTL of the election lease (whole seconds, at least 1s): a leader that
	// cannot refresh it for this long loses leadership and a standby takes over.
	LockTTL config.Duration `json:"lock_ttl"`
}

// DefaultElection is an election with etcdx.DefaultElectionTTL.
func DefaultElection() Election { return Election{LockTTL: config.Duration(etcdx.DefaultElectionTTL)} }

// Validate reports a lease shorter than a second (etcd leases are whole seconds).
func (e Election) Validate() error {
	if e.LockTTL < config.Duration(time.Second) {
		return fmt.Errorf("lock_ttl must be at least 1s, got %s", e.LockTTL)
	}
	return nil
}

// ElectionFlags binds -lock-ttl to e.
func ElectionFlags(fs *flag.FlagSet, e *Election) {
	fs.Var(&e.LockTTL, "lock-ttl", "leader election lease TTL")
}

// NewElection is a contender for service's leadership over etcd with e's lease, identified as
// ContenderID(address).
func (e Election) NewElection(etcd *clientv3.Client, service, address string, logger hclog.Logger) (*etcdx.Election, error) {
	return etcdx.NewElection(etcd, service, ContenderID(address), time.Duration(e.LockTTL), logger)
}

// ContenderID is the value a contender stores in its election key, the same for every
// service: "HOST/ADDRESS/UUID", the host name, the address the contender serves on and a
// random id telling apart two runs on one host and address. Operators (and tests) find who
// leads by the address between the slashes.
func ContenderID(address string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s/%s/%s", host, address, uuid.NewString())
}
