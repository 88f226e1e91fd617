package bench

import (
	"context"
	"fmt"
	"time"
)

// poolBenchSize is the warm pool of the pooled create figure.
const poolBenchSize = 2

// poolCreateCall keeps, per runtime, the create calls of the last pooled
// run timed alone (the API's answer, before any exec).
var poolCreateCall = map[string]Figure{}

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
				if p.Template == "base" && p.Ready == poolBenchSize && p.Filling == 0 {
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
	var ds, createOnly []time.Duration
	defer func() { poolCreateCall[rt] = summarize("cella create call alone (warm pool)", rt, createOnly) }()
	for i := 0; i < cfg.N; i++ {
		if err := waitFull(); err != nil {
			return summarize(name, rt, ds), err
		}
		took, create, err := createThenExec(ctx, c)
		if err != nil {
			lastErr = err
			continue
		}
		createOnly = append(createOnly, create)
		ds = append(ds, took)
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
