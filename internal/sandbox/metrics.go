package sandbox

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/tenant"
)

// Resource metrics: the manager samples every running sandbox's resource
// use as its runtime accounts it (Runtime.Stats: its cgroups) and its
// writable layer each Config.MetricsInterval and keeps the last
// MetricsRetention of samples in memory (E2B's getMetrics series). Paused
// sandboxes are not sampled; their earlier samples stay readable.

const (
	// DefaultMetricsInterval is how often running sandboxes are sampled.
	DefaultMetricsInterval = 5 * time.Second
	// MetricsRetention is how much history a sandbox keeps.
	MetricsRetention = time.Hour
)

// Metric is one sample of a sandbox's resource use.
type Metric struct {
	At       time.Time
	CPUCount int
	// CPUUsedPct is the CPU the sandbox used since the previous sample, as
	// a percentage of its CPU quota.
	CPUUsedPct float64
	// MemUsed excludes reclaimable file cache (MemCache); MemTotal is the
	// sandbox's memory ceiling.
	MemUsed, MemTotal, MemCache int64
	// DiskUsed and DiskTotal are the writable layer's use and size.
	DiskUsed, DiskTotal int64
}

// sample is what a sandbox stores per sample; the constant parts of a
// Metric come from its options when read.
type sample struct {
	unixMilli          int64
	cpuPct             float32
	memUsed, memCache  int64
	diskUsed, diskSize int64
}

// metricsRing holds a sandbox's samples, oldest overwritten first.
type metricsRing struct {
	mu      sync.Mutex
	samples []sample // ring of up to cap entries
	next    int      // where the next sample goes once the ring is full
	lastCPU time.Duration
	lastAt  time.Time
}

func (r *metricsRing) add(s sample, limit int) {
	if len(r.samples) < limit {
		r.samples = append(r.samples, s)
		return
	}
	r.samples[r.next] = s
	r.next = (r.next + 1) % len(r.samples)
}

// newest returns the newest sample; false when there is none yet.
func (r *metricsRing) newest() (sample, bool) {
	if len(r.samples) == 0 {
		return sample{}, false
	}
	i := r.next - 1
	if i < 0 {
		i = len(r.samples) - 1
	}
	return r.samples[i], true
}

// ordered returns the samples oldest first.
func (r *metricsRing) ordered() []sample {
	out := make([]sample, 0, len(r.samples))
	out = append(out, r.samples[r.next:]...)
	return append(out, r.samples[:r.next]...)
}

func (m *Manager) metricsLimit() int {
	return max(1, int(MetricsRetention/m.cfg.MetricsInterval))
}

// sampleMetrics samples every running sandbox each interval until the
// manager closes.
func (m *Manager) sampleMetrics() {
	defer close(m.samplerDone)
	t := time.NewTicker(m.cfg.MetricsInterval)
	defer t.Stop()
	for {
		select {
		case <-m.reaperStop:
			return
		case now := <-t.C:
			for _, sb := range m.List(tenant.System) {
				// One just sampled on request is left to the next tick:
				// CPU % over a few milliseconds would only be noise.
				if now.Sub(sb.lastSampled()) >= m.cfg.MetricsInterval/2 {
					m.sample(sb, now)
				}
			}
		}
	}
}

// sample records one sample of sb if it is running; false if it is not, if
// its runtime cannot account for it (it is being stopped), or if this is its first
// reading: that one is only the baseline CPU % is measured from (CPU used
// since the start would count the boot, or a pooled sandbox's whole wait).
func (m *Manager) sample(sb *Sandbox, now time.Time) bool {
	// Held from the state check to the append: a pause waits for a sample
	// in flight (metricsBarrier), and samples are kept in time order.
	r := &sb.metrics
	r.mu.Lock()
	defer r.mu.Unlock()
	if !now.After(r.lastAt) {
		return false // a newer one was taken meanwhile
	}
	sb.mu.Lock()
	running, layer := sb.state == StateRunning, sb.layer
	sb.mu.Unlock()
	if !running {
		return false
	}
	u, err := m.cfg.Runtime.Stats(context.Background(), sb.ID)
	if err != nil {
		m.log.Debug("sample sandbox metrics", "id", sb.ID, "err", err)
		return false
	}
	if r.lastAt.IsZero() {
		r.lastCPU, r.lastAt = u.CPU, now
		return false
	}
	s := sample{unixMilli: now.UnixMilli(), memUsed: u.Memory - u.FileCache, memCache: u.FileCache}
	if layer != nil {
		if used, size, err := layer.Usage(); err == nil {
			s.diskUsed, s.diskSize = used, size
		}
	}
	// CPU since the previous reading; after a restore (a new cgroup, its
	// counter from zero), since the previous reading with nothing before.
	base := r.lastCPU
	if u.CPU < base {
		base = 0
	}
	if wall := now.Sub(r.lastAt); wall > time.Millisecond {
		pct := 100 * float64(u.CPU-base) / float64(wall) / sb.Options.CPUs
		s.cpuPct = float32(min(100, max(0, pct)))
	}
	r.lastCPU, r.lastAt = u.CPU, now
	r.add(s, m.metricsLimit())
	return true
}

// firstSampleWait is how long a request for the present waits between the
// baseline and the first sample of a sandbox not sampled yet.
const firstSampleWait = 250 * time.Millisecond

// Metrics returns the samples of sandbox id taken between start and end
// (inclusive; zero times leave that side open), oldest first. With fresh
// set and the sandbox running, a sample is taken now unless the newest
// is under a second old, so that a caller sees the present.
func (m *Manager) Metrics(p tenant.Principal, id string, start, end time.Time, fresh bool) ([]Metric, error) {
	sb, err := m.Lookup(p, id)
	if err != nil {
		return nil, err
	}
	if fresh {
		m.sampleNow(sb)
	}
	sb.metrics.mu.Lock()
	samples := sb.metrics.ordered()
	sb.metrics.mu.Unlock()
	out := []Metric{}
	for _, s := range samples {
		at := time.UnixMilli(s.unixMilli).UTC()
		if (!start.IsZero() && at.Before(start)) || (!end.IsZero() && at.After(end)) {
			continue
		}
		out = append(out, sb.metric(s))
	}
	return out, nil
}

// sampleNow takes a sample of the present unless the newest is under a
// second old; a sandbox without a baseline reading gets one first.
func (m *Manager) sampleNow(sb *Sandbox) {
	sb.metrics.mu.Lock()
	newest, ok := sb.metrics.newest()
	lastAt := sb.metrics.lastAt
	sb.metrics.mu.Unlock()
	if ok && time.Since(time.UnixMilli(newest.unixMilli)) < time.Second {
		return
	}
	if lastAt.IsZero() {
		m.sample(sb, time.Now()) // the baseline, if it runs
		if lastAt = sb.lastSampled(); lastAt.IsZero() {
			return
		}
	}
	if wait := firstSampleWait - time.Since(lastAt); wait > 0 {
		time.Sleep(wait)
	}
	m.sample(sb, time.Now())
}

// LatestMetric returns the newest sample of sandbox id, taking one now if
// the newest is over a second old and it runs; ok is false when it has none.
func (m *Manager) LatestMetric(p tenant.Principal, id string) (mt Metric, ok bool, err error) {
	sb, err := m.Lookup(p, id)
	if err != nil {
		return Metric{}, false, err
	}
	m.sampleNow(sb)
	sb.metrics.mu.Lock()
	s, ok := sb.metrics.newest()
	sb.metrics.mu.Unlock()
	if !ok {
		return Metric{}, false, nil
	}
	return sb.metric(s), true, nil
}

// metricsBarrier returns once no sample of sb is being taken: after a
// state change away from running, none is added any more.
func (sb *Sandbox) metricsBarrier() {
	sb.metrics.mu.Lock()
	sb.metrics.mu.Unlock() //nolint:staticcheck // an empty critical section is the point
}

func (sb *Sandbox) lastSampled() time.Time {
	sb.metrics.mu.Lock()
	defer sb.metrics.mu.Unlock()
	return sb.metrics.lastAt
}

func (sb *Sandbox) metric(s sample) Metric {
	return Metric{
		At:         time.UnixMilli(s.unixMilli).UTC(),
		CPUCount:   int(math.Ceil(sb.Options.CPUs)),
		CPUUsedPct: math.Round(float64(s.cpuPct)*100) / 100,
		MemUsed:    s.memUsed,
		MemTotal:   sb.Options.MemoryMB << 20,
		MemCache:   s.memCache,
		DiskUsed:   s.diskUsed,
		DiskTotal:  s.diskSize,
	}
}
