package process

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/gavel-sched/gavel/services/rep/internal/executor/checks"
)

// monitor drives Healthy and Routable from the moment the main action starts a process until
// ctx ends (the action finished), with the checks of package checks probing the host ports.
// Without health checks the legacy monitor action, if any, is the health probe.
func (c *container) monitor(ctx context.Context, actionStart time.Time) {
	select {
	case <-c.started:
	case <-ctx.Done():
		return
	}
	def := c.spec.Checks
	health := checks.ForChecks(def.GetChecks(), c.hostAddr, nil)
	if len(health) == 0 && c.spec.Monitor != nil {
		health = append(health, c.tree().Probe(c.spec.Monitor))
	}
	readiness := checks.ForChecks(def.GetReadinessChecks(), c.hostAddr, nil)
	checks.Monitor{
		Health:       health,
		Readiness:    readiness,
		Interval:     checks.Interval(def),
		StartTimeout: c.spec.StartTimeout,
		ActionStart:  actionStart,
		Log:          checks.LogTo(c.spec.Log, def),
		Healthy: func() {
			if len(health) > 0 {
				c.log.Debug("healthy")
			}
			c.closeHealthy()
		},
		SetRoutable: c.setRoutable,
		Fail:        func(reason string) { c.beginStop(reason, c.b.killGrace) },
	}.Run(ctx)
}

// hostAddr is <cell address>:<host port of the container port> (the port itself when
// unmapped): where the instance is reached (net_info) and the address the process is given in
// CF_INSTANCE_IP, so a process that binds only that address passes its checks.
func (c *container) hostAddr(containerPort uint32) string {
	port := int(containerPort)
	if hp, ok := c.mapping[containerPort]; ok {
		port = hp
	}
	return net.JoinHostPort(c.b.opts.CellAddress, strconv.Itoa(port))
}
