package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/template"
)

// Docker measures the docker template beside base, on one gVisor daemon
// (the only runtime that runs it): create → first exec done for each,
// alternating; create → the engine answering `docker info` (it starts at
// boot, concurrently with the first exec); `docker run --rm` of a busybox
// image in a running sandbox beside an exec of `true` there; and each
// template's idle memory once its sandbox settled.
func Docker(ctx context.Context, cfg Config) ([]Figure, error) {
	if cfg.N <= 0 {
		cfg.N = 20
	}
	tpls, _, err := ensureBase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := tpls.EnsureNamed(ctx, template.DockerName, io.Discard); err != nil {
		return nil, err
	}
	l, err := startLocal(ctx, cfg, runtime.GVisor)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	rt := runtime.GVisor

	var base, first, engine []time.Duration
	var lastErr error
	for range cfg.N {
		if took, _, err := createThenExecOf(ctx, l.Client, client.CreateRequest{TemplateID: template.BaseName}); err == nil {
			base = append(base, took)
		} else {
			lastErr = err
		}
		f, e, err := dockerCreate(ctx, l)
		if err != nil {
			lastErr = err
			continue
		}
		first, engine = append(first, f), append(engine, e)
	}
	baseFig := summarize("cella create → first exec done (base)", rt, base)
	firstFig := summarize("cella create → first exec done (docker)", rt, first)
	firstFig.against(baseFig)
	engineFig := summarize("cella create → docker info answers (docker)", rt, engine)
	engineFig.against(baseFig)
	figs := []Figure{baseFig, firstFig, engineFig}
	if lastErr != nil {
		figs[len(figs)-1].Err = lastErr.Error()
	}

	runFigs, err := dockerRuns(ctx, l, cfg.N)
	if err != nil && len(runFigs) == 0 {
		runFigs = []Figure{{Name: "docker run --rm (busybox) in a running sandbox", Runtime: rt, Err: err.Error()}}
	}
	figs = append(figs, runFigs...)
	return append(figs, idleMemory(ctx, l)...), nil
}

// dockerCreate creates a docker sandbox and returns how long after the
// create call its first exec and its first `docker info` were done.
func dockerCreate(ctx context.Context, l *local) (firstExec, engine time.Duration, err error) {
	t0 := time.Now()
	sb, err := l.sandbox(ctx, client.CreateRequest{TemplateID: template.DockerName})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = l.Client.Kill(ctx, sb.ID) }()
	if err := execOK(ctx, sb, "true"); err != nil {
		return 0, 0, err
	}
	firstExec = time.Since(t0)
	if err := execOK(ctx, sb, "docker info >/dev/null"); err != nil {
		return 0, 0, err
	}
	return firstExec, time.Since(t0), nil
}

// dockerRuns times `docker run --rm` of a busybox image (imported from the
// template's static busybox: no registry) beside an exec of `true`.
func dockerRuns(ctx context.Context, l *local, n int) ([]Figure, error) {
	sb, err := l.sandbox(ctx, client.CreateRequest{TemplateID: template.DockerName})
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Client.Kill(ctx, sb.ID) }()
	const importBusybox = `d=$(mktemp -d) && mkdir $d/bin && cp /bin/busybox $d/bin/ && ln -s busybox $d/bin/true && tar -C $d -c . | docker import - bb >/dev/null`
	if err := execOK(ctx, sb, importBusybox); err != nil {
		return nil, err
	}
	rt := runtime.GVisor
	exec, err1 := repeatErr(n, func() error { return execOK(ctx, sb, "true") })
	run, err2 := repeatErr(n, func() error { return execOK(ctx, sb, "docker run --rm bb true") })
	execFig := summarize("exec true in a docker sandbox", rt, exec)
	runFig := summarize("docker run --rm (busybox true) in a docker sandbox", rt, run)
	runFig.against(execFig)
	for _, e := range []error{err1, err2} {
		if e != nil {
			runFig.Err = e.Error()
		}
	}
	return []Figure{execFig, runFig}, nil
}

// idleMemory is each template's host memory once a sandbox of it idled
// for a few seconds: its cgroup charge and the PSS of its processes (as
// Density measures them).
func idleMemory(ctx context.Context, l *local) []Figure {
	tpls := []string{template.BaseName, template.DockerName}
	figs := make([]Figure, len(tpls))
	ids := make([]string, len(tpls))
	for i, tpl := range tpls {
		figs[i] = Figure{Name: "idle memory (" + tpl + ")", Runtime: runtime.GVisor, N: 1}
		sb, err := l.sandbox(ctx, client.CreateRequest{TemplateID: tpl})
		if err == nil && tpl == template.DockerName {
			err = execOK(ctx, sb, "docker info >/dev/null") // the engine is up
		}
		if sb != nil {
			ids[i] = sb.ID
		}
		if err != nil {
			figs[i].Err = err.Error()
		}
	}
	time.Sleep(5 * time.Second) // settle to idle, as Density does
	for i, id := range ids {
		if id == "" {
			continue
		}
		if figs[i].Err == "" {
			figs[i].Extra = fmt.Sprintf("%.1f MB cgroup charge, %.1f MB PSS", float64(cgroupCharge(id))/1e6, float64(sandboxPSS(id))/1e6)
		}
		_ = l.Client.Kill(ctx, id)
	}
	return figs
}

func execOK(ctx context.Context, sb *client.SandboxConn, cmd string) error {
	res, err := sb.Exec(ctx, cmd, client.ExecOptions{Timeout: 5 * time.Minute})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s: exit %d: %s", cmd, res.ExitCode, res.Stderr)
	}
	return nil
}
