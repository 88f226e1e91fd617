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
		figs := []Figure{s, f}
		if floor, err := l.poolSpawnFloor(ctx, rt); err == nil {
			f.alsoAgainst(floor)
			s.alsoAgainst(floor)
			figs = []Figure{floor, s, f}
		}
		poolExecs[rt] = figs
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

// poolSpawnFloor is the in-sandbox spawn floor in a sandbox of the pool
// (its first spawn, which the warm-up already paid, included).
func (l *local) poolSpawnFloor(ctx context.Context, rt string) (Figure, error) {
	sb, err := l.Client.Create(ctx, client.CreateRequest{})
	if err != nil {
		return Figure{}, err
	}
	defer func() { _ = l.Client.Kill(ctx, sb.SandboxID) }()
	floor, _, err := l.spawnFloors(ctx, sb.SandboxID, 10)
	return summarize(spawnFloorName, rt, floor), err
}
