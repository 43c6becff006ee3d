package rep

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/metrics"
	"github.com/gavel-sched/gavel/services/rep/internal/cell"
	"github.com/gavel-sched/gavel/services/rep/internal/drain"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
	"github.com/gavel-sched/gavel/services/rep/internal/logs"
)

// reconcileBuckets are the histogram buckets of a bulk reconcile, in seconds: from 1 ms (two
// list calls on loopback) to a minute (retries against a struggling BBS).
var reconcileBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// serviceMetrics are the rep's Prometheus series, on a registry of the service's own. The
// containers, capacity and evacuating gauges are read from the cell at scrape time; the
// counters are fed by the cell (as its cell.Observer). Calls to the BBS are counted and timed
// by grpcx's client interceptor (grpc_client_handled_total, grpc_client_handling_seconds).
type serviceMetrics struct {
	registry *prometheus.Registry

	starts         *prometheus.CounterVec
	crashes        prometheus.Counter
	stops          *prometheus.CounterVec
	hookFailures   *prometheus.CounterVec
	reconcile      prometheus.Histogram
	reconcileFails prometheus.Counter
	fixes          *prometheus.CounterVec
}

// newServiceMetrics registers the rep's series, the cell's gauges (read through stats) and
// the Go and process collectors.
func newServiceMetrics(stats func() cell.Stats) *serviceMetrics {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "gavel", Subsystem: "rep", Name: name, Help: help}
	}
	m := &serviceMetrics{
		registry: metrics.NewRegistry(),
		starts: prometheus.NewCounterVec(opts("container_starts_total",
			"Containers the backend started, by kind (lrp, task)."), []string{"kind"}),
		crashes: prometheus.NewCounter(opts("container_crashes_total",
			"LRP containers that ended, or failed to start, without the rep stopping them.")),
		stops: prometheus.NewCounterVec(opts("container_stops_total",
			"Containers the rep stopped itself (stop requests, cancelled tasks, bulk, evacuation, shutdown), by kind."), []string{"kind"}),
		hookFailures: prometheus.NewCounterVec(opts("hook_failures_total",
			"Container hooks that failed, by event (on_create, on_destroy)."), []string{"event"}),
		reconcile: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "gavel", Subsystem: "rep",
			Name: "bulk_reconcile_duration_seconds", Help: "Wall time of a bulk reconcile of the cell's containers with the BBS.", Buckets: reconcileBuckets}),
		reconcileFails: prometheus.NewCounter(opts("bulk_reconcile_errors_total",
			"Bulk reconciles that failed (the BBS could not be listed or a repair failed).")),
		fixes: prometheus.NewCounterVec(opts("bulk_reconcile_fixes_total",
			"Repairs made by the bulk loop, by fix (remove_record, fail_task, stop_container)."), []string{"fix"}),
	}
	m.registry.MustRegister(m.starts, m.crashes, m.stops, m.hookFailures, m.reconcile, m.reconcileFails, m.fixes,
		cellCollector{stats: stats}, bbsclient.Metrics())
	// Series that should read 0 rather than be absent until their first event.
	for _, k := range []string{"lrp", "task"} {
		m.starts.WithLabelValues(k)
		m.stops.WithLabelValues(k)
	}
	for _, e := range []string{"on_create", "on_destroy"} {
		m.hookFailures.WithLabelValues(e)
	}
	for _, f := range []string{cell.FixRemoveRecord, cell.FixFailTask, cell.FixStopContainer, cell.FixReportContainer} {
		m.fixes.WithLabelValues(f)
	}
	return m
}

// watchLogs registers the log store's counters, read at scrape time.
func (m *serviceMetrics) watchLogs(store *logs.Store) {
	m.registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "rep", Name: "log_lines_total",
			Help: "Container log lines written to the cell's log store."}, func() float64 { return float64(store.Written()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "rep", Name: "log_lines_dropped_total",
			Help: "Container log lines lost before reaching the cell's disk: the write queue was full or the write failed."},
			func() float64 { return float64(store.Dropped()) }),
	)
}

// kindLabel names a container kind for the metrics.
func kindLabel(k executor.Kind) string {
	if k == executor.KindTask {
		return "task"
	}
	return "lrp"
}

// ContainerStarted implements cell.Observer.
func (m *serviceMetrics) ContainerStarted(k executor.Kind) {
	m.starts.WithLabelValues(kindLabel(k)).Inc()
}

// ContainerCrashed implements cell.Observer.
func (m *serviceMetrics) ContainerCrashed() { m.crashes.Inc() }

// ContainerStopped implements cell.Observer.
func (m *serviceMetrics) ContainerStopped(k executor.Kind) {
	m.stops.WithLabelValues(kindLabel(k)).Inc()
}

// HookFailed implements cell.Observer.
func (m *serviceMetrics) HookFailed(event string) { m.hookFailures.WithLabelValues(event).Inc() }

// Reconciled implements cell.Observer.
func (m *serviceMetrics) Reconciled(d time.Duration, err error) {
	m.reconcile.Observe(d.Seconds())
	if err != nil {
		m.reconcileFails.Inc()
	}
}

// ReconcileFixed implements cell.Observer.
func (m *serviceMetrics) ReconcileFixed(fix string) { m.fixes.WithLabelValues(fix).Inc() }

// Descriptions of the cell's gauges.
var (
	containersDesc = prometheus.NewDesc("gavel_rep_containers", "Containers the cell holds, by state (reserved, starting, running, completing).", []string{"state"}, nil)
	memoryDesc     = prometheus.NewDesc("gavel_rep_capacity_memory_bytes", "Memory in bytes, by kind: total (the cell's capacity) or available (not held by a container).", []string{"kind"}, nil)
	diskDesc       = prometheus.NewDesc("gavel_rep_capacity_disk_bytes", "Disk in bytes, by kind: total or available.", []string{"kind"}, nil)
	slotsDesc      = prometheus.NewDesc("gavel_rep_capacity_containers", "Container slots, by kind: total or available.", []string{"kind"}, nil)
	evacuatingDesc = prometheus.NewDesc("gavel_rep_evacuating", "1 while the cell evacuates, else 0.", nil, nil)
)

// mib is n MiB (the unit of the cell's capacity, memory_mb and disk_mb) in bytes, the base unit
// Prometheus names want.
func mib(n int32) float64 { return float64(n) * (1 << 20) }

// cellCollector reads the cell's gauges at scrape time.
type cellCollector struct{ stats func() cell.Stats }

// Describe implements prometheus.Collector.
func (cellCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{containersDesc, memoryDesc, diskDesc, slotsDesc, evacuatingDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c cellCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(containersDesc, float64(s.Reserved), "reserved")
	gauge(containersDesc, float64(s.Starting), "starting")
	gauge(containersDesc, float64(s.Running), "running")
	gauge(containersDesc, float64(s.Completing), "completing")
	gauge(memoryDesc, mib(s.Total.GetMemoryMb()), "total")
	gauge(memoryDesc, mib(s.Available.GetMemoryMb()), "available")
	gauge(diskDesc, mib(s.Total.GetDiskMb()), "total")
	gauge(diskDesc, mib(s.Available.GetDiskMb()), "available")
	gauge(slotsDesc, float64(s.Total.GetContainers()), "total")
	gauge(slotsDesc, float64(s.Available.GetContainers()), "available")
	evac := 0.0
	if s.Evacuating {
		evac = 1
	}
	gauge(evacuatingDesc, evac)
}

// Descriptions of the per-container series, in the manner of cAdvisor's container_* series,
// labelled by process guid, index and instance guid (a task: its guid in task_guid), so their
// number is bounded by the cell's containers.
var (
	containerLabels   = []string{"process_guid", "index", "instance_guid", "task_guid"}
	containerCPUDesc  = prometheus.NewDesc("container_cpu_usage_seconds_total", "CPU time the container's processes have used (at the latest sample).", containerLabels, nil)
	containerMemDesc  = prometheus.NewDesc("container_memory_usage_bytes", "Memory the container uses (at the latest sample).", containerLabels, nil)
	containerMemLimit = prometheus.NewDesc("container_spec_memory_limit_bytes", "The container's memory quota (0: none).", containerLabels, nil)
	containerFsDesc   = prometheus.NewDesc("container_fs_usage_bytes", "Disk the container has written (at the latest sample).", containerLabels, nil)
	containerFsLimit  = prometheus.NewDesc("container_fs_limit_bytes", "The container's disk quota (0: none).", containerLabels, nil)
)

// watchContainers registers the per-container series, read from list at scrape time.
func (m *serviceMetrics) watchContainers(list func() []*repv1.ContainerMetrics) {
	m.registry.MustRegister(containerCollector{list: list})
}

// containerCollector reads every container's latest sample at scrape time; a container not
// sampled yet has only its limits.
type containerCollector struct {
	list func() []*repv1.ContainerMetrics
}

// Describe implements prometheus.Collector.
func (containerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{containerCPUDesc, containerMemDesc, containerMemLimit, containerFsDesc, containerFsLimit} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c containerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, cm := range c.list() {
		labels := []string{cm.GetProcessGuid(), strconv.Itoa(int(cm.GetIndex())), cm.GetInstanceGuid(), cm.GetTaskGuid()}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		gauge(containerMemLimit, float64(cm.GetMemoryLimitBytes()))
		gauge(containerFsLimit, float64(cm.GetDiskLimitBytes()))
		if cm.GetSampledAt() == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(containerCPUDesc, prometheus.CounterValue, cm.GetCpuSeconds(), labels...)
		gauge(containerMemDesc, float64(cm.GetMemoryBytes()))
		gauge(containerFsDesc, float64(cm.GetDiskBytes()))
	}
}

// watchDrains registers the log drains' counters, read at scrape time.
func (m *serviceMetrics) watchDrains(c *drain.Counters) {
	m.registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "rep", Name: "drain_lines_total",
			Help: "Container log lines written to a syslog drain's connection."}, func() float64 { return float64(c.Sent.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "gavel", Subsystem: "rep", Name: "drain_lines_dropped_total",
			Help: "Container log lines a syslog drain lost: its queue was full, or it was unreachable or failed."},
			func() float64 { return float64(c.Dropped.Load()) }),
	)
}
