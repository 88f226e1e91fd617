package api

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// EgressCounters counts egress decisions for /metrics; the daemon's event
// sink increments it.
type EgressCounters struct {
	Allowed, Blocked atomic.Int64
}

// metricsCollector reads the manager's state at scrape time, so nothing is
// kept twice and a scrape always sees the present.
type metricsCollector struct {
	s *Server

	sandboxes, poolSize, poolReady, poolFilling, poolHanded, poolMisses, egress *prometheus.Desc
}

func newMetricsCollector(s *Server) *metricsCollector {
	return &metricsCollector{
		s:           s,
		sandboxes:   prometheus.NewDesc("cella_sandboxes", "Sandboxes known to the daemon, by state.", []string{"state"}, nil),
		poolSize:    prometheus.NewDesc("cella_pool_size", "Target size of a template's warm pool.", []string{"template"}, nil),
		poolReady:   prometheus.NewDesc("cella_pool_ready", "Warm sandboxes ready to hand out.", []string{"template"}, nil),
		poolFilling: prometheus.NewDesc("cella_pool_filling", "Warm sandboxes being made.", []string{"template"}, nil),
		poolHanded:  prometheus.NewDesc("cella_pool_handed_out_total", "Creates served from the warm pool since start.", []string{"template"}, nil),
		poolMisses:  prometheus.NewDesc("cella_pool_misses_total", "Creates of a pooled template that went cold since start.", []string{"template"}, nil),
		egress:      prometheus.NewDesc("cella_egress_decisions_total", "Egress proxy decisions since start.", []string{"decision"}, nil),
	}
}

func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sandboxes, c.poolSize, c.poolReady, c.poolFilling, c.poolHanded, c.poolMisses, c.egress} {
		ch <- d
	}
}

func (c *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.s.cfg.Manager
	counts := map[string]int{sandbox.StateRunning: 0, sandbox.StatePaused: 0}
	for _, sb := range m.List(tenant.System) { // the whole daemon: /metrics is the admin's
		counts[sb.State()]++
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(n), state)
	}
	for _, p := range c.s.cfg.Pools.Pools() {
		ch <- prometheus.MustNewConstMetric(c.poolSize, prometheus.GaugeValue, float64(p.Size), p.Template)
		ch <- prometheus.MustNewConstMetric(c.poolReady, prometheus.GaugeValue, float64(p.Ready), p.Template)
		ch <- prometheus.MustNewConstMetric(c.poolFilling, prometheus.GaugeValue, float64(p.Filling), p.Template)
		ch <- prometheus.MustNewConstMetric(c.poolHanded, prometheus.CounterValue, float64(p.HandedOut), p.Template)
		ch <- prometheus.MustNewConstMetric(c.poolMisses, prometheus.CounterValue, float64(p.Misses), p.Template)
	}
	if e := c.s.cfg.Egress; e != nil {
		ch <- prometheus.MustNewConstMetric(c.egress, prometheus.CounterValue, float64(e.Allowed.Load()), "allowed")
		ch <- prometheus.MustNewConstMetric(c.egress, prometheus.CounterValue, float64(e.Blocked.Load()), "blocked")
	}
}

// metricsHandler serves /metrics in Prometheus' text format (scrape with
// the API key as a bearer token).
// The registry is the daemon's (metrics.Metrics: lifecycle histograms,
// deaths, API errors, quota refusals), with the API's collectors added.
func (s *Server) metricsHandler() http.Handler {
	mx := s.cfg.Metrics
	mx.Registry.MustRegister(newMetricsCollector(s), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(mx.Registry, promhttp.HandlerOpts{})
}
