package process

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// monitorActionTimeout bounds one run of a legacy monitor action.
const monitorActionTimeout = 10 * time.Second

// probe runs one check once and reports whether it passed.
type probe func(ctx context.Context) bool

// monitor drives Healthy and Routable from the moment the main action starts a process until
// ctx ends (the action finished). Health checks (or, without them, the legacy monitor
// action) must pass within the start timeout; afterwards HealthFailureThreshold consecutive
// failed rounds stop the container. Readiness checks start once healthy and flip Routable.
func (c *container) monitor(ctx context.Context, actionStart time.Time) {
	select {
	case <-c.started:
	case <-ctx.Done():
		return
	}
	checks := c.spec.Checks
	interval := checkInterval(checks)
	var health []probe
	for _, ch := range checks.GetChecks() {
		health = append(health, c.checkProbe(ch))
	}
	if len(health) == 0 && c.spec.Monitor != nil {
		health = append(health, c.monitorActionProbe(c.spec.Monitor))
	}
	var readiness []probe
	for _, ch := range checks.GetReadinessChecks() {
		readiness = append(readiness, c.checkProbe(ch))
	}

	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	if len(health) > 0 {
		startTimeout := c.spec.StartTimeout
		if startTimeout <= 0 {
			startTimeout = DefaultStartTimeout
		}
		deadline := time.NewTimer(time.Until(actionStart.Add(startTimeout)))
		defer deadline.Stop()
		for !allPass(ctx, health) {
			select {
			case <-ctx.Done():
				return
			case <-deadline.C:
				c.beginStop(ReasonNeverHealthy, c.b.killGrace)
				return
			case <-ticker.C:
			}
		}
		c.log.Debug("healthy")
	}
	c.closeHealthy()
	if len(readiness) == 0 {
		c.setRoutable(true)
		if len(health) == 0 {
			return
		}
	}

	healthFailures, readinessFailures := 0, 0
	ready := false
	for {
		if len(readiness) > 0 {
			if allPass(ctx, readiness) {
				readinessFailures = 0
				if !ready {
					ready = true
					c.setRoutable(true)
				}
			} else if readinessFailures++; ready && readinessFailures >= HealthFailureThreshold {
				ready = false
				c.setRoutable(false)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if len(health) > 0 {
			if allPass(ctx, health) {
				healthFailures = 0
			} else if healthFailures++; healthFailures >= HealthFailureThreshold {
				if ctx.Err() == nil {
					c.beginStop(ReasonHealthCheckFailed, c.b.killGrace)
				}
				return
			}
		}
	}
}

// allPass runs probes in order and reports whether they all passed.
func allPass(ctx context.Context, probes []probe) bool {
	for _, p := range probes {
		if !p(ctx) {
			return false
		}
	}
	return true
}

// checkInterval is the shortest interval among the checks, or the default.
func checkInterval(def *modelsv1.CheckDefinition) time.Duration {
	var shortest time.Duration
	for _, ch := range append(append([]*modelsv1.Check(nil), def.GetChecks()...), def.GetReadinessChecks()...) {
		ms := ch.GetTcp().GetIntervalMs()
		if ch.GetHttp() != nil {
			ms = ch.GetHttp().GetIntervalMs()
		}
		if d := time.Duration(ms) * time.Millisecond; d > 0 && (shortest == 0 || d < shortest) {
			shortest = d
		}
	}
	if shortest == 0 {
		return DefaultCheckInterval
	}
	return shortest
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

// checkProbe builds the probe of a tcp or http check.
func (c *container) checkProbe(ch *modelsv1.Check) probe {
	if h := ch.GetHttp(); h != nil {
		timeout := msOr(h.GetRequestTimeoutMs(), DefaultCheckTimeout)
		path := h.GetPath()
		if path == "" || path[0] != '/' {
			path = "/" + path
		}
		url := fmt.Sprintf("http://%s%s", c.hostAddr(h.GetPort()), path)
		client := &http.Client{
			Timeout:   timeout,
			Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
		}
		return func(ctx context.Context) bool {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return false
			}
			resp, err := client.Do(req)
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}
	}
	t := ch.GetTcp()
	timeout := msOr(t.GetConnectTimeoutMs(), DefaultCheckTimeout)
	addr := c.hostAddr(t.GetPort())
	return func(ctx context.Context) bool {
		d := net.Dialer{Timeout: timeout}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	}
}

// monitorActionProbe runs the legacy monitor action; it passes when the action succeeds.
func (c *container) monitorActionProbe(a *modelsv1.Action) probe {
	return func(ctx context.Context) bool {
		ctx, cancel := context.WithTimeout(ctx, monitorActionTimeout)
		defer cancel()
		return c.runAction(ctx, a) == nil
	}
}

func msOr(ms int64, def time.Duration) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return def
}
