package main

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/gavel-sched/gavel/cmd/gavel/internal/console"
	"github.com/gavel-sched/gavel/pkg/authz"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

func (c *cli) uiCommand() *cobra.Command {
	var listen, role string
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve a local web console of the cluster (cells, apps, LRPs, tasks, pools, live events)",
		Long: `ui serves a web console on a local address and prints its URL, like nomad ui.

The console calls the BBS, nsync, the route-emitter and the reps with your certificate
(--tls-cert or $GAVEL_TLS_CERT), so it may do exactly what you may: a read-only identity sees
no action buttons and the BBS (or nsync) refuses its actions; admin can scale an LRP, restart
an app, retire an instance and cancel a task, each after a confirmation. Pages update live from the BBS event stream.
It serves plain HTTP: keep --listen on loopback.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bbs, err := c.bbsClient()
			if err != nil {
				return err
			}
			identity, guessed := callerRole(c.tls)
			if role == "" {
				role = guessed
			}
			cfg := console.Config{BBS: bbs, Identity: identity, Role: role, DialRep: c.dial,
				Logger: hclog.New(&hclog.LoggerOptions{Name: "console", Output: c.err, Level: hclog.Warn})}
			if c.routeEmitter != "" {
				conn, err := c.dial(c.routeEmitter)
				if err != nil {
					return err
				}
				cfg.RouteEmitter = routeemitterv1.NewRouteEmitterServiceClient(conn)
			}
			if c.nsync != "" {
				conn, err := c.dial(c.nsync)
				if err != nil {
					return err
				}
				cfg.Nsync = nsyncv1.NewNsyncServiceClient(conn)
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return usageErrorf("--listen %s: %v", listen, err)
			}
			cfg.Listener = l
			srv, err := console.New(cfg)
			if err != nil {
				l.Close()
				return err
			}
			if host, _, _ := net.SplitHostPort(listen); !isLoopback(host) {
				fmt.Fprintf(c.err, "warning: the console serves plain HTTP on %s with your certificate's authority: anyone who reaches it acts as %s\n", l.Addr(), identity)
			}
			return srv.Run(cmd.Context(), func() {
				fmt.Fprintf(c.out, "Gavel console: %s (as %s, role %s; Ctrl-C stops it)\n", srv.URL(), identity, role)
			})
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:4650", "HTTP address to serve the console on (port 0 picks one)")
	cmd.Flags().StringVar(&role, "role", "", "the role your certificate has, when the services map it otherwise than the documented defaults (only admin sees action buttons; the BBS decides either way)")
	return cmd
}

// callerRole names the caller's certificate identity and its role by the documented default
// roles (authz.Default): the console shows action buttons to admin only.
func callerRole(cfg tlsx.Config) (identity, role string) {
	if cfg.Insecure {
		return "no certificate (plaintext: nothing is enforced)", authz.Admin
	}
	b, err := os.ReadFile(cfg.CertFile)
	if err != nil {
		return "unknown identity", "unknown"
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return "unknown identity", "unknown"
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "unknown identity", "unknown"
	}
	for _, u := range cert.URIs {
		if u.Scheme == tlsx.SPIFFEScheme {
			if r, ok := authz.Default().RoleOf(u.String()); ok {
				return u.String(), r.String()
			}
			return u.String(), "unknown"
		}
	}
	return "a certificate without a spiffe identity", "unknown"
}

// isLoopback reports whether host is a loopback name or address.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
