package sandbox

import (
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// How a warm pool adapts to its template's demand: the creates it could
// serve (its limits, no volumes) are counted as they arrive, and the pool
// is grown toward the most that arrived within one second over the last
// minute (a burst of fifty finds fifty ready the next time), within the
// daemon's pool memory budget and MaxPoolSize. Once a minute passes
// without such a peak the pool falls back to its set size, and the filler
// destroys what is above it. The set size (--pool, PUT /pools) is the
// floor: an operator's setting is always kept.
const (
	// demandWindow is how long a create counts toward the peak.
	demandWindow = time.Minute
	// demandBurst is the span whose arrivals make one peak.
	demandBurst = time.Second
	// demandKeep bounds the arrivals a pool remembers.
	demandKeep = 4 * MaxPoolSize
	// defaultPooledMemory is what a pooled sandbox is taken to cost until
	// one of the pool's is measured (an idle gVisor sandbox: ~25 MB).
	defaultPooledMemory = 64 << 20
)

// demandMeter is the arrivals of a pool's creates within demandWindow.
type demandMeter struct {
	arrivals []time.Time // oldest first
}

func (d *demandMeter) add(now time.Time) {
	d.expire(now)
	if len(d.arrivals) >= demandKeep {
		d.arrivals = d.arrivals[1:]
	}
	d.arrivals = append(d.arrivals, now)
}

func (d *demandMeter) expire(now time.Time) {
	i := sort.Search(len(d.arrivals), func(i int) bool { return now.Sub(d.arrivals[i]) < demandWindow })
	d.arrivals = d.arrivals[i:]
}

// peak is the most arrivals within one demandBurst in the window.
func (d *demandMeter) peak(now time.Time) int {
	d.expire(now)
	best, lo := 0, 0
	for hi, t := range d.arrivals {
		for t.Sub(d.arrivals[lo]) >= demandBurst {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// target is how many sandboxes p should hold now: its set size, grown
// toward the recent peak while spare is the memory the budget has left for
// the pool's growth (ps.mu held).
func (p *pool) target(now time.Time, spare int64) int {
	t := p.size
	if p.size == 0 {
		return 0
	}
	if peak := min(p.demand.peak(now), MaxPoolSize); peak > t {
		each := p.memEach
		if each <= 0 {
			each = defaultPooledMemory
		}
		held := len(p.ready) + p.filling
		// Beyond what it holds, the pool may grow by what the budget has
		// room for.
		room := held + int(max(spare, 0)/each)
		t = max(t, min(peak, room))
	}
	return t
}

// spareLocked is what the pool memory budget has left (ps.mu held): the
// budget less what every pool's sandboxes beyond their set size hold.
func (ps *poolSet) spareLocked() int64 {
	spare := ps.budget
	for _, p := range ps.byTpl {
		each := p.memEach
		if each <= 0 {
			each = defaultPooledMemory
		}
		if extra := len(p.ready) + p.filling - p.size; extra > 0 {
			spare -= int64(extra) * each
		}
	}
	return spare
}

// DefaultPoolMemoryBudget is the pool memory budget when none is set: a
// quarter of the host's RAM.
func DefaultPoolMemoryBudget() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 1 << 30
	}
	return int64(si.Totalram) * int64(si.Unit) / 4
}
