// Package quota is what an API key may hold and do: its limits (concurrent
// sandboxes, vCPUs, memory, create and request rates) and the token buckets
// that hold it to its rates. How many sandboxes a key holds is counted by
// the sandbox manager from the sandboxes that exist (sandbox/quota.go); the
// rates are the daemon's memory only (a restart refills every bucket).
package quota

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits are one key's quota; a zero field is unlimited.
type Limits struct {
	MaxSandboxes int   // running sandboxes at once (paused ones do not count)
	MaxVCPUs     int   // vCPUs of its running sandboxes together
	MaxMemoryMB  int64 // memory of its running sandboxes together
	CreateRate   Rate  // sandboxes made (create, fork, restore)
	RequestRate  Rate  // API requests of any kind
}

// Rate is N events per period: a token bucket that holds N tokens and
// refills N per period (so N may come at once, then N per period). The zero
// Rate is unlimited.
type Rate struct {
	N   int
	Per time.Duration
}

// Unlimited reports the zero Rate.
func (r Rate) Unlimited() bool { return r.N == 0 }

var units = map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}

// ParseRate reads "N/s", "N/m", "N/h", "N/d" or "N/<Go duration>" ("5/10s");
// "" and "0" are unlimited.
func ParseRate(s string) (Rate, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return Rate{}, nil
	}
	num, per, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: want N/s, N/m, N/h or N/d (e.g. 60/m)", s)
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > 1_000_000 {
		return Rate{}, fmt.Errorf("rate %q: N must be an integer from 1 to 1000000", s)
	}
	d, ok := units[per]
	if !ok {
		if d, err = time.ParseDuration(per); err != nil {
			return Rate{}, fmt.Errorf("rate %q: the period must be s, m, h, d or a duration like 10s", s)
		}
	}
	if d < time.Second || d > 7*24*time.Hour {
		return Rate{}, fmt.Errorf("rate %q: the period must be from 1s to 7d", s)
	}
	return Rate{N: n, Per: d}, nil
}

// String is the rate as ParseRate reads it ("" when unlimited).
func (r Rate) String() string {
	if r.Unlimited() {
		return ""
	}
	for _, u := range []string{"d", "h", "m", "s"} {
		if r.Per == units[u] {
			return fmt.Sprintf("%d/%s", r.N, u)
		}
	}
	return fmt.Sprintf("%d/%s", r.N, r.Per)
}

func (r Rate) limit() rate.Limit { return rate.Limit(float64(r.N) / r.Per.Seconds()) }

// Buckets are token buckets, one per key and kind, made on first use and
// re-made when the key's rate changes.
type Buckets struct {
	mu sync.Mutex
	m  map[string]*bucket
}

type bucket struct {
	rate Rate
	lim  *rate.Limiter
}

// Take takes n tokens from the bucket of id at r, at once or not at all:
// ok, or how long until they would be there. n above r.N can never be
// taken (retry is then 0).
func (b *Buckets) Take(id string, r Rate, n int) (ok bool, retry time.Duration) {
	if r.Unlimited() {
		return true, 0
	}
	if n > r.N {
		return false, 0
	}
	b.mu.Lock()
	if b.m == nil {
		b.m = map[string]*bucket{}
	}
	bk := b.m[id]
	if bk == nil || bk.rate != r {
		bk = &bucket{rate: r, lim: rate.NewLimiter(r.limit(), r.N)}
		b.m[id] = bk
	}
	b.mu.Unlock()
	now := time.Now()
	res := bk.lim.ReserveN(now, n)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now) // a refused request takes nothing
		return false, d
	}
	return true, 0
}

// RetryAfter is d in whole seconds, rounded up, at least 1: the value of a
// Retry-After header that never sends a client back too early.
func RetryAfter(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// Usage is what a key holds against its concurrency limits: sandboxes,
// and their vCPUs and memory together.
type Usage struct {
	Sandboxes int
	CPUs      float64
	MemoryMB  int64
}

// Plus is u and o together.
func (u Usage) Plus(o Usage) Usage {
	return Usage{Sandboxes: u.Sandboxes + o.Sandboxes, CPUs: u.CPUs + o.CPUs, MemoryMB: u.MemoryMB + o.MemoryMB}
}

// Concurrent reports whether l limits what a key holds at once (not only
// its rates).
func (l Limits) Concurrent() bool { return l.MaxSandboxes > 0 || l.MaxVCPUs > 0 || l.MaxMemoryMB > 0 }
