package codeinterp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"sync"
	"time"
)

// kernel is a context: one language, one working directory, and the driver
// process that holds its state. Cells run one at a time (sem).
type kernel struct {
	s    *Server
	id   string
	lang *language
	cwd  string

	sem   chan struct{} // held while a cell runs or the driver is replaced
	count int           // executions so far (under sem)

	mu      sync.Mutex
	drv     *driver
	stopped bool
}

func newKernel(s *Server, lang *language, cwd string) *kernel {
	return &kernel{s: s, id: newContextID(), lang: lang, cwd: cwd, sem: make(chan struct{}, 1)}
}

func newContextID() string {
	h := randomHex(16)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (k *kernel) info() contextInfo {
	return contextInfo{ID: k.id, Language: k.lang.name, Cwd: k.cwd}
}

func (k *kernel) lock(ctx context.Context) error {
	select {
	case k.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the previous execution in context %s: %w", k.id, context.Cause(ctx))
	}
}

func (k *kernel) unlock() { <-k.sem }

// ensure starts the driver if none is running.
func (k *kernel) ensure(ctx context.Context) error {
	if err := k.lock(ctx); err != nil {
		return err
	}
	defer k.unlock()
	_, err := k.driver()
	return err
}

// driver returns the running driver, starting one if there is none or the
// last one died (the restart of a crashed interpreter). Call with sem held.
func (k *kernel) driver() (*driver, error) {
	k.mu.Lock()
	d, stopped := k.drv, k.stopped
	k.mu.Unlock()
	if stopped {
		return nil, fmt.Errorf("context %s was removed", k.id)
	}
	if d != nil && d.alive() {
		return d, nil
	}
	if d != nil {
		slog.Warn("code interpreter: restarting a dead interpreter", "context", k.id, "language", k.lang.name, "status", describeStatus(d.status))
	}
	d, err := startDriver(k.lang, k.s.cfg.Env(), k.cwd, k.s.cfg.Spawn, k.s.cfg.ReadyTimeout)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		d.kill()
		return nil, fmt.Errorf("context %s was removed", k.id)
	}
	k.drv = d
	return d, nil
}

// kill ends the current driver, if any; the next cell starts a new one.
func (k *kernel) kill() {
	k.mu.Lock()
	d := k.drv
	k.mu.Unlock()
	if d != nil {
		d.kill()
		d.waitExit()
	}
}

// stop kills the driver for good (context removed, server closed).
func (k *kernel) stop() {
	k.mu.Lock()
	k.stopped = true
	k.mu.Unlock()
	k.kill()
}

// restart replaces the driver with a fresh one: the state is lost.
func (k *kernel) restart(ctx context.Context) error {
	// Kill first, so that a running cell ends and releases sem.
	k.kill()
	if err := k.lock(ctx); err != nil {
		return err
	}
	defer k.unlock()
	k.kill() // a cell may have started between the kill and the lock
	_, err := k.driver()
	return err
}

// ndjson writes the response stream, one JSON object per line, flushed.
type ndjson struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	last   time.Time
	broken bool // the client went away; writes are dropped
}

func (n *ndjson) write(v any) {
	if n.broken {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		slog.Error("code interpreter: marshal output", "err", err)
		return
	}
	if _, err := n.w.Write(append(b, '\n')); err != nil {
		slog.Info("code interpreter: client connection lost", "err", err)
		n.broken = true
		return
	}
	_ = n.rc.Flush()
	n.last = time.Now()
}

func (n *ndjson) log(kind, text string) {
	n.write(map[string]any{"type": kind, "text": text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
}

// execute runs one cell and streams its output as E2B's NDJSON.
func (k *kernel) execute(w http.ResponseWriter, r *http.Request, code string, envVars map[string]string) {
	ctx := r.Context()
	started := time.Now()
	if err := k.lock(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	defer k.unlock()
	d, err := k.driver()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	out := &ndjson{w: w, rc: http.NewResponseController(w)}
	k.count++
	out.write(map[string]any{"type": "number_of_executions", "execution_count": k.count})

	sk := &sink{ch: make(chan chunk, 64), done: make(chan struct{})}
	d.setSink(sk)
	defer func() {
		d.setSink(nil)
		close(sk.done)
	}()
	c := cell{Type: "execute", Code: code, EnvVars: envVars}
	if !d.synced {
		c.EnvBase = d.envUpdate(k.s.cfg.Env())
		d.synced = true
	}
	if err := d.send(c); errors.Is(err, errNULInCell) {
		out.write(map[string]any{"type": "error", "name": "ValueError", "value": err.Error(), "traceback": ""})
		out.write(map[string]any{"type": "end_of_execution"})
		return
	} else if err != nil {
		// The driver died between cells; the next cell restarts it.
		d.kill()
		k.reportDeath(out, d)
		out.write(map[string]any{"type": "end_of_execution"})
		return
	}

	keepalive := time.NewTicker(k.s.cfg.KeepaliveInterval)
	defer keepalive.Stop()
	var (
		cellDone    bool
		marks       = map[string]bool{}
		markTimer   <-chan time.Time
		graceTimer  <-chan time.Time
		clientGone  = ctx.Done()
		interrupted bool
	)
	finished := func() bool { return cellDone && marks[kindStdout] && marks[kindStderr] }
	for {
		select {
		case c := <-sk.ch:
			if c.mark {
				marks[c.kind] = true
				if finished() {
					out.write(map[string]any{"type": "end_of_execution"})
					return
				}
				continue
			}
			out.log(c.kind, c.text)
		case ev, ok := <-d.events:
			if !ok {
				// fd 4 closed: the interpreter is gone (os._exit, a crash,
				// a limit). Its state is lost; the next cell starts afresh.
				d.waitExit()
				k.drainOutput(out, sk)
				if !interrupted {
					k.reportDeath(out, d)
				}
				out.write(map[string]any{"type": "end_of_execution"})
				return
			}
			switch ev.Type {
			case "result":
				out.write(resultLine(ev))
			case "error":
				out.write(map[string]any{"type": "error", "name": ev.Name, "value": ev.Value, "traceback": ev.Traceback})
			case "done":
				cellDone = true
				if finished() {
					out.write(map[string]any{"type": "end_of_execution"})
					return
				}
				markTimer = time.After(k.s.cfg.MarkTimeout)
			}
		case <-markTimer:
			// The cell redirected its fds or a child holds them: end anyway.
			out.write(map[string]any{"type": "end_of_execution"})
			return
		case <-keepalive.C:
			if time.Since(out.last) >= k.s.cfg.KeepaliveInterval {
				out.write(map[string]any{"type": "keepalive"})
			}
		case <-clientGone:
			// The SDK aborts the request when timeoutMs expires: interrupt
			// the cell like Jupyter's interrupt button, so the context stays
			// usable with its state.
			clientGone = nil
			interrupted = true
			out.broken = true
			slog.Info("code interpreter: client went away mid-cell; interrupting", "context", k.id, "pid", d.pid, "after", time.Since(started).Round(time.Millisecond), "cause", context.Cause(ctx))
			d.interrupt()
			graceTimer = time.After(k.s.cfg.InterruptGrace)
		case <-graceTimer:
			// Stuck in C code or ignoring SIGINT: the state is lost, but the
			// context is not.
			slog.Warn("code interpreter: interpreter ignored SIGINT; killing it", "context", k.id, "pid", d.pid, "grace", k.s.cfg.InterruptGrace)
			d.kill()
			d.waitExit()
			return
		}
	}
}

// drainOutput forwards what the readers still hold after the driver died.
func (k *kernel) drainOutput(out *ndjson, sk *sink) {
	timeout := time.After(200 * time.Millisecond)
	for {
		select {
		case c := <-sk.ch:
			if !c.mark {
				out.log(c.kind, c.text)
			}
		case <-timeout:
			return
		}
	}
}

func (k *kernel) reportDeath(out *ndjson, d *driver) {
	d.waitExit()
	status := describeStatus(d.status)
	out.write(map[string]any{
		"type":      "error",
		"name":      "InterpreterDied",
		"value":     fmt.Sprintf("the %s interpreter of context %s exited (%s); its state is lost and the next execution starts a fresh one", k.lang.name, k.id, status),
		"traceback": fmt.Sprintf("InterpreterDied: the %s interpreter exited (%s)\n", k.lang.name, status),
	})
	slog.Warn("code interpreter: interpreter died during a cell", "context", k.id, "language", k.lang.name, "status", status)
}

// mimeKeys maps MIME types to the keys of E2B's result line (upstream's
// api/models/result.py); anything else goes to "extra".
var mimeKeys = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

func resultLine(ev event) map[string]any {
	line := map[string]any{"type": "result", "is_main_result": ev.Main}
	extra := map[string]json.RawMessage{}
	for mime, v := range maps.All(ev.Data) {
		key, ok := mimeKeys[mime]
		if !ok {
			extra[mime] = v
			continue
		}
		if key == "text" {
			var s string
			if json.Unmarshal(v, &s) == nil {
				// Upstream strips the quotes of a string's repr, ' or ".
				if len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && s[len(s)-1] == s[0] {
					s = s[1 : len(s)-1]
				}
				line[key] = s
				continue
			}
		}
		line[key] = v
	}
	line["extra"] = extra
	return line
}
