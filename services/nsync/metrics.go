package nsync

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/metrics"
)

// serviceMetrics are nsync's Prometheus series on a registry of its own; the core feeds them
// as its core.Observer.
type serviceMetrics struct {
	registry   *prometheus.Registry
	passes     *prometheus.CounterVec
	passTime   prometheus.Histogram
	reconciled *prometheus.CounterVec
	restarts   *prometheus.CounterVec
	deploys    *prometheus.CounterVec
	// toReencrypt is what the leader's last re-encryption step left to do.
	toReencrypt prometheus.Gauge
}

func newServiceMetrics() *serviceMetrics {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "gavel", Subsystem: "nsync", Name: name, Help: help}
	}
	m := &serviceMetrics{
		registry: metrics.NewRegistry(),
		passes: prometheus.NewCounterVec(opts("bulk_passes_total",
			"Bulk passes of the leader, by result: complete (cf-apps refreshed) or incomplete."), []string{"result"}),
		passTime: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "gavel", Subsystem: "nsync",
			Name: "bulk_pass_duration_seconds", Help: "Wall time of a bulk pass.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14)}),
		reconciled: prometheus.NewCounterVec(opts("bulk_lrps_total",
			"LRPs the bulk loop changed at the BBS, by action: desired (missing), updated (drifted), removed (unknown)."), []string{"action"}),
		restarts: prometheus.NewCounterVec(opts("restarts_total",
			"Finished zero-downtime restarts, by outcome: completed, cell_mismatch or timed_out."), []string{"outcome"}),
		deploys: prometheus.NewCounterVec(opts("deployments_total",
			"Finished deployments, by outcome: succeeded, failed or cancelled."), []string{"outcome"}),
		toReencrypt: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gavel", Subsystem: "nsync", Name: "records_to_reencrypt",
			Help: "App records not yet sealed under the active encryption key, as of the leader's last re-encryption step (zero elsewhere)."}),
	}
	m.registry.MustRegister(m.passes, m.passTime, m.reconciled, m.restarts, m.deploys, m.toReencrypt, bbsclient.Metrics())
	for _, r := range []string{"complete", "incomplete"} {
		m.passes.WithLabelValues(r)
	}
	for _, a := range []string{"desired", "updated", "removed"} {
		m.reconciled.WithLabelValues(a)
	}
	for _, o := range []string{"completed", "cell_mismatch", "timed_out"} {
		m.restarts.WithLabelValues(o)
	}
	for _, o := range []string{"succeeded", "failed", "cancelled"} {
		m.deploys.WithLabelValues(o)
	}
	return m
}

// BulkPass implements core.Observer.
func (m *serviceMetrics) BulkPass(d time.Duration, ok bool) {
	result := "complete"
	if !ok {
		result = "incomplete"
	}
	m.passes.WithLabelValues(result).Inc()
	m.passTime.Observe(d.Seconds())
}

// Reconciled implements core.Observer.
func (m *serviceMetrics) Reconciled(desired, updated, removed int) {
	m.reconciled.WithLabelValues("desired").Add(float64(desired))
	m.reconciled.WithLabelValues("updated").Add(float64(updated))
	m.reconciled.WithLabelValues("removed").Add(float64(removed))
}

// Restart implements core.Observer.
func (m *serviceMetrics) Restart(outcome string) { m.restarts.WithLabelValues(outcome).Inc() }

// Deployment implements core.Observer.
func (m *serviceMetrics) Deployment(outcome string) { m.deploys.WithLabelValues(outcome).Inc() }
