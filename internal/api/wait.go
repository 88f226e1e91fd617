package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

const maxWaitTimeout = time.Hour

// parseWaitTimeout reads the wait's timeout: seconds or a Go duration
// string, more than 0 and at most maxWaitTimeout.
func parseWaitTimeout(raw json.RawMessage) (time.Duration, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 30 * time.Second, nil
	}
	var d time.Duration
	var secs float64
	var str string
	if err := json.Unmarshal(raw, &secs); err == nil {
		if d, err = units("timeout", secs, time.Second, "seconds", maxWaitTimeout); err != nil { // bounds.go
			return 0, err
		}
	} else if err := json.Unmarshal(raw, &str); err == nil {
		if d, err = time.ParseDuration(str); err != nil || d < 0 || d > maxWaitTimeout {
			return 0, errdefs.InvalidArgument("timeout must be a duration up to %v like \"30s\" (got %q)", maxWaitTimeout, str)
		}
	} else {
		return 0, errdefs.InvalidArgument("timeout must be seconds (a number) or a duration string like \"30s\", got %s", raw)
	}
	if d == 0 {
		return 0, errdefs.InvalidArgument("timeout must be positive (got %s)", raw)
	}
	return d, nil
}

// waitSandbox blocks until a port listens or a process prints a matching
// line; the agent inside the sandbox does the watching (GET /cella/wait).
// 200 {"ready":true,...}; 408 on timeout; 409 when the process ended first.
func (s *Server) waitSandbox(w http.ResponseWriter, r *http.Request) {
	q, err := parseWait(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.forwardAgent(w, r, agentapi.WaitPath, q)
}

// processLogs serves GET /sandboxes/{id}/processes/{pid}/logs: the retained
// output of a process (?format=json|text, ?stream=stdout|stderr|pty).
func (s *Server) processLogs(w http.ResponseWriter, r *http.Request) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		s.writeErr(w, r, errdefs.InvalidArgument("invalid pid %q", r.PathValue("pid")))
		return
	}
	q := url.Values{}
	for _, k := range []string{"format", "stream"} {
		if v := r.URL.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	s.forwardAgent(w, r, agentapi.ProcessLogsPath(pid), q)
}

// forwardAgent makes a GET to the sandbox's agent and copies the answer.
func (s *Server) forwardAgent(w http.ResponseWriter, r *http.Request, path string, q url.Values) {
	sb, err := s.runningSandbox(r, r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	h := http.Header{}
	if a := r.Header.Get("Accept"); a != "" {
		h.Set("Accept", a)
	}
	resp, err := sb.Agent().Get(r.Context(), path, q, h)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		edge.BadGateway(w, sb.ID, fmt.Sprintf("the agent of sandbox %s did not answer: %v", sb.ID, err))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound && resp.Header.Get("Content-Type") == "text/plain; charset=utf-8" {
		// An agent from before this feature answers the mux's plain 404.
		s.writeErr(w, r, errdefs.NotImplemented("the agent of sandbox %s is older than this daemon and has no %s endpoint", sb.ID, path))
		return
	}
	for _, h := range []string{"Content-Type"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
