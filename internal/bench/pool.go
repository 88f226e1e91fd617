package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
)

// poolBenchSize is the warm pool of the pooled create figure.
const poolBenchSize = 2

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
	var ds []time.Duration
	for i := 0; i < cfg.N; i++ {
		if err := waitFull(); err != nil {
			return summarize(name, rt, ds), err
		}
		t0 := time.Now()
		sb, err := c.Create(ctx, client.CreateRequest{})
		if err != nil {
			lastErr = err
			continue
		}
		conn, err := c.Sandbox(ctx, sb.SandboxID)
		if err == nil {
			var res client.ExecResult
			res, err = conn.Exec(ctx, "true", client.ExecOptions{})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("true exited %d", res.ExitCode)
			}
		}
		took := time.Since(t0)
		_ = c.Kill(ctx, sb.SandboxID)
		if err != nil {
			lastErr = err
			continue
		}
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
