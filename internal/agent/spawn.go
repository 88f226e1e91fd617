package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
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
	if req.ThroughConnect {
		if err := s.startThroughConnect(r.Context(), r.Header); err != nil {
			jsonError(w, http.StatusInternalServerError, fmt.Errorf("spawn through the process service: %w", err))
			return
		}
	}
	writeJSON(w, http.StatusOK, res)
}

// quietStart marks the context of a Start the agent makes itself
// (startThroughConnect): only code of this package can set it, so no
// request from outside can start a command that is neither listed nor
// audited.
type quietStart struct{}

func isQuietStart(ctx context.Context) bool { return ctx.Value(quietStart{}) != nil }

// startThroughConnect starts the exec shape once through the agent's own
// envd process service, in memory, in each of Connect's codecs, as the
// caller of the spawn request (its access token and user) and quietly.
// Measured under the namespaces runtime: with only the spawns, a pooled
// sandbox's first exec took 1.21-1.40× its second; with this, 1.13-1.14×.
func (s *Server) startThroughConnect(ctx context.Context, h http.Header) error {
	noStdin := false
	msg := &process.StartRequest{Process: &process.ProcessConfig{Cmd: bashPath, Args: []string{"-l", "-c", "true"}}, Stdin: &noStdin}
	ctx = context.WithValue(ctx, quietStart{}, true)
	handler := s.channelHandler()
	for _, codec := range []struct {
		contentType string
		marshal     func(proto.Message) ([]byte, error)
		unmarshal   func([]byte, proto.Message) error
	}{
		{"application/connect+proto", proto.Marshal, proto.Unmarshal},
		{"application/connect+json", protojson.Marshal, protojson.Unmarshal},
	} {
		body, err := codec.marshal(msg)
		if err != nil {
			return err
		}
		// A Connect envelope: flags (0), the length, the message.
		env := append([]byte{0, 0, 0, 0, 0}, body...)
		binary.BigEndian.PutUint32(env[1:5], uint32(len(body)))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, processconnect.ProcessStartProcedure, bytes.NewReader(env))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", codec.contentType)
		req.Header.Set("Connect-Protocol-Version", "1")
		// Bounded as a client's exec is: a login shell that hangs is
		// killed with its stream, not left running unlisted.
		req.Header.Set("Connect-Timeout-Ms", strconv.FormatInt(warmUpTimeout.Milliseconds(), 10))
		for _, k := range []string{agentapi.AccessTokenHeader, "Authorization"} {
			if v := h.Get(k); v != "" {
				req.Header.Set(k, v)
			}
		}
		rec := &memoryResponse{header: http.Header{}}
		handler.ServeHTTP(rec, req)
		if rec.status != http.StatusOK {
			return fmt.Errorf("%s: status %d: %.200q", codec.contentType, rec.status, rec.body.Bytes())
		}
		if err := endedWithZero(rec.body.Bytes(), codec.unmarshal); err != nil {
			return fmt.Errorf("%s: %w", codec.contentType, err)
		}
	}
	return nil
}

// endedWithZero reads a Start answer's envelopes and fails unless one is an
// end event with exit code 0 and the stream ends without an error.
func endedWithZero(b []byte, unmarshal func([]byte, proto.Message) error) error {
	ended := false
	for len(b) >= 5 {
		flags, n := b[0], binary.BigEndian.Uint32(b[1:5])
		if uint64(len(b)-5) < uint64(n) {
			return errors.New("a truncated envelope")
		}
		data := b[5 : 5+n]
		b = b[5+n:]
		if flags&0x02 != 0 { // the end of the stream: {} or {"error": ...}
			if bytes.Contains(data, []byte(`"error"`)) {
				return fmt.Errorf("the stream ended with %s", data)
			}
			continue
		}
		var msg process.StartResponse
		if err := unmarshal(data, &msg); err != nil {
			return err
		}
		if end := msg.GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 || !end.GetExited() {
				return fmt.Errorf("the command ended %v", end)
			}
			ended = true
		}
	}
	if !ended {
		return errors.New("no end event")
	}
	return nil
}

// warmUpTimeout bounds each of the warm-up's starts.
const warmUpTimeout = time.Minute

// memoryResponse keeps an answer in memory.
type memoryResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (m *memoryResponse) Header() http.Header { return m.header }
func (m *memoryResponse) WriteHeader(code int) {
	if m.status == 0 {
		m.status = code
	}
}
func (m *memoryResponse) Write(b []byte) (int, error) {
	m.WriteHeader(http.StatusOK)
	return m.body.Write(b)
}
func (m *memoryResponse) Flush() {}

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
