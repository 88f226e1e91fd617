package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// handleSpawn times the agent's own starts of an exec's command shape
// (agentapi.SpawnPath): the bare fork/exec/wait is the floor an exec's
// round trip is judged by, the same command through the exec path shows
// what that path adds, and a warm pool runs it once so that a handed-out
// sandbox's first exec finds bash, the login scripts and the agent's exec
// path already paged in. Only the daemon reaches it (the channel's
// handler, behind the access token); the command is fixed, so it runs
// nothing an exec could not.
func (s *Server) handleSpawn(w http.ResponseWriter, r *http.Request) {
	var req agentapi.SpawnRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10)).Decode(&req); err != nil {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("parse spawn request: %w", err))
		return
	}
	if req.Count < 1 || req.Count > agentapi.MaxSpawnCount {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("count must be between 1 and %d (got %d)", agentapi.MaxSpawnCount, req.Count))
		return
	}
	u, err := s.requestUser(r.Header)
	if err != nil {
		jsonError(w, errdefs.HTTPStatus(err), err)
		return
	}
	noStdin := false
	spec, err := s.resolveStart(u, &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: bashPath, Args: []string{"-l", "-c", "true"}},
		Stdin:   &noStdin,
	}, 0)
	if err != nil {
		jsonError(w, errdefs.HTTPStatus(err), err)
		return
	}
	spec.quiet = true
	var res agentapi.SpawnResult
	for range req.Count {
		d, err := s.spawnBare(spec)
		if err != nil {
			jsonError(w, http.StatusInternalServerError, fmt.Errorf("bare spawn: %w", err))
			return
		}
		res.FloorNs = append(res.FloorNs, d.Nanoseconds())
		if d, err = s.spawnThroughPath(r.Context(), spec); err != nil {
			jsonError(w, errdefs.HTTPStatus(err), fmt.Errorf("spawn through the exec path: %w", err))
			return
		}
		res.PathNs = append(res.PathNs, d.Nanoseconds())
	}
	writeJSON(w, http.StatusOK, res)
}

// spawnBare forks, execs and waits for spec's command with its user,
// environment and working directory, and nothing else: no pipes (its
// stdio is /dev/null), no Landlock ruleset, no commands cgroup.
func (s *Server) spawnBare(spec *startSpec) (time.Duration, error) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	fd := null.Fd()
	attr := &syscall.ProcAttr{Dir: spec.cwd, Env: spec.env, Files: []uintptr{fd, fd, fd},
		Sys: &syscall.SysProcAttr{Setsid: true, Credential: credentialOf(spec.user)}}
	start := time.Now()
	_, wait, err := s.reaper.start(func() (int, error) { return syscall.ForkExec(spec.argv0, spec.argv, attr) })
	if err != nil {
		return 0, err
	}
	ws := <-wait
	took := time.Since(start)
	if !ws.Exited() || ws.ExitStatus() != 0 {
		return 0, fmt.Errorf("%s ended with status %v", spec.argv0, ws)
	}
	return took, nil
}

// spawnThroughPath starts spec's command as an exec does (startProcess)
// and waits for its end event.
func (s *Server) spawnThroughPath(ctx context.Context, spec *startSpec) (time.Duration, error) {
	start := time.Now()
	p, sub, err := s.startProcess(spec)
	if err != nil {
		return 0, err
	}
	for {
		if _, closed := sub.take(); closed {
			break
		}
		select {
		case <-sub.wake:
		case <-ctx.Done():
			p.kill(s, "the spawn request ended")
			return 0, ctx.Err()
		}
	}
	took := time.Since(start)
	p.mu.Lock()
	end := p.end
	p.mu.Unlock()
	if end == nil || end.ExitCode != 0 {
		return 0, errors.New("the command did not exit with 0: " + end.GetStatus())
	}
	return took, nil
}
