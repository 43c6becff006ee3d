package routeemitter

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/services/routeemitter/internal/api"
)

// syncBuckets are the histogram buckets of a full sync, in seconds: from 1 ms (a small BBS on
// loopback) to a minute (a very large one).
var syncBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// eventKinds are the BBS event kinds the syncer applies.
var eventKinds = []string{"desired_lrp_created", "desired_lrp_changed", "desired_lrp_removed", "actual_lrp_created", "actual_lrp_changed", "actual_lrp_removed"}

// serviceMetrics are the route-emitter's Prometheus series, on a registry of the service's own.
// The table's gauges and the snapshot counters are read from the hub at scrape time; the sync
// series are fed by the syncer (as its syncer.Observer).
type serviceMetrics struct {
	registry *prometheus.Registry

	events     *prometheus.CounterVec
	syncs      prometheus.Counter
	syncTime   prometheus.Histogram
	syncErrors *prometheus.CounterVec
}

// newServiceMetrics registers the route-emitter's series, the hub's gauges and the Go and
// process collectors.
func newServiceMetrics(hub *api.Hub) *serviceMetrics {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "gavel", Subsystem: "routeemitter", Name: name, Help: help}
	}
	m := &serviceMetrics{
		registry: metrics.NewRegistry(),
		events: prometheus.NewCounterVec(opts("events_applied_total",
			"BBS events applied to the routing table, by kind (events a listing already held are skipped)."), []string{"kind"}),
		syncs: prometheus.NewCounter(opts("full_syncs_total",
			"Full listings of the BBS applied to the table (the first sync, periodic syncs, re-lists after compaction).")),
		syncTime: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "gavel", Subsystem: "routeemitter",
			Name: "full_sync_duration_seconds", Help: "Wall time of a full listing of the BBS, applying and publishing it included.", Buckets: syncBuckets}),
		syncErrors: prometheus.NewCounterVec(opts("sync_errors_total",
			"Failed listings (stage list) and broken or refused event streams (stage watch) of the BBS."), []string{"stage"}),
	}
	m.registry.MustRegister(m.events, m.syncs, m.syncTime, m.syncErrors, hubCollector{hub: hub}, bbsclient.Metrics())
	for _, k := range eventKinds {
		m.events.WithLabelValues(k)
	}
	for _, s := range []string{"list", "watch"} {
		m.syncErrors.WithLabelValues(s)
	}
	return m
}

// Listed implements syncer.Observer.
func (m *serviceMetrics) Listed(d time.Duration) {
	m.syncs.Inc()
	m.syncTime.Observe(d.Seconds())
}

// EventApplied implements syncer.Observer.
func (m *serviceMetrics) EventApplied(kind string) { m.events.WithLabelValues(kind).Inc() }

// SyncFailed implements syncer.Observer.
func (m *serviceMetrics) SyncFailed(stage string) { m.syncErrors.WithLabelValues(stage).Inc() }

// Descriptions of the hub's series.
var (
	routesDesc    = prometheus.NewDesc("gavel_routeemitter_routes", "Routes in the served table, by protocol (http, tcp, udp).", []string{"protocol"}, nil)
	endpointsDesc = prometheus.NewDesc("gavel_routeemitter_endpoints", "Endpoints over every route of the served table.", nil, nil)
	versionDesc   = prometheus.NewDesc("gavel_routeemitter_table_version", "Version of the served table (it restarts with the table id at every start).", nil, nil)
	watchersDesc  = prometheus.NewDesc("gavel_routeemitter_watchers", "Routers watching the table (open WatchRoutes streams).", nil, nil)
	snapshotsDesc = prometheus.NewDesc("gavel_routeemitter_snapshots_sent_total",
		"Whole-table snapshots sent to watchers, by reason: watch (a new or out-of-date watcher) or resync (a watcher that fell behind).", []string{"reason"}, nil)
)

// protocols are the route protocols reported, with their labels.
var protocols = []routeemitterv1.Route_Protocol{routeemitterv1.Route_PROTOCOL_HTTP, routeemitterv1.Route_PROTOCOL_TCP, routeemitterv1.Route_PROTOCOL_UDP}

// hubCollector reads the hub's series at scrape time.
type hubCollector struct{ hub *api.Hub }

// Describe implements prometheus.Collector.
func (hubCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{routesDesc, endpointsDesc, versionDesc, watchersDesc, snapshotsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c hubCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.hub.Stats()
	for _, p := range protocols {
		label := strings.ToLower(strings.TrimPrefix(p.String(), "PROTOCOL_"))
		ch <- prometheus.MustNewConstMetric(routesDesc, prometheus.GaugeValue, float64(s.Routes[p]), label)
	}
	ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, float64(s.Endpoints))
	ch <- prometheus.MustNewConstMetric(versionDesc, prometheus.GaugeValue, float64(s.Version))
	ch <- prometheus.MustNewConstMetric(watchersDesc, prometheus.GaugeValue, float64(s.Watchers))
	ch <- prometheus.MustNewConstMetric(snapshotsDesc, prometheus.CounterValue, float64(s.Snapshots), "watch")
	ch <- prometheus.MustNewConstMetric(snapshotsDesc, prometheus.CounterValue, float64(s.Resyncs), "resync")
}
