package auctioneer

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/auction"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/batch"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

// roundBuckets are the histogram buckets of round phases, in seconds: from 1 ms (a few cells
// on loopback) to 30 s (a perform timeout).
var roundBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// serviceMetrics are the auctioneer's Prometheus series (Diego's operator signals among them:
// auctions failed, fetch-states duration), on a registry of the service's own.
type serviceMetrics struct {
	registry *prometheus.Registry

	rounds       prometheus.Counter
	roundErrors  prometheus.Counter
	started      *prometheus.CounterVec
	failed       *prometheus.CounterVec
	fetchStates  prometheus.Histogram
	perform      prometheus.Histogram
	roundSeconds prometheus.Histogram
	unreachable  prometheus.Counter
	reused       prometheus.Counter
	asked        prometheus.Counter
	widened      prometheus.Counter
	leader       prometheus.Gauge
}

// newServiceMetrics registers the auctioneer's series and the Go and process collectors.
func newServiceMetrics() *serviceMetrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "auctioneer", Name: name, Help: help})
	}
	histogram := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "gavel", Subsystem: "auctioneer", Name: name, Help: help, Buckets: roundBuckets})
	}
	m := &serviceMetrics{
		registry:    metrics.NewRegistry(),
		rounds:      counter("rounds_total", "Auction rounds run by this auctioneer while leading."),
		roundErrors: counter("round_errors_total", "Auction rounds that could not run (the BBS did not list the cells)."),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "auctioneer",
			Name: "auctions_started_total", Help: "Work items placed on a cell, by kind (lrp, task)."}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "auctioneer",
			Name: "auctions_failed_total", Help: "Work items that could not be placed, by kind (lrp, task) and placement error code."}, []string{"kind", "code"}),
		fetchStates:  histogram("fetch_states_duration_seconds", "Time a round took to fetch the State of the cells it asked."),
		perform:      histogram("perform_duration_seconds", "Time a round took to hand its work to the cells (Perform, retries included)."),
		roundSeconds: histogram("round_duration_seconds", "Wall time of a whole auction round."),
		unreachable:  counter("cells_unreachable_total", "Cells that did not answer State in a round, summed over rounds."),
		reused:       counter("cell_states_reused_total", "Cells whose last known state stood in for a State call in a round, summed over rounds."),
		asked:        counter("cells_asked_total", "Cells whose states a round used (every registered cell, or a sample), summed over rounds."),
		widened:      counter("rounds_widened_total", "Sampled rounds that placed work the sample could not take over every cell."),
		leader:       prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gavel", Subsystem: "auctioneer", Name: "leader", Help: "1 while this auctioneer leads, 0 while it stands by."}),
	}
	m.registry.MustRegister(m.rounds, m.roundErrors, m.started, m.failed, m.fetchStates, m.perform, m.roundSeconds, m.unreachable, m.reused, m.asked, m.widened, m.leader,
		bbsclient.Metrics())
	return m
}

// kindLabel names a work kind for the metrics.
func kindLabel(k placement.Kind) string {
	if k == placement.KindTask {
		return "task"
	}
	return "lrp"
}

// observeRound records a round that ran over entries.
func (m *serviceMetrics) observeRound(entries []batch.Entry, res auction.Result) {
	kinds := make(map[string]placement.Kind, len(entries))
	for _, e := range entries {
		kinds[e.Work.Key()] = e.Work.Kind
	}
	for key := range res.Placed {
		m.started.WithLabelValues(kindLabel(kinds[key])).Inc()
	}
	for key, f := range res.Failed {
		code := strings.TrimPrefix(f.Code.String(), "CODE_")
		m.failed.WithLabelValues(kindLabel(kinds[key]), code).Inc()
	}
	t := res.Timings
	m.fetchStates.Observe(t.FetchStates.Seconds())
	m.perform.Observe(t.Perform.Seconds())
	m.roundSeconds.Observe((t.ListCells + t.FetchStates + t.Place + t.Perform + t.Report).Seconds())
	m.unreachable.Add(float64(res.Unreachable))
	m.reused.Add(float64(res.Reused))
	m.asked.Add(float64(res.Asked))
	if res.Widened {
		m.widened.Inc()
	}
}
