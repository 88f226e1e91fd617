package build

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/layerstore"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Defaults of the engine's limits (E2B's, §8.8).
const (
	DefaultTimeout      = time.Hour
	DefaultReadyTimeout = 10 * time.Minute
	// readyInterval is how often the ready command is retried.
	readyInterval = 2 * time.Second
	// defaultReadyCmd is E2B's ready command for a start command without
	// one: give it 20 s.
	defaultReadyCmd = "sleep 20"
)

// Config configures an Engine.
type Config struct {
	Sandboxes *sandbox.Manager
	Templates *template.Store
	// Egress is the build sandboxes' egress policy (cella serve
	// --build-egress-allow, default the daemon's ceiling); nil: none.
	Egress *egress.Policy
	// Timeout bounds a build whose spec sets none; ReadyTimeout the wait
	// for the ready command.
	Timeout      time.Duration
	ReadyTimeout time.Duration
	Log          *slog.Logger
}

// Engine is the Builder of a daemon: every step in a gVisor (or namespaces)
// sandbox of the daemon's sandbox manager.
type Engine struct {
	cfg Config
}

var _ Builder = (*Engine)(nil)

// New returns an engine.
func New(cfg Config) (*Engine, error) {
	if cfg.Sandboxes == nil || cfg.Templates == nil {
		return nil, errors.New("build engine: Sandboxes and Templates are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Engine{cfg: cfg}, nil
}

// builder owns the build sandboxes: the admin team's (operators see them
// in `cella ls`; no tenant's key can reach them), with no secrets.
func (e *Engine) builder() tenant.Principal {
	return tenant.Principal{Key: "build", Team: tenant.AdminTeam, Ceiling: e.cfg.Egress}
}

// egressFor is the egress of p's build sandboxes: the build policy, within
// p's own ceiling when p has one (a key made with --egress-allow cannot
// reach more through a build than from its sandboxes): the entries of
// either that the other covers, the deny lists of both.
func (e *Engine) egressFor(p tenant.Principal) *egress.Policy {
	b := e.cfg.Egress
	if b == nil || p.Ceiling == nil || p.Admin {
		return b
	}
	covered := func(entry string, by egress.Policy) bool {
		_, err := egress.Policy{AllowOut: []string{entry}}.Narrow(egress.Policy{AllowOut: by.AllowOut})
		return err == nil
	}
	out := &egress.Policy{DenyOut: slices.Concat(b.DenyOut, p.Ceiling.DenyOut)}
	for _, a := range b.AllowOut {
		if covered(a, *p.Ceiling) && !slices.Contains(out.AllowOut, a) {
			out.AllowOut = append(out.AllowOut, a)
		}
	}
	for _, a := range p.Ceiling.AllowOut {
		if covered(a, *b) && !slices.Contains(out.AllowOut, a) {
			out.AllowOut = append(out.AllowOut, a)
		}
	}
	return out
}

// state is the context a step runs in, E2B's: user, workdir, env.
type state struct {
	user     string
	uid, gid int
	workdir  string
	env      []string
}

func (s state) envMap() map[string]string {
	m := map[string]string{}
	for _, kv := range s.env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func (s *state) setEnv(k, v string) {
	s.env = slices.DeleteFunc(slices.Clone(s.env), func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
	s.env = append(s.env, k+"="+v)
}

func fromEntry(c template.CacheEntry) state {
	return state{user: c.User, uid: c.UID, gid: c.GID, workdir: c.Workdir, env: slices.Clone(c.Env)}
}

func (s state) entry(layer string) template.CacheEntry {
	return template.CacheEntry{Layer: layer, User: s.user, UID: s.uid, GID: s.gid, Workdir: s.workdir, Env: slices.Clone(s.env)}
}

func (s state) defaults(start, ready string) template.Defaults {
	return template.Defaults{User: s.user, UID: s.uid, GID: s.gid, Workdir: s.workdir, Env: slices.Clone(s.env), StartCmd: start, ReadyCmd: ready}
}

// run is one build in progress.
type run struct {
	e      *Engine
	p      tenant.Principal
	spec   Spec
	files  Files
	log    func(LogEntry)
	holder string // lease holders of the images the build makes live below
	nHold  int
	parent *template.Template
	layers []string // the steps' layers so far, bottom first
	cur    state
}

func (r *run) emit(level, step, format string, args ...any) {
	r.log(LogEntry{Time: time.Now().UTC(), Level: level, Message: fmt.Sprintf(format, args...), Step: step})
}

// Build runs spec: see Builder.
func (e *Engine) Build(ctx context.Context, p tenant.Principal, spec Spec, files Files, log func(LogEntry)) (res Result, err error) {
	if log == nil {
		log = func(LogEntry) {}
	}
	if err := validate(spec); err != nil {
		return Result{}, err
	}
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = e.cfg.Timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	r := &run{e: e, p: p, spec: spec, files: files, log: log}
	defer func() {
		if err != nil {
			if ctx.Err() == context.DeadlineExceeded {
				err = timedOut(err, timeout)
			}
			r.emit(LevelError, "", "Build failed: %s", reasonOf(err))
		}
	}()

	release, err := e.cfg.Templates.BuildLock(ctx)
	if err != nil {
		return Result{}, err
	}
	if r.holder, err = e.cfg.Templates.TempDir("build-"); err != nil {
		release()
		return Result{}, fmt.Errorf("build: %w", err)
	}
	defer func() {
		// The images the build leased to its holders go with them, unless
		// a name now points at the final one; the steps' layers stay, named
		// by the build cache.
		release()
		os.RemoveAll(r.holder)
		if _, gerr := e.cfg.Templates.GC(); gerr != nil {
			e.cfg.Log.Warn("template cache garbage collection after a build", "err", gerr)
		}
	}()
	r.emit(LevelInfo, "", "Building template %s", spec.Name)

	key, cached, err := r.base(ctx)
	if err != nil {
		return Result{}, err
	}
	if cached {
		res.Cached = append(res.Cached, "base")
	}
	forced := spec.Force
	n := len(spec.Steps)
	for i, st := range spec.Steps {
		step := strconv.Itoa(i + 1)
		typ := canonical(st.Type)
		forced = forced || st.Force
		key = hashKeys(key, typ, strings.Join(st.Args, " "), st.FilesHash)
		label := fmt.Sprintf("[builder %d/%d] %s %s [%s]", i+1, n, typ, strings.Join(st.Args, " "), short(key))
		if c, ok := e.cfg.Templates.CacheGet(p.Team, key); ok && !forced {
			r.emit(LevelInfo, step, "CACHED %s", label)
			r.applyEntry(c)
			res.Cached = append(res.Cached, step)
			continue
		}
		r.emit(LevelInfo, step, "%s", label)
		c, err := r.step(ctx, step, fmt.Sprintf("[builder %d/%d]", i+1, n), typ, st)
		if err != nil {
			return Result{}, stepErr(step, err)
		}
		if err := e.cfg.Templates.CachePut(p.Team, key, c); err != nil {
			return Result{}, stepErr(step, err)
		}
		r.applyEntry(c)
	}

	r.emit(LevelInfo, "finalize", "[finalize] Finalizing template build [%s]", short(hashKeys(key, "finalize", spec.StartCmd, spec.ReadyCmd)))
	t, snap, err := r.finalize(ctx)
	if err != nil {
		return Result{}, stepErr("finalize", err)
	}
	res.Template, res.Digest, res.Snapshot = t.Name, t.Image, snap
	res.Layers = append(slices.Clone(r.parent.Layers), r.layers...)
	r.emit(LevelInfo, "", "Build finished, took %s", time.Since(start).Round(time.Second))
	return res, nil
}

func (r *run) applyEntry(c template.CacheEntry) {
	if c.Layer != "" {
		r.layers = append(r.layers, c.Layer)
	}
	r.cur = fromEntry(c)
}

// newHolder makes a directory to lease one image of the build to.
func (r *run) newHolder() (string, error) {
	r.nHold++
	d := filepath.Join(r.holder, strconv.Itoa(r.nHold))
	return d, os.Mkdir(d, 0o700)
}

// base resolves the spec's base into r.parent and r.cur and returns its
// cache key (E2B's base hash: over the image's content or the base
// template's image) and whether it was cached.
func (r *run) base(ctx context.Context) (key string, cached bool, err error) {
	b := r.spec.Base
	tpls := r.e.cfg.Templates
	holder, err := r.newHolder()
	if err != nil {
		return "", false, stepErr("base", err)
	}
	var t *template.Template
	if b.Template != "" {
		name, _, _ := strings.Cut(b.Template, ":")
		t, err = tpls.Get(name)
		if errors.Is(err, template.ErrNotFound) && template.IsBuiltin(name) {
			t, err = tpls.EnsureNamed(ctx, name, logWriter{r, "base"})
		}
		if errors.Is(err, template.ErrNotFound) {
			return "", false, &StepError{Step: "base", Message: fmt.Sprintf("base template '%s' not found", b.Template), Err: err}
		}
		if err == nil {
			_, err = tpls.Acquire(holder, t)
		}
		if err != nil {
			return "", false, stepErr("base", err)
		}
		key = hashKeys("cella-build-base-v1", "template:"+t.Image)
		r.emit(LevelInfo, "base", "CACHED [base] FROM TEMPLATE %s [%s]", b.Template, short(key))
		cached = true
	} else {
		var o template.PullOptions
		if b.Username != "" || b.Password != "" {
			o.Auth = authn.FromConfig(authn.AuthConfig{Username: b.Username, Password: b.Password})
		}
		o.LeaseTo = holder
		o.Progress = func(ev template.PullEvent) {
			if ev.DiffID == "" {
				r.emit(LevelInfo, "base", "%s", ev.Message)
			} else if ev.Done {
				what := "pulled"
				if ev.Cached {
					what = "cached"
				}
				r.emit(LevelInfo, "base", "layer %d/%d %s: %s", ev.Layer, ev.Layers, strings.TrimPrefix(ev.DiffID, "sha256:")[:12], what)
			}
		}
		t, err = tpls.Pull(ctx, r.spec.Name, b.Image, o)
		if err != nil {
			return "", false, &StepError{Step: "base", Message: fmt.Sprintf("failed to pull image '%s': %v", b.Image, err), Err: err}
		}
		key = hashKeys("cella-build-base-v1", "image:"+t.Image)
		r.emit(LevelInfo, "base", "[base] FROM %s [%s]", b.Image, short(key))
	}
	r.parent = t
	r.cur = state{user: t.User, uid: t.UID, gid: t.GID, workdir: t.Workdir, env: slices.Clone(t.Env)}
	return key, cached, nil
}

// finalize makes the template's image and name; with a start (or ready)
// command it boots the image, starts the command, waits for the ready
// command and takes the memory snapshot sandboxes of it start from.
func (r *run) finalize(ctx context.Context) (*template.Template, string, error) {
	start, ready := r.spec.StartCmd, r.spec.ReadyCmd
	if r.spec.Base.Template != "" {
		// fromTemplate inherits the base's start and ready commands, each
		// unless the spec sets its own (E2B: a derived template's
		// setReadyCmd keeps the base's start command running).
		if start == "" {
			start = r.parent.StartCmd
		}
		if ready == "" && r.spec.StartCmd == "" {
			ready = r.parent.ReadyCmd
		}
	}
	if start != "" && ready == "" {
		ready = defaultReadyCmd
	}
	holder, err := r.newHolder()
	if err != nil {
		return nil, "", err
	}
	img, err := r.e.cfg.Templates.Derive(holder, r.parent, r.layers, r.cur.defaults(start, ready))
	if err != nil {
		return nil, "", err
	}
	snap := ""
	if start != "" || ready != "" {
		if snap, err = r.startAndSnapshot(ctx, img, start, ready); err != nil {
			return nil, "", err
		}
	}
	prev, _ := r.e.cfg.Templates.Get(r.spec.Name)
	// A template built on another runs what it runs (the docker
	// template's engine); one built on an image runs nothing extra.
	t, err := r.e.cfg.Templates.Name(r.spec.Name, img.Image, snap, r.parentServices())
	if err != nil {
		r.dropSnapshot(snap)
		return nil, "", err
	}
	r.e.cfg.Sandboxes.TemplateNamed(snap)
	if prev != nil && prev.Snapshot != "" && prev.Snapshot != snap {
		r.dropSnapshot(prev.Snapshot)
	}
	return t, snap, nil
}

func (r *run) dropSnapshot(id string) {
	if err := r.e.cfg.Sandboxes.DeleteTemplateSnapshot(context.Background(), id); err != nil {
		r.e.cfg.Log.Warn("remove template snapshot", "snapshot", id, "err", err)
	}
}

// validate checks what the engine cannot run.
func validate(s Spec) error {
	if !templateName.MatchString(s.Name) {
		return &StepError{Message: fmt.Sprintf("invalid template name %q: use letters, digits, '.', '_' and '-' (at most 128)", s.Name)}
	}
	if (s.Base.Image == "") == (s.Base.Template == "") {
		return &StepError{Step: "base", Message: "exactly one of a base image and a base template must be given"}
	}
	for i, st := range s.Steps {
		step := strconv.Itoa(i + 1)
		switch t := canonical(st.Type); t {
		case StepRun:
			if len(st.Args) < 1 || len(st.Args) > 2 {
				return &StepError{Step: step, Message: "RUN takes [cmd] or [cmd, user]"}
			}
		case StepCopy:
			if len(st.Args) != 4 {
				return &StepError{Step: step, Message: "COPY takes [src, dest, owner, mode]"}
			}
			if !filesHash.MatchString(st.FilesHash) {
				return &StepError{Step: step, Message: "COPY requires files hash to be set"}
			}
		case StepEnv:
			if len(st.Args) < 2 || len(st.Args)%2 != 0 {
				return &StepError{Step: step, Message: "ENV takes [key, value, ...] pairs"}
			}
		case StepWorkdir:
			if len(st.Args) != 1 || st.Args[0] == "" {
				return &StepError{Step: step, Message: "WORKDIR takes [path]"}
			}
		case StepUser:
			if len(st.Args) < 1 || len(st.Args) > 2 || !userName.MatchString(st.Args[0]) {
				return &StepError{Step: step, Message: "USER takes [name] or [name, \"true\"] with a valid user name"}
			}
		default:
			return &StepError{Step: step, Message: fmt.Sprintf("command type %s is not implemented", t)}
		}
	}
	return nil
}

var (
	templateName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`)
	filesHash    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	userName     = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}\$?$`)
)

// canonical is a step type as the engine runs it: upper-cased, ADD as
// COPY and ARG as ENV (E2B's executor).
func canonical(t string) string {
	switch t = strings.ToUpper(t); t {
	case "ADD":
		return StepCopy
	case "ARG":
		return StepEnv
	}
	return t
}

// hashKeys is E2B's HashKeys: sha256 over the parts, each followed by a
// separator, as hex.
func hashKeys(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func short(key string) string { return key[:12] }

// stepErr makes err a *StepError of step unless it is one.
func stepErr(step string, err error) error {
	var se *StepError
	if errors.As(err, &se) {
		if se.Step == "" {
			se.Step = step
		}
		return err
	}
	return &StepError{Step: step, Message: err.Error(), Err: err}
}

func reasonOf(err error) string {
	if _, msg, ok := FailedStep(err); ok {
		return msg
	}
	return err.Error()
}

func timedOut(err error, d time.Duration) error {
	var se *StepError
	if errors.As(err, &se) {
		se.Message = fmt.Sprintf("build timed out after %v: %s", d, se.Message)
		return se
	}
	return fmt.Errorf("build timed out after %v: %w", d, err)
}

// logWriter turns lines written to it (a builtin's build progress) into
// log entries of step.
type logWriter struct {
	r    *run
	step string
}

func (w logWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.r.emit(LevelInfo, w.step, "%s", l)
	}
	return len(p), nil
}

// storeLayer captures build sandbox id's writable layer into the layer
// store and returns its diffID ("" when the step wrote nothing).
func (r *run) storeLayer(ctx context.Context, id string) (string, error) {
	var diffID string
	err := r.e.cfg.Sandboxes.CaptureLayer(ctx, r.e.builder(), id, func(writeTar func(io.Writer) error) error {
		// First pass: the diffID, and whether there is anything at all.
		h := sha256.New()
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTar(pw)) }()
		tr := tar.NewReader(io.TeeReader(pr, h))
		entries := 0
		for {
			_, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				pr.CloseWithError(err)
				return fmt.Errorf("capture layer: %w", err)
			}
			entries++
		}
		if _, err := io.Copy(h, pr); err != nil {
			return fmt.Errorf("capture layer: %w", err)
		}
		if entries == 0 {
			return nil
		}
		diffID = "sha256:" + hex.EncodeToString(h.Sum(nil))
		pr2, pw2 := io.Pipe()
		go func() { pw2.CloseWithError(writeTar(pw2)) }()
		defer pr2.Close()
		_, _, err := r.e.cfg.Templates.Layers.Unpack(ctx, diffID, layerstore.Blob{R: pr2, Size: -1, MediaType: string(types.OCIUncompressedLayer)}, nil)
		if err != nil {
			return fmt.Errorf("store layer: %w", err)
		}
		return nil
	})
	return diffID, err
}
