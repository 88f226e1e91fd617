package agent

import (
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// TestNextSample: the watchdog waits as long as the memory left under the
// limit takes to use up at maxAllocRate, within its bounds, and samples at
// the shortest interval when the charge is unknown, at or over the limit,
// or half the pids are in use.
func TestNextSample(t *testing.T) {
	const mib = 1 << 20
	mem512 := agentapi.Limits{CPUs: 1, MemoryBytes: 512 * mib, Pids: 256}
	for _, c := range []struct {
		name       string
		rt         string
		limits     agentapi.Limits
		mem, count int64
		want       time.Duration
	}{
		{"gVisor, idle under 512 MiB: the rest used up at 2 GiB/s", "gvisor", mem512, 0, 3, 250 * time.Millisecond},
		{"half the memory used", "gvisor", mem512, 256 * mib, 3, 125 * time.Millisecond},
		{"two CPUs allocate twice as fast", "gvisor", agentapi.Limits{CPUs: 1.5, MemoryBytes: 512 * mib}, 0, 3, 125 * time.Millisecond},
		{"namespaces: native faults, 8 GiB/s a CPU", "namespaces", agentapi.Limits{CPUs: 1, MemoryBytes: 2048 * mib}, 0, 3, 250 * time.Millisecond},
		{"a large limit waits at most the longest interval", "gvisor", agentapi.Limits{MemoryBytes: 64 << 30, Pids: 256}, 0, 3, maxSampleInterval},
		{"no memory limit: the longest", "gvisor", agentapi.Limits{Pids: 256}, 900 * mib, 3, maxSampleInterval},
		{"near the limit: the shortest", "gvisor", mem512, 510 * mib, 3, minSampleInterval},
		{"over the limit: the shortest", "gvisor", mem512, 600 * mib, 3, minSampleInterval},
		{"charge unknown: the shortest", "gvisor", mem512, -1, 3, minSampleInterval},
		{"half the pids in use: the shortest", "gvisor", mem512, 0, 128, minSampleInterval},
		{"fewer than half the pids: by memory", "gvisor", mem512, 0, 127, 250 * time.Millisecond},
	} {
		if got := nextSample(c.rt, c.limits, c.mem, c.count); got != c.want {
			t.Errorf("%s: nextSample(%s, %+v, %d, %d) = %v, want %v", c.name, c.rt, c.limits, c.mem, c.count, got, c.want)
		}
	}
}
