package build

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/template"
)

// startAndSnapshot boots the template's image, starts the start command in
// the background (the last step's user, workdir and env), retries the
// ready command every 2 s until it exits 0, and takes the memory snapshot
// sandboxes of the template start from: the start command is captured
// running and never runs again. It returns the snapshot's ID.
func (r *run) startAndSnapshot(ctx context.Context, img *template.Template, start, ready string) (string, error) {
	b, err := r.boot(ctx, img)
	if err != nil {
		return "", err
	}
	// Last: the start command's reader has stopped, so nothing is logged
	// after Build returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer b.kill()
	env := r.cur.envMap()
	type ended struct {
		res result
		err error
	}
	startDone := make(chan ended, 1)
	sctx, stopStart := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStart()
	if start != "" {
		r.emit(LevelInfo, "finalize", "Running start command: %s", start)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := b.exec(sctx, r.cur.user, r.cur.workdir, env, start, func(stream, line string) {
				r.emit(LevelInfo, "finalize", "[start] [%s]: %s", stream, line)
			})
			startDone <- ended{res, err}
		}()
	}
	r.emit(LevelInfo, "finalize", "Waiting for template to be ready: %s", ready)
	deadline := time.Now().Add(r.e.cfg.ReadyTimeout)
	var last result
	for {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		res, err := b.exec(rctx, r.cur.user, r.cur.workdir, env, ready, nil)
		cancel()
		if err == nil && res.code == 0 {
			break
		}
		if err == nil {
			last = res
		}
		select {
		case e := <-startDone:
			if e.err != nil {
				return "", fmt.Errorf("start command failed: %w", e.err)
			}
			if e.res.code != 0 {
				return "", fmt.Errorf("start command failed: %s: %s", cmdErr(start, e.res), strings.TrimSpace(e.res.output))
			}
			startDone <- e // ended with 0: a one-shot start command
		default:
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if !time.Now().Before(deadline) {
			return "", fmt.Errorf("ready command timed out after %v: the ready command '%s' last exited %d: %s",
				r.e.cfg.ReadyTimeout, ready, last.code, strings.TrimSpace(last.output))
		}
		t := time.NewTimer(min(readyInterval, time.Until(deadline)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		}
	}
	r.emit(LevelInfo, "finalize", "Template is ready")
	if _, err := b.root(ctx, "sync"); err != nil {
		return "", err
	}
	return r.e.cfg.Sandboxes.TemplateSnapshot(ctx, b.sb.ID, r.spec.Name)
}
