package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agent/codeinterp"
)

// CodeInterpreterAddr is where the code interpreter listens inside the
// sandbox; the daemon reaches it like any port (E2b-Sandbox-Port: 49999).
var CodeInterpreterAddr = "127.0.0.1:" + strconv.Itoa(codeinterp.Port)

// startCodeInterpreter serves the code interpreter until ctx ends. It is
// called only for templates that ask for it, so other sandboxes pay nothing
// (no listener, no goroutine, no process). The returned channel closes when
// the server has stopped and killed its interpreters; no interpreter runs
// before the caller's Warm.
func startCodeInterpreter(ctx context.Context, s *Server) (*codeinterp.Server, <-chan struct{}, error) {
	ln, err := net.Listen("tcp", CodeInterpreterAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("code interpreter: listen on %s: %w", CodeInterpreterAddr, err)
	}
	ci := codeinterp.New(s.codeInterpreterConfig())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ci.Serve(ctx, ln); err != nil {
			slog.Error("code interpreter stopped", "err", err)
		}
	}()
	slog.Info("code interpreter listening", "addr", CodeInterpreterAddr)
	return ci, done, nil
}

// codeInterpreterConfig wires the server to the agent: the envd token, the
// environment commands get, and interpreters started like commands (the
// default user, the PID-1 reaper, Landlock under the namespaces runtime).
func (s *Server) codeInterpreterConfig() codeinterp.Config {
	workdir := s.config().DefaultWorkdir
	if workdir == "" {
		if u, err := s.users.lookup(s.config().DefaultUser); err == nil {
			workdir = u.Home
		}
	}
	return codeinterp.Config{
		AccessToken: func() string { return s.config().AccessToken },
		Env:         s.codeInterpreterEnv,
		Workdir:     workdir,
		Spawn:       s.spawnInterpreter,
	}
}

// codeInterpreterEnv is a new interpreter's environment, built from scratch
// like a command's (resolveStart): the agent's own never leaks in.
func (s *Server) codeInterpreterEnv() []string {
	env := newEnvList()
	env.set("PATH", defaultPath)
	if u, err := s.users.lookup(s.config().DefaultUser); err == nil {
		env.set("HOME", u.Home)
		env.set("USER", u.Name)
		env.set("LOGNAME", u.Name)
	}
	for k, v := range s.globalEnv() {
		env.set(k, v)
	}
	return env.list()
}

func (s *Server) spawnInterpreter(p codeinterp.Proc) (int, <-chan unix.WaitStatus, error) {
	u, err := s.users.lookup(s.config().DefaultUser)
	if err != nil {
		return 0, nil, fmt.Errorf("interpreter user: %w", err)
	}
	fds := make([]uintptr, len(p.Files))
	for i, f := range p.Files {
		fds[i] = f.Fd()
	}
	attr := &syscall.ProcAttr{Dir: p.Dir, Env: p.Env, Files: fds, Sys: s.sysProcAttr()} // limits.go
	pid, wait, err := s.spawn(u, p.Argv[0], p.Argv, attr, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("fork interpreter: %w", err)
	}
	adjustOOM(pid)
	return pid, wait, nil
}
