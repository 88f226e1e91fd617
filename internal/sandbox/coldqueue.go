package sandbox

import (
	"context"
	"fmt"
	goruntime "runtime"

	"golang.org/x/sync/semaphore"
)

// coldQueue admits the cold starts of creates (a runtime boot each: runsc
// run or crun run, the agent's start) a few at a time, first come first
// served. A burst beyond the warm pool then queues instead of starting
// every runtime at once: on a small host fifty runsc boots side by side
// each take fifty times as long, so none answers before all of them do,
// while in turns the first creates answer at once and the pool's refills
// get a word in. Waiting creates still count as creates in progress
// (poolSet.creating), so refills stay back while any waits.
type coldQueue struct {
	sem *semaphore.Weighted // FIFO: waiters are served in order
	n   int64
}

// coldStartSlots is how many cold starts run at once: four per core. A
// boot waits on I/O and on the agent, not only on the CPU: with one per
// core, a burst of 50 cold creates under the namespaces runtime made 18-19
// creates/s beside 24-25 with no bound at all (same run, 2 cores, loaded);
// four per core keeps that throughput and still stops a stampede of
// hundreds.
func coldStartSlots() int64 { return int64(4 * goruntime.NumCPU()) }

// fillWorkers is how many refills run at once: one per core.
func fillWorkers() int { return max(2, goruntime.NumCPU()) }

func newColdQueue(n int64) *coldQueue {
	return &coldQueue{sem: semaphore.NewWeighted(n), n: n}
}

// wait blocks until this create's turn (or ctx ends); release ends the
// turn.
func (q *coldQueue) wait(ctx context.Context) (release func(), err error) {
	if err := q.sem.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("create waited for one of the %d cold start slots and gave up: %w", q.n, err)
	}
	return func() { q.sem.Release(1) }, nil
}
