package router

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"time"

	"github.com/gavel-sched/gavel/pkg/config"

	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// Config is the router's configuration. Fields are set from a JSON config file and flags.
type Config struct {
	// HTTPAddress is where plain HTTP requests are served (":8080"-style host:port).
	HTTPAddress string `json:"http_address"`
	// HTTPSAddress is where the TLS listener serves every HTTP route, including tls_only (ssl)
	// routes. Empty disables it: tls_only routes are then unreachable, and plain requests to
	// them still get the redirect to https. Requires https_cert_file and https_key_file.
	HTTPSAddress string `json:"https_address"`
	// HTTPSCertFile is the PEM certificate (chain) the TLS listener presents.
	HTTPSCertFile string `json:"https_cert_file"`
	// HTTPSKeyFile is the PEM private key of HTTPSCertFile.
	HTTPSKeyFile string `json:"https_key_file"`
	// HTTPSRedirectPort is the port written into redirects of tls_only routes requested over
	// plain HTTP (e.g. a load balancer's 443 in front of the router). Zero means the TLS
	// listener's bound port, or 443 without a TLS listener; 443 is left out of the URL.
	HTTPSRedirectPort int `json:"https_redirect_port"`
	// AdminAddress serves /healthz (200 once the first routing table is loaded, 503 before)
	// and /metrics (Prometheus). Empty disables it.
	AdminAddress string `json:"admin_address"`
	// AdminTLS serves the admin address over mutual TLS with routeemitter_tls's certificate and
	// CA (the router's own identity): a scraper presents a certificate of the cluster's CA.
	AdminTLS bool `json:"admin_tls,omitempty"`
	// RouteEmitterAddress is the route-emitter's gRPC address (host:port).
	RouteEmitterAddress string `json:"routeemitter_address"`
	// RouteEmitterTLS is the client certificate, key and CA for the route-emitter; or insecure
	// for plaintext.
	RouteEmitterTLS tlsx.Config `json:"routeemitter_tls"`
	// TCPBindAddress is the IP that TCP and UDP incoming ports are opened on.
	TCPBindAddress string `json:"tcp_bind_address"`
	// IncomingPortRange is the inclusive range of TCP and UDP incoming ports the router opens,
	// "start-end"; routes on other ports are refused (logged, never opened). Keep it equal to
	// the BBS's incoming_port_range.
	IncomingPortRange string `json:"incoming_port_range"`
	// BackendDialTimeout bounds connecting to a backend (HTTP and TCP); a dial that fails or
	// times out is retried once on the route's next endpoint.
	BackendDialTimeout Duration `json:"backend_dial_timeout"`
	// BackendResponseTimeout bounds the wait for a backend's response headers once the request
	// is written; zero means no limit. A timeout is answered 502.
	BackendResponseTimeout Duration `json:"backend_response_timeout"`
	// BackendMaxIdleConnsPerHost is how many idle keep-alive connections are kept per backend.
	BackendMaxIdleConnsPerHost int `json:"backend_max_idle_conns_per_host"`
	// BackendIdleConnTimeout closes idle backend keep-alive connections after this long.
	BackendIdleConnTimeout Duration `json:"backend_idle_conn_timeout"`
	// ClientIdleTimeout closes idle client keep-alive connections after this long.
	ClientIdleTimeout Duration `json:"client_idle_timeout"`
	// ClientReadHeaderTimeout bounds reading a client request's headers.
	ClientReadHeaderTimeout Duration `json:"client_read_header_timeout"`
	// UDPSessionIdleTimeout ends a UDP client's session (and frees its backend socket) after
	// this long without a datagram in either direction.
	UDPSessionIdleTimeout Duration `json:"udp_session_idle_timeout"`
	// UDPMaxSessions bounds the UDP sessions per incoming port; datagrams from further new
	// clients are dropped until sessions expire. Each session holds a 64 KiB receive buffer.
	UDPMaxSessions int `json:"udp_max_sessions"`
	// ReconnectMinBackoff is the first wait before re-watching the route-emitter after the
	// stream fails; it doubles per consecutive failure up to ReconnectMaxBackoff.
	ReconnectMinBackoff Duration `json:"reconnect_min_backoff"`
	// ReconnectMaxBackoff caps the wait between route-emitter reconnection attempts.
	ReconnectMaxBackoff Duration `json:"reconnect_max_backoff"`
	// ShutdownTimeout bounds the graceful drain of in-flight HTTP requests on stop.
	ShutdownTimeout Duration `json:"shutdown_timeout"`
	// Log sets the log level and format.
	Log logging.Config `json:"log"`
}

// Duration is a time.Duration written as a string ("10s") in config files and flags.
type Duration = config.Duration

// DefaultIncomingPortRange is the default of Config.IncomingPortRange: every unprivileged port.
const DefaultIncomingPortRange = "1024-65535"

// Default is the router's configuration before the file and flags; routeemitter_address and a
// routeemitter_tls choice must still be set.
func Default() Config {
	return Config{
		HTTPAddress:                ":8080",
		AdminAddress:               ":8081",
		TCPBindAddress:             "0.0.0.0",
		IncomingPortRange:          DefaultIncomingPortRange,
		BackendDialTimeout:         Duration(5 * time.Second),
		BackendResponseTimeout:     Duration(60 * time.Second),
		BackendMaxIdleConnsPerHost: 100,
		BackendIdleConnTimeout:     Duration(90 * time.Second),
		ClientIdleTimeout:          Duration(90 * time.Second),
		ClientReadHeaderTimeout:    Duration(30 * time.Second),
		UDPSessionIdleTimeout:      Duration(30 * time.Second),
		UDPMaxSessions:             1024,
		ReconnectMinBackoff:        Duration(200 * time.Millisecond),
		ReconnectMaxBackoff:        Duration(10 * time.Second),
		ShutdownTimeout:            Duration(10 * time.Second),
		Log:                        logging.Config{Level: "info", Format: "text"},
	}
}

// LoadFile overlays the JSON config file at path on c.
func (c *Config) LoadFile(path string) error { return config.LoadJSON(path, c) }

// Flags binds the router's command-line flags to c. The router serves no gRPC API, so it
// embeds none of serviceconfig's parts: its listeners, admin address (/healthz and /metrics)
// and route-emitter client are its own.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.HTTPAddress, "http", c.HTTPAddress, "plain HTTP listen address")
	fs.StringVar(&c.HTTPSAddress, "https", c.HTTPSAddress, "TLS listen address (empty: none; tls_only routes unreachable)")
	fs.StringVar(&c.HTTPSCertFile, "https-cert", c.HTTPSCertFile, "TLS listener certificate (PEM)")
	fs.StringVar(&c.HTTPSKeyFile, "https-key", c.HTTPSKeyFile, "TLS listener key (PEM)")
	fs.IntVar(&c.HTTPSRedirectPort, "https-redirect-port", c.HTTPSRedirectPort, "port in https redirects (0: the TLS listener's)")
	fs.StringVar(&c.AdminAddress, "admin", c.AdminAddress, "admin listen address for /healthz and /metrics (empty: none)")
	fs.BoolVar(&c.AdminTLS, "admin-tls", c.AdminTLS, "serve the admin address over mutual TLS with the route-emitter client certificate and CA")
	fs.StringVar(&c.RouteEmitterAddress, "routeemitter-address", c.RouteEmitterAddress, "route-emitter gRPC address")
	config.TLSFlags(fs, &c.RouteEmitterTLS, "routeemitter", "routeemitter-insecure", "route-emitter client")
	fs.StringVar(&c.TCPBindAddress, "tcp-bind", c.TCPBindAddress, "IP that TCP/UDP incoming ports are opened on")
	fs.Var(&c.BackendDialTimeout, "backend-dial-timeout", "backend connect timeout (e.g. 5s)")
	fs.Var(&c.BackendResponseTimeout, "backend-response-timeout", "wait for backend response headers (e.g. 60s; 0: none)")
	fs.Var(&c.UDPSessionIdleTimeout, "udp-session-idle-timeout", "idle time that ends a UDP session (e.g. 30s)")
	config.LogFlags(fs, &c.Log)
}

// Validate reports every problem that would stop the router from starting.
func (c Config) Validate() error {
	var errs []error
	checkAddr := func(name, addr string, required bool) {
		if addr == "" {
			if required {
				errs = append(errs, fmt.Errorf("%s is required", name))
			}
			return
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, addr, err))
		}
	}
	checkAddr("http_address", c.HTTPAddress, true)
	checkAddr("https_address", c.HTTPSAddress, false)
	checkAddr("admin_address", c.AdminAddress, false)
	checkAddr("routeemitter_address", c.RouteEmitterAddress, true)
	if c.HTTPSAddress != "" || c.HTTPSCertFile != "" || c.HTTPSKeyFile != "" {
		if c.HTTPSAddress == "" || c.HTTPSCertFile == "" || c.HTTPSKeyFile == "" {
			errs = append(errs, errors.New("https_address, https_cert_file and https_key_file must be set together"))
		}
	}
	if c.HTTPSRedirectPort < 0 || c.HTTPSRedirectPort > 65535 {
		errs = append(errs, fmt.Errorf("https_redirect_port %d is out of range", c.HTTPSRedirectPort))
	}
	if err := c.RouteEmitterTLS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("routeemitter_tls: %w", err))
	}
	if c.AdminTLS && c.RouteEmitterTLS.Insecure {
		errs = append(errs, errors.New("admin_tls: needs routeemitter_tls (its certificate and CA serve the admin address), but it is insecure"))
	}
	if _, _, err := config.ParsePortRange(c.IncomingPortRange); err != nil {
		errs = append(errs, fmt.Errorf("incoming_port_range: %w", err))
	}
	if net.ParseIP(c.TCPBindAddress) == nil {
		errs = append(errs, fmt.Errorf("tcp_bind_address %q must be an IP address", c.TCPBindAddress))
	}
	positive := func(name string, d Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, time.Duration(d)))
		}
	}
	positive("backend_dial_timeout", c.BackendDialTimeout)
	positive("backend_idle_conn_timeout", c.BackendIdleConnTimeout)
	positive("client_idle_timeout", c.ClientIdleTimeout)
	positive("client_read_header_timeout", c.ClientReadHeaderTimeout)
	positive("udp_session_idle_timeout", c.UDPSessionIdleTimeout)
	positive("reconnect_min_backoff", c.ReconnectMinBackoff)
	positive("reconnect_max_backoff", c.ReconnectMaxBackoff)
	positive("shutdown_timeout", c.ShutdownTimeout)
	if c.BackendResponseTimeout < 0 {
		errs = append(errs, errors.New("backend_response_timeout must not be negative"))
	}
	if c.ReconnectMaxBackoff < c.ReconnectMinBackoff {
		errs = append(errs, errors.New("reconnect_max_backoff must not be below reconnect_min_backoff"))
	}
	if c.BackendMaxIdleConnsPerHost <= 0 {
		errs = append(errs, fmt.Errorf("backend_max_idle_conns_per_host must be positive, got %d", c.BackendMaxIdleConnsPerHost))
	}
	if c.UDPMaxSessions <= 0 {
		errs = append(errs, fmt.Errorf("udp_max_sessions must be positive, got %d", c.UDPMaxSessions))
	}
	if err := c.Log.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("log: %w", err))
	}
	return errors.Join(errs...)
}
