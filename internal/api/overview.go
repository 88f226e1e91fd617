package api

import (
	"net/http"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// GET /overview (admin): the whole daemon at a glance for the console's
// host page — sandboxes by state, memory committed to running sandboxes
// against the host's, creates per minute over the last hour, egress
// decisions. /metrics has the same counts for Prometheus; this is the
// shape a browser draws without parsing the text format or keeping history.
func (s *Server) overviewRoutes(auth func(http.HandlerFunc) http.Handler) {
	s.mux.Handle("GET /overview", auth(s.adminOnly("read the daemon's overview", s.overview)))
}

// createsWindow is how many minutes of creates the overview keeps.
const createsWindow = 60

// createCounts counts successful creates (and forks) per wall-clock minute
// over the last createsWindow minutes, in a ring indexed by the minute.
type createCounts struct {
	mu sync.Mutex
	// minute[i] is the Unix minute counts[i] is of.
	minute [createsWindow]int64
	counts [createsWindow]int
}

func (c *createCounts) add(now time.Time, n int) {
	m := now.Unix() / 60
	c.mu.Lock()
	defer c.mu.Unlock()
	i := m % createsWindow
	if c.minute[i] != m {
		c.minute[i], c.counts[i] = m, 0
	}
	c.counts[i] += n
}

// last returns the counts of the createsWindow minutes up to now's, oldest
// first, and the Unix time of the first minute's start.
func (c *createCounts) last(now time.Time) (int64, []int) {
	m := now.Unix() / 60
	first := m - createsWindow + 1
	out := make([]int, createsWindow)
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range out {
		mk := first + int64(k)
		if i := mk % createsWindow; c.minute[i] == mk {
			out[k] = c.counts[i]
		}
	}
	return first * 60, out
}

type overviewResponse struct {
	Sandboxes map[string]int `json:"sandboxes"`
	Memory    struct {
		CommittedMB int64 `json:"committedMB"`
		UsedMB      int64 `json:"usedMB"`
		HostMB      int64 `json:"hostMB"`
		MaxMB       int64 `json:"maxMB"`
	} `json:"memory"`
	Creates struct {
		Start     int64 `json:"start"`
		PerMinute []int `json:"perMinute"`
	} `json:"creates"`
	Egress *struct {
		Allowed int64 `json:"allowed"`
		Blocked int64 `json:"blocked"`
	} `json:"egress"`
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	m := s.cfg.Manager
	var out overviewResponse
	out.Sandboxes = map[string]int{sandbox.StateRunning: 0, sandbox.StatePaused: 0}
	for _, sb := range m.List(tenant.System) { // the whole daemon: the admin's page
		in := sb.Info()
		out.Sandboxes[in.State]++
		if in.State != sandbox.StateRunning {
			continue
		}
		out.Memory.CommittedMB += in.Options.MemoryMB
		if mt, ok, err := m.LatestMetric(tenant.System, in.ID); err == nil && ok {
			out.Memory.UsedMB += mt.MemUsed >> 20
		}
	}
	out.Memory.HostMB = sandbox.HostMaxima("").MemoryMB
	out.Memory.MaxMB = m.Maxima().MemoryMB
	out.Creates.Start, out.Creates.PerMinute = s.creates.last(time.Now())
	if e := s.cfg.Egress; e != nil {
		out.Egress = &struct {
			Allowed int64 `json:"allowed"`
			Blocked int64 `json:"blocked"`
		}{e.Allowed.Load(), e.Blocked.Load()}
	}
	writeJSON(w, http.StatusOK, out)
}
