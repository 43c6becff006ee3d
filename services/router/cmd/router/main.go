// Command router runs Gavel's router: the HTTP(S)/TCP/UDP data plane fed by the route-emitter.
//
//	router -config router.json
//	router -http :8080 -https :8443 -https-cert router.crt -https-key router.key \
//	    -routeemitter-address route-emitter:8893 -routeemitter-cert router-client.crt \
//	    -routeemitter-key router-client.key -routeemitter-ca ca.crt
package main

import (
	"context"

	"github.com/gavel-sched/gavel/pkg/config"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/services/router"
)

func main() { servicemain.Main("router", run) }

func run(args []string) error {
	cfg := router.Default()
	fs := servicemain.NewFlagSet("router")
	fs.StringVar(&cfg.HTTPAddress, "http", cfg.HTTPAddress, "plain HTTP listen address")
	fs.StringVar(&cfg.HTTPSAddress, "https", cfg.HTTPSAddress, "TLS listen address (empty: none; tls_only routes unreachable)")
	fs.StringVar(&cfg.HTTPSCertFile, "https-cert", cfg.HTTPSCertFile, "TLS listener certificate (PEM)")
	fs.StringVar(&cfg.HTTPSKeyFile, "https-key", cfg.HTTPSKeyFile, "TLS listener key (PEM)")
	fs.IntVar(&cfg.HTTPSRedirectPort, "https-redirect-port", cfg.HTTPSRedirectPort, "port in https redirects (0: the TLS listener's)")
	fs.StringVar(&cfg.AdminAddress, "admin", cfg.AdminAddress, "admin listen address for /healthz and /metrics (empty: none)")
	fs.StringVar(&cfg.RouteEmitterAddress, "routeemitter-address", cfg.RouteEmitterAddress, "route-emitter gRPC address")
	config.TLSFlags(fs, &cfg.RouteEmitterTLS, "routeemitter", "routeemitter-insecure", "route-emitter client")
	fs.StringVar(&cfg.TCPBindAddress, "tcp-bind", cfg.TCPBindAddress, "IP that TCP/UDP incoming ports are opened on")
	fs.Var(&cfg.BackendDialTimeout, "backend-dial-timeout", "backend connect timeout (e.g. 5s)")
	fs.Var(&cfg.BackendResponseTimeout, "backend-response-timeout", "wait for backend response headers (e.g. 60s; 0: none)")
	fs.Var(&cfg.UDPSessionIdleTimeout, "udp-session-idle-timeout", "idle time that ends a UDP session (e.g. 30s)")
	config.LogFlags(fs, &cfg.Log)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("router", cfg.Log)
	conn, err := router.DialRouteEmitter(cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	r, err := router.New(cfg, logger, routeemitterv1.NewRouteEmitterServiceClient(conn))
	if err != nil {
		return err
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	return lifecycle.Run(ctx, logger, lifecycle.Member{Name: "router", Runner: lifecycle.RunFunc(r.Run)})
}
