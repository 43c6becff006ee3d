// Command router runs Gavel's router: the HTTP(S)/TCP/UDP data plane fed by the route-emitter.
//
//	router -config router.json
//	router -http :8080 -https :8443 -https-cert router.crt -https-key router.key \
//	    -routeemitter-address route-emitter:8893 -routeemitter-cert router-client.crt \
//	    -routeemitter-key router-client.key -routeemitter-ca ca.crt
package main

import (
	"context"

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
	cfg.Flags(fs)
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
