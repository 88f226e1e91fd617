package agent

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/filesystem/filesystemconnect"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Options are the parts of a Server that differ between a real sandbox and
// a test.
type Options struct {
	// PasswdPath and GroupPath are the user database (default /etc/passwd
	// and /etc/group).
	PasswdPath string
	GroupPath  string
	// Reaper waits for started processes; nil waits per pid (tests).
	Reaper *Reaper
	// SandboxWide makes the watchdog count every process but the agent
	// (true inside a sandbox). Otherwise only the sessions of commands the
	// server started count, which is what a test on a shared host needs.
	SandboxWide bool
	// DiskPath is the filesystem checked for the disk limit (default /).
	DiskPath string
	// DrainGrace is how long an exited command's end waits for its output
	// readers to reach EOF before it asks whether anything it wrote is
	// still unread (default 200 ms): the pipes stay open past the exit when
	// a background grandchild inherited them (`sleep 100 &`), and that must
	// not hold the command's result hostage.
	DrainGrace time.Duration
}

// Server is the agent's API: envd's process and filesystem services plus
// its plain HTTP endpoints and cella's extensions.
type Server struct {
	opts     Options
	users    userDB
	reaper   *Reaper
	procs    procTable
	watchers watcherTable
	watchdog watchdog
	logs     logStore     // per-process output logs (proclog.go)
	audit    auditFeed    // what the daemon's audit log follows (audit.go)
	docker   dockerEngine // the sandbox's Docker engine, if its template has one (docker.go)
	done     chan struct{}
	closeMu  sync.Once

	channelOnce sync.Once
	channel     http.Handler // channelHandler

	// mu guards cfg, which /init updates while requests read it.
	mu  sync.RWMutex
	cfg agentapi.Config
}

// NewServer makes a server for cfg. It starts no goroutines until a
// command runs.
func NewServer(cfg agentapi.Config, opts Options) *Server {
	if opts.PasswdPath == "" {
		opts.PasswdPath = "/etc/passwd"
	}
	if opts.GroupPath == "" {
		opts.GroupPath = "/etc/group"
	}
	if opts.DiskPath == "" {
		opts.DiskPath = "/"
	}
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "root"
	}
	s := &Server{
		opts:     opts,
		users:    newUserDB(opts.PasswdPath, opts.GroupPath),
		reaper:   opts.Reaper,
		procs:    procTable{byPid: map[int]*proc{}},
		watchers: watcherTable{byID: map[string]*dirWatcher{}},
		done:     make(chan struct{}),
		cfg:      cfg,
	}
	s.watchdog.s = s
	return s
}

// Close kills every running command and stops every watcher.
func (s *Server) Close() {
	s.closeMu.Do(func() { close(s.done) })
	for _, p := range s.procs.running() {
		_ = p.signal(unix.SIGKILL)
	}
	s.watchers.closeAll()
}

func (s *Server) config() agentapi.Config {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cfg
}

// globalEnv is the sandbox-wide environment: the config's env vars plus
// the E2B_* variables SDK code relies on.
func (s *Server) globalEnv() map[string]string {
	cfg := s.config()
	env := maps.Clone(cfg.EnvVars)
	if env == nil {
		env = map[string]string{}
	}
	env["E2B_SANDBOX"] = "true"
	env["E2B_SANDBOX_ID"] = cfg.SandboxID
	env["E2B_TEMPLATE_ID"] = cfg.TemplateID
	return env
}

// requestUser is the Linux user of an RPC: the Basic-auth user name (the
// password is ignored, as in envd), else the default user.
func (s *Server) requestUser(h http.Header) (*sandboxUser, error) {
	name := s.config().DefaultUser
	if auth := h.Get("Authorization"); auth != "" {
		user, ok := parseBasicUser(auth)
		if !ok {
			return nil, errdefs.Unauthenticated("invalid Authorization header: expected Basic auth with the user name")
		}
		if user != "" {
			name = user
		}
	}
	u, err := s.users.lookup(name)
	if err != nil {
		return nil, errdefs.Unauthenticated("invalid username: '%s'", name)
	}
	return u, nil
}

func parseBasicUser(auth string) (string, bool) {
	const prefix = "Basic "
	if len(auth) < len(prefix) || !strings.EqualFold(auth[:len(prefix)], prefix) {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(auth[len(prefix):]))
	if err != nil {
		return "", false
	}
	user, _, _ := strings.Cut(string(b), ":")
	return user, true
}

// fileUser is the user of a plain-HTTP file request: ?username=, else the
// Basic-auth user, else the default.
func (s *Server) fileUser(r *http.Request) (*sandboxUser, error) {
	name := r.URL.Query().Get("username")
	if name == "" {
		if auth := r.Header.Get("Authorization"); auth != "" {
			if u, ok := parseBasicUser(auth); ok {
				name = u
			}
		}
	}
	if name == "" {
		name = s.config().DefaultUser
	}
	u, err := s.users.lookup(name)
	if err != nil {
		return nil, fmt.Errorf("error looking up user '%s': %w", name, err)
	}
	return u, nil
}

// smallUncompressed sends messages under 1 KiB as they are, whatever the
// client accepts: connect-go compresses every message by default once a
// client accepts gzip (the SDKs and cella's client do), and the start and
// end events of an exec (tens of bytes each) then cost a pooled gzip writer
// and reader each way — 7.5 % of the agent's CPU per exec, profiled.
var smallUncompressed = connect.WithCompressMinBytes(1024)

// Handler is the agent's API as the daemon reaches it over the channel.
func (s *Server) Handler() http.Handler { return s.channelHandler() }

// channelHandler is Handler, made once: the warm-up of the process service
// (spawn.go) goes through the very handler the daemon's requests reach.
func (s *Server) channelHandler() http.Handler {
	s.channelOnce.Do(func() { s.channel = s.handler(true) })
	return s.channel
}

// LocalHandler is the same API for programs inside the sandbox
// (127.0.0.1:49983). It differs in one way: /init, which can replace the
// access token, needs the current token even when none is set, so only the
// daemon (which wrote the config) can call it.
func (s *Server) LocalHandler() http.Handler { return s.handler(false) }

func (s *Server) handler(trusted bool) http.Handler {
	mux := http.NewServeMux()
	path, h := processconnect.NewProcessHandler(processService{s}, smallUncompressed)
	mux.Handle(path, h)
	path, h = filesystemconnect.NewFilesystemHandler(filesystemService{s}, smallUncompressed)
	mux.Handle(path, h)

	mux.HandleFunc("GET "+agentapi.HealthPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+agentapi.EnvsPath, s.handleEnvs)
	mux.HandleFunc("POST "+agentapi.InitPath, func(w http.ResponseWriter, r *http.Request) { s.handleInit(w, r, trusted) })
	mux.HandleFunc("GET "+agentapi.FilesPath, s.handleDownload)
	mux.HandleFunc("POST "+agentapi.FilesPath, s.handleUpload)
	mux.HandleFunc("GET "+agentapi.TarPath, s.handleTarGet)
	mux.HandleFunc("POST "+agentapi.TarPath, s.handleTarPut)
	s.registerCellaExtras(mux)
	if trusted {
		// Only the daemon follows the audit feed, hands out the channel's
		// next credential (credential.go) and times spawns (spawn.go).
		mux.HandleFunc("GET "+agentapi.EventsPath, s.handleEvents)
		mux.HandleFunc("POST "+agentapi.ChannelTokenPath, s.handleChannelToken)
		mux.HandleFunc("POST "+agentapi.SpawnPath, s.handleSpawn)
	}
	return s.withAuth(mux)
}

func (s *Server) withAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := s.config().AccessToken
		if token != "" && !agentapi.AuthExempt(r.Method, r.URL.Path) && !tokenEqual(r.Header.Get(agentapi.AccessTokenHeader), token) {
			jsonError(w, http.StatusUnauthorized, errors.New(agentapi.UnauthorizedMessage))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func tokenEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// jsonError writes envd's plain-endpoint error body.
func jsonError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) handleEnvs(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.globalEnv())
}

// handleInit updates the running config, e.g. when a warm sandbox is handed
// to its owner. Once a token is set, only a caller that knows it may change
// anything; without one only the daemon (trusted) may.
func (s *Server) handleInit(w http.ResponseWriter, r *http.Request, trusted bool) {
	cur := s.config().AccessToken
	switch {
	case cur != "" && !tokenEqual(r.Header.Get(agentapi.AccessTokenHeader), cur):
		jsonError(w, http.StatusUnauthorized, errors.New(agentapi.UnauthorizedMessage))
		return
	case cur == "" && !trusted:
		jsonError(w, http.StatusUnauthorized, errors.New("init is only available to the sandbox's daemon"))
		return
	}
	var req agentapi.InitRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("parse init request: %w", err))
		return
	}
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		if _, err := s.users.lookup(*req.DefaultUser); err != nil {
			jsonError(w, http.StatusBadRequest, err)
			return
		}
	}
	s.mu.Lock()
	// A new identity is a sandbox restored from another's snapshot: the
	// events the feed holds are the other sandbox's, not to be followed
	// into this one's audit log.
	newIdentity := req.SandboxID != nil && *req.SandboxID != "" && *req.SandboxID != s.cfg.SandboxID
	if req.EnvVars != nil {
		env := maps.Clone(s.cfg.EnvVars)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, req.EnvVars)
		s.cfg.EnvVars = env
	}
	if req.AccessToken != nil {
		s.cfg.AccessToken = *req.AccessToken
	}
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		s.cfg.DefaultUser = *req.DefaultUser
	}
	if req.DefaultWorkdir != nil {
		s.cfg.DefaultWorkdir = *req.DefaultWorkdir
	}
	if req.SandboxID != nil && *req.SandboxID != "" {
		s.cfg.SandboxID = *req.SandboxID
	}
	s.mu.Unlock()
	if newIdentity {
		s.audit.forget()
	}
	w.Header().Set("X-Envd-Version", agentapi.Version)
	w.WriteHeader(http.StatusNoContent)
}
