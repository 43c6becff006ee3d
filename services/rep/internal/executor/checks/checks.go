// Package checks runs a container's tcp/http health and readiness checks for the executor
// backends (process and oci share it): how a check is probed, how often, and how health and
// readiness follow from the probes. Where a probe connects is the backend's business (a host
// port, or the container's own network namespace), given as an address function and a dialer.
package checks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// Defaults of the timings the spec leaves open, and the failure rule.
const (
	// DefaultStartTimeout bounds how long an LRP may take to become healthy.
	DefaultStartTimeout = 60 * time.Second
	// DefaultCheckInterval is the time between two probes of a check.
	DefaultCheckInterval = 500 * time.Millisecond
	// DefaultCheckTimeout bounds one probe.
	DefaultCheckTimeout = time.Second
	// HealthFailureThreshold is the number of consecutive failed probes that fail a check.
	HealthFailureThreshold = 3
)

// Reasons a monitor fails a container with.
const (
	// ReasonHealthCheckFailed is the reason of an LRP whose health check failed after passing.
	ReasonHealthCheckFailed = "health check failed"
	// ReasonNeverHealthy is the reason of an LRP not healthy within its start timeout.
	ReasonNeverHealthy = "health check never passed"
)

// SourceHealth is the default source of health-check lines.
const SourceHealth = "HEALTH"

// Probe runs one check once and reports whether it passed.
type Probe func(ctx context.Context) bool

// DialFunc opens a connection, like net.Dialer.DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ForChecks builds the probes of every check in checks (ForCheck).
func ForChecks(checks []*modelsv1.Check, addr func(containerPort uint32) string, dial DialFunc) []Probe {
	var out []Probe
	for _, ch := range checks {
		out = append(out, ForCheck(ch, addr, dial))
	}
	return out
}

// ForCheck builds the probe of a tcp or http check. addr gives the host:port a container port
// is reached at; dial opens the connections (nil: a plain net.Dialer).
func ForCheck(ch *modelsv1.Check, addr func(containerPort uint32) string, dial DialFunc) Probe {
	if h := ch.GetHttp(); h != nil {
		timeout := msOr(h.GetRequestTimeoutMs(), DefaultCheckTimeout)
		path := h.GetPath()
		if path == "" || path[0] != '/' {
			path = "/" + path
		}
		url := fmt.Sprintf("http://%s%s", addr(h.GetPort()), path)
		tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
		if dial != nil {
			tr.DialContext = dial
		}
		client := &http.Client{Timeout: timeout, Transport: tr}
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
	target := addr(t.GetPort())
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context) bool {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		conn, err := dial(ctx, "tcp", target)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	}
}

// Interval is the shortest interval among the checks, or DefaultCheckInterval.
func Interval(def *modelsv1.CheckDefinition) time.Duration {
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

// Monitor drives a container's health and readiness from its probes.
type Monitor struct {
	// Health are the health probes: all must pass within StartTimeout of ActionStart, and
	// HealthFailureThreshold consecutive failed rounds afterwards fail the container.
	Health []Probe
	// Readiness are the readiness probes, run once healthy; they drive SetRoutable.
	Readiness []Probe
	// Interval is the time between two rounds.
	Interval time.Duration
	// StartTimeout bounds how long the container may take to become healthy (0: the default).
	StartTimeout time.Duration
	// ActionStart is when the main action started.
	ActionStart time.Time
	// Healthy is called once the health probes first pass (at once without any).
	Healthy func()
	// SetRoutable is called with every readiness change (true at once without readiness
	// probes).
	SetRoutable func(bool)
	// Fail stops the container with a reason (ReasonNeverHealthy, ReasonHealthCheckFailed).
	Fail func(reason string)
	// Log, when set, receives a line at each change the checks see (passed, a failed round,
	// failed, readiness changes): the container's HEALTH lines (see LogTo).
	Log func(text string)
}

// LogTo is the Monitor.Log of a container whose lines go to sink, labelled with the check
// definition's log_source (default HEALTH); nil when sink is nil.
func LogTo(sink executor.LogSink, def *modelsv1.CheckDefinition) func(string) {
	if sink == nil {
		return nil
	}
	source := def.GetLogSource()
	if source == "" {
		source = SourceHealth
	}
	return func(text string) { sink.Line(source, "stdout", text) }
}

func (m Monitor) log(format string, args ...any) {
	if m.Log != nil {
		m.Log(fmt.Sprintf(format, args...))
	}
}

// Run monitors until ctx ends (the action finished) or the container failed.
func (m Monitor) Run(ctx context.Context) {
	interval := m.Interval
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	if len(m.Health) > 0 {
		startTimeout := m.StartTimeout
		if startTimeout <= 0 {
			startTimeout = DefaultStartTimeout
		}
		deadline := time.NewTimer(time.Until(m.ActionStart.Add(startTimeout)))
		defer deadline.Stop()
		for !allPass(ctx, m.Health) {
			select {
			case <-ctx.Done():
				return
			case <-deadline.C:
				m.log("%s within %s", ReasonNeverHealthy, startTimeout)
				m.Fail(ReasonNeverHealthy)
				return
			case <-ticker.C:
			}
		}
	}
	if len(m.Health) > 0 {
		m.log("health check passed")
	}
	m.Healthy()
	if len(m.Readiness) == 0 {
		m.SetRoutable(true)
		if len(m.Health) == 0 {
			return
		}
	}

	healthFailures, readinessFailures := 0, 0
	ready := false
	for {
		if len(m.Readiness) > 0 {
			if allPass(ctx, m.Readiness) {
				readinessFailures = 0
				if !ready {
					ready = true
					m.log("readiness check passed: routable")
					m.SetRoutable(true)
				}
			} else if readinessFailures++; ready && readinessFailures >= HealthFailureThreshold {
				ready = false
				m.log("readiness check failed %d times: not routable", readinessFailures)
				m.SetRoutable(false)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if len(m.Health) > 0 {
			if allPass(ctx, m.Health) {
				healthFailures = 0
			} else if healthFailures++; ctx.Err() == nil {
				m.log("health check failed (%d of %d)", healthFailures, HealthFailureThreshold)
				if healthFailures >= HealthFailureThreshold {
					m.log(ReasonHealthCheckFailed)
					m.Fail(ReasonHealthCheckFailed)
					return
				}
			}
		}
	}
}

// allPass runs probes in order and reports whether they all passed.
func allPass(ctx context.Context, probes []Probe) bool {
	for _, p := range probes {
		if !p(ctx) {
			return false
		}
	}
	return true
}

func msOr(ms int64, def time.Duration) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return def
}
