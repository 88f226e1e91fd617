package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
)

// poolBenchSize is the warm pool of the pooled create figure.
const poolBenchSize = 2

// poolCreateCall keeps, per runtime, the create calls of the last pooled
// run timed alone (the API's answer, before any exec).
var poolCreateCall = map[string]Figure{}

// poolExecs keeps, per runtime, the first and second exec in the
// sandboxes of the last pooled run.
var poolExecs = map[string][]Figure{}

// apiCreatePooled times create + exec of true on a daemon with a warm pool
// of base, waiting for the pool to be full again before each create: the
// latency of a pool that keeps up with the create rate.
func apiCreatePooled(ctx context.Context, cfg Config, rt string) (Figure, error) {
	name := "cella create → first exec done (warm pool)"
	fig := Figure{Name: name, Runtime: rt}
	l, err := startLocal(ctx, cfg, rt)
	if err != nil {
		return fig, err
	}
	defer l.Close()
	c := l.Client
	if _, err := c.SetPool(ctx, "base", poolBenchSize); err != nil {
		return fig, err
	}
	waitFull := func() error {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ps, err := c.ListPools(ctx)
			if err != nil {
				return err
			}
			for _, p := range ps {
				// At least the set size: the pool adapts, and grows past
				// it toward the recent peak of these very creates (a pool
				// of 3 for a set size of 2 is full, not short).
				if p.Template == "base" && p.Ready >= poolBenchSize && p.Filling == 0 {
					return nil
				}
				if p.Template == "base" && p.LastError != "" && time.Now().After(deadline) {
					return fmt.Errorf("warm pool: %s", p.LastError)
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("warm pool did not fill within 2 minutes: %+v", ps)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var lastErr error
	var ds, createOnly, first, second []time.Duration
	defer func() {
		poolCreateCall[rt] = summarize("cella create call alone (warm pool)", rt, createOnly)
		// The first exec in a handed-out sandbox against its second: what
		// the pool's warm-up leaves cold.
		f, s := summarize("first exec after a pool hand-out", rt, first), summarize("second exec in the same sandbox", rt, second)
		f.against(s)
		// Beside them, the floor their ratio is judged by.
		next, firstSpawn, err := l.poolSpawnFloors(ctx, rt, cfg.N, waitFull)
		if err != nil {
			firstSpawn.Name, firstSpawn.Runtime, firstSpawn.Err = firstSpawnName, rt, err.Error()
			poolExecs[rt] = []Figure{firstSpawn, s, f}
			return
		}
		f.alsoAgainst(next)
		s.alsoAgainst(next)
		f.alsoAgainst(firstSpawn)
		poolExecs[rt] = []Figure{next, firstSpawn, s, f}
	}()
	for i := 0; i < cfg.N; i++ {
		if err := waitFull(); err != nil {
			return summarize(name, rt, ds), err
		}
		t, err := createExecs(ctx, c, client.CreateRequest{}, 2)
		if err != nil {
			lastErr = err
			continue
		}
		createOnly = append(createOnly, t.create)
		ds = append(ds, t.total)
		first, second = append(first, t.execs[0]), append(second, t.execs[1])
	}
	f := summarize(name, rt, ds)
	if ps, err := c.ListPools(ctx); err == nil && len(ps) == 1 {
		f.Extra = fmt.Sprintf("pool of %d, refilled between creates; %d handed out, %d cold", poolBenchSize, ps[0].HandedOut, ps[0].Misses)
	}
	if len(ds) == 0 {
		return f, lastErr
	}
	return f, nil
}

// poolSpawnFloors times the agent's own spawns of the exec shape in n
// sandboxes handed out as the exec figures' were (the pool full again
// before each create): each one's first spawn, and the one after it, which
// is the in-sandbox spawn floor. The first is the floor the first exec
// after a hand-out is judged by: a sandbox that waited in the pool wakes
// from idle for it, and so does the machine — the same spawn right after
// another costs less whatever cella does (on this machine kind a host's own
// `bash -c true` after 100 ms idle took 1.7-1.9× one right after another,
// after 1 s 3.0-3.7×).
func (l *local) poolSpawnFloors(ctx context.Context, rt string, n int, waitFull func() error) (next, first Figure, err error) {
	var firsts, nexts []time.Duration
	for range n {
		if err := waitFull(); err != nil {
			return next, first, err
		}
		sb, err := l.Client.Create(ctx, client.CreateRequest{})
		if err != nil {
			return next, first, err
		}
		floor, _, err := l.spawnFloors(ctx, sb.SandboxID, 2)
		_ = l.Client.Kill(ctx, sb.SandboxID)
		if err != nil {
			return next, first, err
		}
		firsts, nexts = append(firsts, floor[0]), append(nexts, floor[1])
	}
	next = summarize(spawnFloorName, rt, nexts)
	first = summarize(firstSpawnName, rt, firsts)
	first.against(next)
	return next, first, nil
}
