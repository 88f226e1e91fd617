package build

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

var _ Starter = (*Engine)(nil)

// CaptureStart is Starter's: a finalize without steps, on the template's
// own image, with its own start and ready commands, user, workdir and env.
func (e *Engine) CaptureStart(ctx context.Context, p tenant.Principal, name string, sizes Sizes, log func(LogEntry)) error {
	if log == nil {
		log = func(LogEntry) {}
	}
	img, err := e.cfg.Templates.Get(name)
	if err != nil {
		return fmt.Errorf("capture the start command of %s: %w", name, err)
	}
	if img.StartCmd == "" && img.ReadyCmd == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	r := &run{e: e, p: p, spec: Spec{Name: name, CPUs: sizes.CPUs, MemoryMB: sizes.MemoryMB}, log: log, parent: img,
		cur: state{user: img.User, uid: img.UID, gid: img.GID, workdir: img.Workdir, env: img.Env}}
	ready := img.ReadyCmd
	if img.StartCmd != "" && ready == "" {
		ready = defaultReadyCmd // as finalize does
	}
	snap, err := r.startAndSnapshot(ctx, img, img.StartCmd, ready)
	if err != nil {
		return fmt.Errorf("capture the start command of %s: %w", name, err)
	}
	if _, err := e.cfg.Templates.Name(name, img.Image, snap, img.Services); err != nil {
		r.dropSnapshot(snap)
		return fmt.Errorf("capture the start command of %s: %w", name, err)
	}
	e.cfg.Sandboxes.TemplateNamed(snap)
	if img.Snapshot != "" && img.Snapshot != snap {
		r.dropSnapshot(img.Snapshot)
	}
	return nil
}

// commandFailed is a template's own start or ready command failing (it
// exited non-zero, or was never ready): the template's doing, not the
// node's (a boot, the disk, a snapshot).
type commandFailed struct{ error }

func (e commandFailed) Unwrap() error { return e.error }

// IsCommandFailure says whether err is a template's own start or ready
// command failing rather than the machinery around it.
func IsCommandFailure(err error) bool {
	var cf commandFailed
	return errors.As(err, &cf)
}

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
				return "", commandFailed{fmt.Errorf("start command failed: %s: %s", cmdErr(start, e.res), strings.TrimSpace(e.res.output))}
			}
			startDone <- e // ended with 0: a one-shot start command
		default:
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if !time.Now().Before(deadline) {
			return "", commandFailed{fmt.Errorf("ready command timed out after %v: the ready command '%s' last exited %d: %s",
				r.e.cfg.ReadyTimeout, ready, last.code, strings.TrimSpace(last.output))}
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
