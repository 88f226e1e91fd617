// Package codeinterp is cella's code-interpreter server: the in-sandbox
// service on port 49999 that E2B's @e2b/code-interpreter SDK talks to
// (POST /execute streaming NDJSON, /contexts, /health).
//
// Upstream runs Jupyter kernels behind a FastAPI app. cella runs the server
// inside the agent instead and gives each context a small driver process
// (drivers/python.py, drivers/node.js, embedded here): a long-lived
// interpreter that executes one cell at a time, keeps its globals between
// cells, reports the value of a trailing expression and rich results
// (IPython's display protocol, matplotlib figures as PNG) as JSON events on
// a pipe, and leaves the cell's stdout and stderr on its own fds 1 and 2 so
// that they stream live, including the output of subprocesses.
//
// A context's driver starts on its first cell (default contexts are created
// on first use too), restarts after it dies, and is interrupted with SIGINT
// when the client goes away mid-cell: the SDK enforces timeoutMs by
// aborting the request, which is the only signal the server gets.
package codeinterp

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Port is where the E2B SDK expects the code interpreter.
const Port = 49999

// Config is what the server needs from the agent.
type Config struct {
	// AccessToken returns envd's current X-Access-Token ("" = no check).
	// The SDK sends it on /execute only, so only /execute checks it.
	AccessToken func() string
	// Env returns the environment a new interpreter starts with: PATH,
	// HOME, USER and the sandbox's env vars.
	Env func() []string
	// Workdir is the default working directory of a context.
	Workdir string
	// Spawn starts a driver process.
	Spawn Spawner

	// Tunables; zero means the default.
	KeepaliveInterval time.Duration // 5 s, as upstream
	InterruptGrace    time.Duration // how long a SIGINT may take before the driver is killed (3 s)
	ReadyTimeout      time.Duration // how long an interpreter may take to start (60 s)
	MarkTimeout       time.Duration // how long to wait for output after a cell ended (2 s)
}

// Server serves the code-interpreter API. It starts no goroutine and no
// process until a request asks for one.
type Server struct {
	cfg Config

	mu       sync.Mutex
	contexts map[string]*kernel
	defaults map[string]*kernel // language → its default context
	closed   bool
}

// New makes a server.
func New(cfg Config) *Server {
	if cfg.AccessToken == nil {
		cfg.AccessToken = func() string { return "" }
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ
	}
	if cfg.Spawn == nil {
		cfg.Spawn = LocalSpawner
	}
	if cfg.Workdir == "" {
		cfg.Workdir = "/"
	}
	if cfg.KeepaliveInterval <= 0 {
		cfg.KeepaliveInterval = 5 * time.Second
	}
	if cfg.InterruptGrace <= 0 {
		cfg.InterruptGrace = 3 * time.Second
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	if cfg.MarkTimeout <= 0 {
		cfg.MarkTimeout = 2 * time.Second
	}
	s := &Server{cfg: cfg, contexts: map[string]*kernel{}, defaults: map[string]*kernel{}}
	// E2B's server creates the python and javascript contexts at start-up,
	// so GET /contexts lists them before any cell ran. Their interpreters
	// start on their first cell: the sandbox's env vars may still change
	// until then (the daemon configures the agent after boot).
	for _, name := range defaultLanguages {
		_ = s.add(newKernel(s, languages[name], cfg.Workdir), true)
	}
	return s
}

// defaultLanguages have a context from the start, as in E2B.
var defaultLanguages = []string{"python", "javascript"}

// Warm starts the default python context's interpreter in the background,
// as E2B starts its kernels at boot: IPython takes a second or two to
// start, which the first runCode would otherwise wait for. The first cell
// brings its environment up to date (Config.Env may still change until
// then).
func (s *Server) Warm(ctx context.Context) {
	s.mu.Lock()
	k := s.defaults["python"]
	s.mu.Unlock()
	if k == nil {
		return
	}
	go func() {
		if err := k.ensure(ctx); err != nil {
			slog.Warn("code interpreter: warming the python context", "err", err)
		}
	}()
}

// Close kills every interpreter; later requests fail.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	all := make([]*kernel, 0, len(s.contexts))
	for _, k := range s.contexts {
		all = append(all, k)
	}
	s.mu.Unlock()
	for _, k := range all {
		k.stop()
	}
}

// Serve serves the API on ln until ctx ends, then kills the interpreters.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(slog.Default().Handler(), slog.LevelError),
	}
	stop := context.AfterFunc(ctx, func() { _ = hs.Close() })
	defer stop()
	err := hs.Serve(ln)
	s.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, "OK")
	})
	mux.HandleFunc("POST /execute", s.handleExecute)
	mux.HandleFunc("GET /contexts", s.handleList)
	mux.HandleFunc("POST /contexts", s.handleCreate)
	mux.HandleFunc("DELETE /contexts/{id}", s.handleDelete)
	mux.HandleFunc("POST /contexts/{id}/restart", s.handleRestart)
	return mux
}

// contextInfo is E2B's Context.
type contextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

type createRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	lang, ok := lookupLanguage(req.Language)
	if !ok {
		writeError(w, http.StatusBadRequest, unsupported(req.Language))
		return
	}
	cwd, err := s.resolveCwd(req.Cwd)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	k := newKernel(s, lang, cwd)
	// Start the interpreter now, as upstream starts a kernel: a context that
	// cannot run fails here, not on its first cell.
	if err := k.ensure(r.Context()); errors.Is(err, errCwdDenied) {
		writeError(w, http.StatusBadRequest, err)
		return
	} else if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if err := s.add(k, false); err != nil {
		k.stop()
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	slog.Info("code interpreter: context created", "id", k.id, "language", lang.name, "cwd", cwd)
	writeJSON(w, http.StatusOK, k.info())
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	out := make([]contextInfo, 0, len(s.contexts))
	for _, k := range s.contexts {
		out = append(out, k.info())
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b contextInfo) int { return strings.Compare(a.ID, b.ID) })
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	k := s.contexts[id]
	if k != nil {
		delete(s.contexts, id)
		if s.defaults[k.lang.name] == k {
			delete(s.defaults, k.lang.name)
		}
	}
	s.mu.Unlock()
	if k == nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("context %s not found", id))
		return
	}
	k.stop()
	slog.Info("code interpreter: context removed", "id", id)
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleRestart(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	k := s.contexts[id]
	s.mu.Unlock()
	if k == nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("context %s not found", id))
		return
	}
	if err := k.restart(r.Context()); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	slog.Info("code interpreter: context restarted", "id", id)
	w.WriteHeader(http.StatusOK)
}

// executeRequest is the body of POST /execute.
type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (s *Server) handleExecute(w http.ResponseWriter, r *http.Request) {
	if tok := s.cfg.AccessToken(); tok != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(tok)) != 1 {
		writeError(w, http.StatusUnauthorized, errors.New("unauthorized access, please provide a valid access token"))
		return
	}
	var req executeRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if req.Code == nil {
		writeError(w, http.StatusBadRequest, errors.New("code is required"))
		return
	}
	if req.ContextID != "" && req.Language != "" {
		writeError(w, http.StatusBadRequest, errors.New("provide context_id or language, not both"))
		return
	}
	var k *kernel
	if req.ContextID != "" {
		s.mu.Lock()
		k = s.contexts[req.ContextID]
		s.mu.Unlock()
		if k == nil {
			writeError(w, http.StatusNotFound, fmt.Errorf("context %s not found", req.ContextID))
			return
		}
	} else {
		lang, ok := lookupLanguage(req.Language)
		if !ok {
			writeError(w, http.StatusBadRequest, unsupported(req.Language))
			return
		}
		var err error
		if k, err = s.defaultContext(lang); err != nil {
			writeError(w, http.StatusServiceUnavailable, err)
			return
		}
	}
	k.execute(w, r, *req.Code, req.EnvVars)
}

// defaultContext returns the default context of lang, creating it (without
// starting its interpreter) on first use.
func (s *Server) defaultContext(lang *language) (*kernel, error) {
	s.mu.Lock()
	if k := s.defaults[lang.name]; k != nil {
		s.mu.Unlock()
		return k, nil
	}
	s.mu.Unlock()
	k := newKernel(s, lang, s.cfg.Workdir)
	if err := s.add(k, true); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.defaults[lang.name], nil
}

func (s *Server) add(k *kernel, asDefault bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("the code interpreter is shutting down")
	}
	if asDefault {
		if s.defaults[k.lang.name] != nil {
			return nil // lost a race: the other one is the default
		}
		s.defaults[k.lang.name] = k
	}
	s.contexts[k.id] = k
	return nil
}

// resolveCwd makes a context's cwd absolute (relative to the default
// working directory) and checks that it is a directory.
func (s *Server) resolveCwd(cwd string) (string, error) {
	if cwd == "" {
		return s.cfg.Workdir, nil
	}
	if !filepath.IsAbs(cwd) {
		cwd = filepath.Join(s.cfg.Workdir, cwd)
	}
	cwd = filepath.Clean(cwd)
	st, err := os.Stat(cwd)
	if err != nil {
		return "", fmt.Errorf("cwd %s: %w", cwd, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("cwd %s is not a directory", cwd)
	}
	return cwd, nil
}

func unsupported(lang string) error {
	names := make([]string, 0, len(languages))
	for n := range languages {
		names = append(names, n)
	}
	slices.Sort(names)
	return fmt.Errorf("language %q is not supported by cella's code interpreter (supported: %s)", lang, strings.Join(names, ", "))
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 16<<20))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("parse request body: %w", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes cella's error body. The SDK shows a 404 body verbatim
// in NotFoundError and reduces other statuses to "<status> <text>".
func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, err.Error()})
}
