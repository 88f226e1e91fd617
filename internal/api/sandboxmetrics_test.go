package api_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestSandboxMetrics: GET /sandboxes/{id}/metrics and /sandboxes/metrics
// report what a real sandbox does — a busy loop's CPU, memory it holds, a
// file it writes — sampled in the background and on request; windows,
// pause (no new samples), kill (404) and bad input.
func TestSandboxMetrics(t *testing.T) {
	for _, rt := range []string{runtime.GVisor, runtime.Namespaces} {
		t.Run(rt, func(t *testing.T) { testSandboxMetrics(t, rt) })
	}
}

func testSandboxMetrics(t *testing.T, rt string) {
	const interval = 200 * time.Millisecond
	env := daemontest.Start(t, rt, daemontest.Options{MetricsInterval: interval})
	a := apiT{env: env}
	c := env.Client
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id, sb := mustCreate(t, env, map[string]any{"templateID": "base", "memoryMB": 384, "diskSizeMB": 256})

	t.Run("BadInput", func(t *testing.T) {
		st, _, body := a.do(t, "GET", "/sandboxes/nope/metrics", env.APIKey, nil, nil)
		a.wantError(t, 404, st, body, "nope")
		for _, q := range []string{"start=abc", "end=-1", "start=20&end=10", "start=1.5"} {
			st, _, body := a.do(t, "GET", "/sandboxes/"+id+"/metrics?"+q, env.APIKey, nil, nil)
			a.wantError(t, 400, st, body, "")
		}
		st, _, body = a.do(t, "GET", "/sandboxes/metrics", env.APIKey, nil, nil)
		a.wantError(t, 400, st, body, "sandbox_ids")
		st, _, body = a.do(t, "GET", "/sandboxes/"+id+"/metrics", "", nil, nil)
		a.wantError(t, 401, st, body, "")
	})

	// A file on the writable layer, 64 MiB held by a process that also
	// spins: each must show in the samples.
	if res := sh(t, sb, "", "head -c 25165824 /dev/urandom > /home/user/blob && "+
		`nohup python3 -c 'held = b"x" * (64 << 20)
while True: pass' >/dev/null 2>&1 &`); res.ExitCode != 0 {
		t.Fatalf("load: exit %d %q", res.ExitCode, res.Stderr)
	}
	var last client.Metric
	deadline := time.Now().Add(90 * time.Second)
	for {
		ms, err := c.Metrics(ctx, id, time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 0 {
			t.Fatal("no samples although the request asks for the present")
		}
		last = ms[len(ms)-1]
		if last.CPUUsedPct > 20 && last.MemUsed >= 64<<20 && last.DiskUsed >= 24<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the newest sample does not show the load (want CPU > 20%%, memory ≥ 64 MiB, disk ≥ 24 MiB): %+v", last)
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("under load: CPU %.1f%% of %d, memory %d MiB used + %d MiB cache of %d MiB, disk %d of %d MiB",
		last.CPUUsedPct, last.CPUCount, last.MemUsed>>20, last.MemCache>>20, last.MemTotal>>20, last.DiskUsed>>20, last.DiskTotal>>20)
	if last.CPUCount != 1 || last.MemTotal != 384<<20 || last.DiskTotal != 256<<20 || last.CPUUsedPct > 100 ||
		last.MemUsed > last.MemTotal || last.DiskUsed > last.DiskTotal || last.MemCache < 0 {
		t.Fatalf("sample under load: %+v (want cpuCount 1, memTotal 384 MiB, diskTotal 256 MiB, used within totals)", last)
	}
	if last.TimestampUnix != last.Timestamp.Unix() || time.Since(last.Timestamp) > time.Minute {
		t.Fatalf("sample timestamp %v / %d", last.Timestamp, last.TimestampUnix)
	}

	t.Run("BackgroundSampling", func(t *testing.T) {
		// With end given nothing is sampled on request: new samples come
		// from the daemon's own sampler.
		t0 := time.Now()
		for deadline := t0.Add(60 * time.Second); ; {
			ms, err := c.Metrics(ctx, id, t0, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) >= 3 {
				for i, m := range ms {
					if m.Timestamp.Before(t0.Truncate(time.Second)) || (i > 0 && m.Timestamp.Before(ms[i-1].Timestamp)) {
						t.Fatalf("sample %d at %v: outside the window from %v or out of order", i, m.Timestamp, t0)
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d samples in the minute after %v with a %v sampling interval", len(ms), t0, interval)
			}
			time.Sleep(interval)
		}
		if ms, err := c.Metrics(ctx, id, time.Now().Add(time.Hour), time.Time{}); err != nil || len(ms) != 0 {
			t.Fatalf("a window in the future: %d samples, %v", len(ms), err)
		}
	})

	t.Run("Latest", func(t *testing.T) {
		got, err := c.LatestMetrics(ctx, []string{id, "nope"})
		if err != nil {
			t.Fatal(err)
		}
		m, ok := got[id]
		if len(got) != 1 || !ok || m.MemTotal != 384<<20 || time.Since(m.Timestamp) > time.Minute {
			t.Fatalf("latest of [%s nope]: %+v", id, got)
		}
	})

	if rt == runtime.GVisor {
		t.Run("PausedGetsNoSamples", func(t *testing.T) {
			if st, _, body := a.do(t, "POST", "/sandboxes/"+id+"/pause", env.APIKey, "{}", nil); st != 204 {
				t.Fatalf("pause: %d %s", st, body)
			}
			before, err := c.Metrics(ctx, id, time.Time{}, time.Time{})
			if err != nil || len(before) == 0 {
				t.Fatalf("metrics of a paused sandbox: %d samples, %v", len(before), err)
			}
			time.Sleep(5 * interval) // the sampler passes it by
			after, err := c.Metrics(ctx, id, time.Time{}, time.Time{})
			if err != nil || len(after) != len(before) {
				t.Fatalf("a paused sandbox was sampled: %d samples, then %d (%v)", len(before), len(after), err)
			}
		})
	}

	if err := c.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	_, err := c.Metrics(ctx, id, time.Time{}, time.Time{})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Fatalf("metrics of a killed sandbox: %v, want 404", err)
	}
}
