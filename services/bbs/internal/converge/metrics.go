package converge

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are convergence's Prometheus series (and the BBS's auction request counters).
// A nil *Metrics records nothing.
type Metrics struct {
	duration          prometheus.Histogram
	runs              prometheus.Counter
	errors            prometheus.Counter
	missing           prometheus.Gauge
	extra             prometheus.Gauge
	crashed           prometheus.Gauge
	suspect           prometheus.Gauge
	restarts          prometheus.Counter
	auctionsRequested *prometheus.CounterVec
	auctionsFailed    *prometheus.CounterVec
}

// NewMetrics registers convergence's series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gavel", Subsystem: "bbs", Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "bbs", Name: name, Help: help})
	}
	m := &Metrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "gavel", Subsystem: "bbs",
			Name: "convergence_duration_seconds", Help: "Duration of one convergence pass.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
		runs:     counter("convergence_runs_total", "Convergence passes run by this BBS (as leader)."),
		errors:   counter("convergence_errors_total", "Convergence changes that failed (retried next pass)."),
		missing:  gauge("lrps_missing", "Desired instances without an actual LRP, found by the last convergence."),
		extra:    gauge("lrps_extra", "Actual LRPs no longer desired, found by the last convergence."),
		crashed:  gauge("crashed_actual_lrps", "CRASHED actual LRPs waiting for their restart, at the last convergence."),
		suspect:  gauge("suspect_actual_lrps", "SUSPECT actual LRPs (their cell vanished), at the last convergence."),
		restarts: counter("crashed_actual_lrps_restarted_total", "CRASHED actual LRPs restarted by convergence after their backoff."),
		auctionsRequested: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "bbs",
			Name: "auctions_requested_total", Help: "Instances (kind=lrp) and tasks (kind=task) sent to the auctioneer."}, []string{"kind"}),
		auctionsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "bbs",
			Name: "auctions_failed_total", Help: "Instances and tasks whose auction request the auctioneer did not accept."}, []string{"kind"}),
	}
	for _, kind := range []string{"lrp", "task"} {
		m.auctionsRequested.WithLabelValues(kind)
		m.auctionsFailed.WithLabelValues(kind)
	}
	reg.MustRegister(m.duration, m.runs, m.errors, m.missing, m.extra, m.crashed, m.suspect, m.restarts,
		m.auctionsRequested, m.auctionsFailed)
	return m
}

// AuctionRequested counts n instances or tasks sent to the auctioneer.
func (m *Metrics) AuctionRequested(kind string, n int) {
	if m != nil {
		m.auctionsRequested.WithLabelValues(kind).Add(float64(n))
	}
}

// AuctionFailed counts n instances or tasks whose auction request failed.
func (m *Metrics) AuctionFailed(kind string, n int) {
	if m != nil {
		m.auctionsFailed.WithLabelValues(kind).Add(float64(n))
	}
}

// observe records one convergence pass.
func (m *Metrics) observe(r Report) {
	if m == nil {
		return
	}
	m.observeRun(r)
	m.missing.Set(float64(r.LRPsMissing))
	m.extra.Set(float64(r.LRPsExtra))
	m.crashed.Set(float64(r.CrashedLRPs))
	m.suspect.Set(float64(r.SuspectLRPs))
	m.restarts.Add(float64(r.Restarted))
}

// observeRun records a pass's duration and errors; a cell-loss pass, which judges only the lost
// cells' instances, records only these (the gauges keep the last full pass's findings).
func (m *Metrics) observeRun(r Report) {
	if m == nil {
		return
	}
	m.duration.Observe(r.Duration.Seconds())
	m.runs.Inc()
	m.errors.Add(float64(r.Errors))
}
