// Package metrics holds one daemon's Prometheus instruments: the latency
// histograms of sandbox lifecycle operations, the counters of sandbox deaths
// and API errors, and the registry /metrics serves them from. It is a leaf
// (only client_golang below it), so every package that observes something —
// the sandbox manager, the API, the traffic proxy, template builds — can take
// a *Metrics without knowing the others. A nil *Metrics observes nothing.
//
// Each daemon has a registry of its own (New): two daemons in one process
// (tests) never share a series.
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Create kinds: how a sandbox was made.
const (
	CreateCold     = "cold"     // booted on its template
	CreatePooled   = "pooled"   // handed out by a warm pool
	CreateSnapshot = "snapshot" // restored from a snapshot (templateID = a snapshot)
)

// Death causes: why a sandbox that was running (or paused) ended.
const (
	DeathOOM     = "oom"     // its host memory ceiling OOM-killed it
	DeathPids    = "pids"    // its host process ceiling refused a fork and it died
	DeathTimeout = "timeout" // its TTL (or an auto-delete policy) ran out
	DeathCrash   = "crash"   // its container exited for another reason
	DeathKilled  = "killed"  // an API call (or the CLI) killed it
)

// DeathCauses are every cause, in the order the dashboard shows them.
var DeathCauses = []string{DeathOOM, DeathPids, DeathTimeout, DeathCrash, DeathKilled}

// QuotaLimits are the limits a key's quota has (the API's field names).
var QuotaLimits = []string{"maxSandboxes", "maxVcpus", "maxMemoryMB", "createRate", "requestRate"}

// Metric names, as /metrics shows them and deploy/grafana/cella.json queries
// them.
const (
	NameCreate    = "cella_sandbox_create_duration_seconds"
	NameExecStart = "cella_exec_start_duration_seconds"
	NamePause     = "cella_sandbox_pause_duration_seconds"
	NameResume    = "cella_sandbox_resume_duration_seconds"
	NameSnapshot  = "cella_sandbox_snapshot_duration_seconds"
	NameFork      = "cella_sandbox_fork_duration_seconds"
	NameBuild     = "cella_template_build_duration_seconds"
	NameDeaths    = "cella_sandbox_deaths_total"
	NameAPIErrors = "cella_api_errors_total"
	NameQuota     = "cella_quota_rejections_total"
)

// lifecycleBuckets span a warm-pool hand-out (a few ms) to a slow restore
// under load (a minute).
var lifecycleBuckets = prometheus.ExponentialBuckets(0.002, 2, 16) // 2 ms .. 65 s

// buildBuckets span a cached build (a second) to a large image (an hour).
var buildBuckets = prometheus.ExponentialBuckets(1, 2, 13) // 1 s .. 68 min

// Metrics are one daemon's instruments.
type Metrics struct {
	// Registry is what /metrics serves; the API adds its own collectors
	// (sandbox counts, pools, egress, Go and process metrics) to it.
	Registry *prometheus.Registry

	runtime                                          string
	create                                           *prometheus.HistogramVec
	execStart, pause, resume, snapshot, fork, builds *prometheus.HistogramVec
	deaths                                           *prometheus.CounterVec
	apiErrors                                        *prometheus.CounterVec
	quota                                            *prometheus.CounterVec
}

// New makes the instruments of a daemon on runtime, registered in a registry
// of their own. The series of templates (the templates that exist at start)
// and every death cause start at zero, so that a dashboard shows 0 rather
// than no data and rate() sees the first event.
func New(runtime string, templates []string) *Metrics {
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	m := &Metrics{
		Registry:  prometheus.NewRegistry(),
		runtime:   runtime,
		create:    hist(NameCreate, "Time from a create request to the sandbox's agent answering (successful creates), by kind (cold, pooled, snapshot).", lifecycleBuckets, "kind", "runtime", "template"),
		execStart: hist(NameExecStart, "Time from a process Start request reaching the daemon to its start event leaving it.", lifecycleBuckets, "runtime", "template"),
		pause:     hist(NamePause, "Time a successful pause took.", lifecycleBuckets, "runtime", "template"),
		resume:    hist(NameResume, "Time a successful resume took, until the agent answers.", lifecycleBuckets, "runtime", "template"),
		snapshot:  hist(NameSnapshot, "Time a successful snapshot of a running sandbox took.", lifecycleBuckets, "runtime", "template"),
		fork:      hist(NameFork, "Time a fork request took, all its forks included.", lifecycleBuckets, "runtime", "template"),
		builds:    hist(NameBuild, "Time a successful template build took.", buildBuckets, "runtime", "template"),
		deaths: prometheus.NewCounterVec(prometheus.CounterOpts{Name: NameDeaths,
			Help: "Sandboxes that ended, by cause (oom, pids, timeout, crash, killed)."}, []string{"cause", "runtime"}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: NameAPIErrors,
			Help: "API answers with a status of 400 or more, by route pattern and status."}, []string{"route", "status"}),
		quota: prometheus.NewCounterVec(prometheus.CounterOpts{Name: NameQuota,
			Help: "Requests refused by an API key's quota (429), by limit."}, []string{"limit"}),
	}
	m.Registry.MustRegister(m.create, m.execStart, m.pause, m.resume, m.snapshot, m.fork, m.builds, m.deaths, m.apiErrors, m.quota)
	for _, t := range templates {
		for _, kind := range []string{CreateCold, CreatePooled, CreateSnapshot} {
			m.create.WithLabelValues(kind, runtime, t)
		}
		for _, h := range []*prometheus.HistogramVec{m.execStart, m.pause, m.resume, m.snapshot, m.fork, m.builds} {
			h.WithLabelValues(runtime, t)
		}
	}
	for _, c := range DeathCauses {
		m.deaths.WithLabelValues(c, runtime)
	}
	for _, l := range QuotaLimits {
		m.quota.WithLabelValues(l)
	}
	return m
}

// Create records a successful create of kind on template.
func (m *Metrics) Create(kind, template string, d time.Duration) {
	if m != nil {
		m.create.WithLabelValues(kind, m.runtime, template).Observe(d.Seconds())
	}
}

// ExecStart records how long a process took to start.
func (m *Metrics) ExecStart(template string, d time.Duration) {
	m.observe(func() *prometheus.HistogramVec { return m.execStart }, template, d)
}

// Pause, Resume, Snapshot and Fork record a successful operation.
func (m *Metrics) Pause(template string, d time.Duration) {
	m.observe(func() *prometheus.HistogramVec { return m.pause }, template, d)
}
func (m *Metrics) Resume(template string, d time.Duration) {
	m.observe(func() *prometheus.HistogramVec { return m.resume }, template, d)
}
func (m *Metrics) Snapshot(template string, d time.Duration) {
	m.observe(func() *prometheus.HistogramVec { return m.snapshot }, template, d)
}
func (m *Metrics) Fork(template string, d time.Duration) {
	m.observe(func() *prometheus.HistogramVec { return m.fork }, template, d)
}

// TemplateBuild records a successful build of template. Template builds
// (internal/build) report here: the daemon wraps its build.Builder so that
// every successful Build observes its Spec.Name.
func (m *Metrics) TemplateBuild(template string, d time.Duration) {
	m.observe(func() *prometheus.HistogramVec { return m.builds }, template, d)
}

// observe records d on the histogram h picks, unless m is nil.
func (m *Metrics) observe(h func() *prometheus.HistogramVec, template string, d time.Duration) {
	if m != nil {
		h().WithLabelValues(m.runtime, template).Observe(d.Seconds())
	}
}

// Death counts a sandbox that ended of cause.
func (m *Metrics) Death(cause string) {
	if m != nil {
		m.deaths.WithLabelValues(cause, m.runtime).Inc()
	}
}

// APIError counts an API answer of status (>= 400) on route, a pattern of
// the API's mux ("POST /sandboxes/{id}/pause"), never a raw path.
func (m *Metrics) APIError(route string, status int) {
	if m != nil {
		m.apiErrors.WithLabelValues(route, strconv.Itoa(status)).Inc()
	}
}

// QuotaRejection counts a request refused by limit (maxSandboxes,
// maxVcpus, maxMemoryMB, createRate, requestRate).
func (m *Metrics) QuotaRejection(limit string) {
	if m != nil {
		m.quota.WithLabelValues(limit).Inc()
	}
}
