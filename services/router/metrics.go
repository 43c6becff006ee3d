package router

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gavel-sched/gavel/pkg/grpcx"
)

// metrics are the router's Prometheus series, on a registry of its own (served at /metrics on
// the admin listener).
type metrics struct {
	registry *prometheus.Registry

	proxied       prometheus.Counter
	unknownHost   prometheus.Counter
	noEndpoints   prometheus.Counter
	redirects     prometheus.Counter
	notLoaded     prometheus.Counter
	backendErrors prometheus.Counter
	tcpActive     prometheus.Gauge
	tcpRejected   prometheus.Counter
	udpSessions   prometheus.Gauge
	udpDropped    prometheus.Counter
	reconnects    prometheus.Counter
	tableVersion  prometheus.Gauge
	routes        *prometheus.GaugeVec
}

// newMetrics registers the router's series and the Go and process collectors.
func newMetrics() *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "router", Name: name, Help: help})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gavel", Subsystem: "router", Name: name, Help: help})
	}
	m := &metrics{
		registry:      prometheus.NewRegistry(),
		proxied:       counter("http_proxied_requests_total", "HTTP requests sent to a backend."),
		unknownHost:   counter("http_unknown_host_total", "HTTP requests answered 404 for an unknown host."),
		noEndpoints:   counter("http_no_endpoints_total", "HTTP requests answered 503 for a route without endpoints."),
		redirects:     counter("http_tls_redirects_total", "Plain HTTP requests to tls_only routes redirected to https."),
		notLoaded:     counter("http_table_not_loaded_total", "HTTP requests answered 503 before the first routing table."),
		backendErrors: counter("http_backend_errors_total", "HTTP requests answered 502 because no endpoint answered."),
		tcpActive:     gauge("tcp_connections", "TCP connections being relayed."),
		tcpRejected:   counter("tcp_rejected_total", "TCP connections closed without a reachable endpoint."),
		udpSessions:   gauge("udp_sessions", "UDP client sessions."),
		udpDropped:    counter("udp_dropped_total", "UDP datagrams dropped: no endpoint or session limit reached."),
		reconnects:    counter("routeemitter_reconnects_total", "WatchRoutes streams that ended and were retried."),
		tableVersion:  gauge("table_version", "Version of the routing table held."),
		routes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "gavel", Subsystem: "router", Name: "routes",
			Help: "Routes in the table, by protocol."}, []string{"protocol"}),
	}
	m.registry.MustRegister(m.proxied, m.unknownHost, m.noEndpoints, m.redirects, m.notLoaded, m.backendErrors,
		m.tcpActive, m.tcpRejected, m.udpSessions, m.udpDropped, m.reconnects, m.tableVersion, m.routes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Per-RPC metrics of the route-emitter stream (a fresh registry cannot refuse them).
	_ = grpcx.RegisterClientMetrics(m.registry)
	return m
}

// observeTable records a newly installed table.
func (m *metrics) observeTable(t *table) {
	m.tableVersion.Set(float64(t.version))
	m.routes.WithLabelValues("http").Set(float64(t.http.len()))
	m.routes.WithLabelValues("tcp").Set(float64(len(t.tcp)))
	m.routes.WithLabelValues("udp").Set(float64(len(t.udp)))
}
