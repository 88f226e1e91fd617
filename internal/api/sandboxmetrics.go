package api

import (
	"net/http"
	"strings"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// toSandboxMetric is E2B's SandboxMetric (timestamp is deprecated in E2B's
// spec and read by its SDKs).
func toSandboxMetric(m sandbox.Metric) apiwire.SandboxMetric {
	return apiwire.SandboxMetric{
		Timestamp: m.At, TimestampUnix: m.At.Unix(), CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
	}
}

// maxMetricsIDs bounds GET /sandboxes/metrics?sandbox_ids=.
const maxMetricsIDs = 100

// sandboxMetrics serves GET /sandboxes/{id}/metrics?start=&end= (unix
// seconds, both optional): the samples in that window, oldest first. Without
// end the answer includes a sample of the present.
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	start, end, err := parseMetricsWindow(r.URL.Query()) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	ms, err := s.cfg.Manager.Metrics(caller(r), r.PathValue("id"), start, end, end.IsZero())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]apiwire.SandboxMetric, len(ms))
	for i, m := range ms {
		out[i] = toSandboxMetric(m)
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxesMetrics serves GET /sandboxes/metrics?sandbox_ids=a,b: the
// newest sample of each named sandbox that exists and has one.
func (s *Server) sandboxesMetrics(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query().Get("sandbox_ids")
	if raw == "" {
		s.writeErr(w, r, errdefs.InvalidArgument("sandbox_ids is required: a comma-separated list of sandbox IDs"))
		return
	}
	ids := strings.Split(raw, ",")
	if len(ids) > maxMetricsIDs {
		s.writeErr(w, r, errdefs.InvalidArgument("sandbox_ids names %d sandboxes; at most %d per request", len(ids), maxMetricsIDs))
		return
	}
	out := apiwire.SandboxesWithMetrics{Sandboxes: map[string]apiwire.SandboxMetric{}}
	for _, id := range ids {
		m, ok, err := s.cfg.Manager.LatestMetric(caller(r), strings.TrimSpace(id))
		if err != nil || !ok {
			continue // unknown or not yet sampled: left out, as E2B does
		}
		out.Sandboxes[strings.TrimSpace(id)] = toSandboxMetric(m)
	}
	writeJSON(w, http.StatusOK, out)
}
