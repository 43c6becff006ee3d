package transform

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the chain's Prometheus series, labelled by plugin and kind.
type metrics struct {
	calls    *prometheus.CounterVec
	errors   *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gavel", Subsystem: "transform", Name: "calls_total",
			Help: "Transformer plugin calls, by plugin and kind.",
		}, []string{"plugin", "kind"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gavel", Subsystem: "transform", Name: "errors_total",
			Help: "Failed transformer plugin calls, by plugin, kind and class (external, retriable, plugin, timeout, unreachable, bad_answer, invalid_output, nondeterministic, describe).",
		}, []string{"plugin", "kind", "class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "gavel", Subsystem: "transform", Name: "call_duration_seconds",
			Help:    "Latency of transformer plugin calls (waiting for a slot included), by plugin and kind.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"plugin", "kind"}),
	}
	if reg != nil {
		m.calls = register(reg, m.calls)
		m.errors = register(reg, m.errors)
		m.duration = register(reg, m.duration)
	}
	return m
}

// register registers c, or returns the collector already registered under its name (a second
// chain in the same process shares the series).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
