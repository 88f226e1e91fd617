package api

import (
	"net/http"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/channel"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// agentTransport reaches the agent of one sandbox over its current channel
// (looked up per request, so a re-dialed agent is picked up) with the
// sandbox's envd access token.
type agentTransport struct {
	sb   *sandbox.Sandbox
	user string // Basic-auth user for the agent, "" = default
}

func (t agentTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	conn := waitConn(r.Context(), t.sb)
	if conn == nil {
		return nil, errdefs.Unavailable("the agent of sandbox %s is not connected", t.sb.ID)
	}
	r = r.Clone(r.Context())
	if t.sb.EnvdAccessToken != "" {
		r.Header.Set(agentapi.AccessTokenHeader, t.sb.EnvdAccessToken)
	}
	if t.user != "" {
		r.Header.Set("Authorization", agentapi.UserAuthorization(t.user))
	}
	return conn.Transport().RoundTrip(r)
}

// runningSandbox returns a running sandbox of the caller's or the error to
// answer.
func (s *Server) runningSandbox(r *http.Request, id string) (*sandbox.Sandbox, error) {
	sb, err := s.cfg.Manager.Lookup(caller(r), id)
	if err != nil {
		return nil, err
	}
	if st := sb.State(); st != sandbox.StateRunning {
		return nil, errdefs.Conflict("sandbox %s is %s, not running", id, st)
	}
	return sb, nil
}

func agentHTTP(sb *sandbox.Sandbox, user string) *http.Client {
	return &http.Client{Transport: agentTransport{sb: sb, user: user}}
}

func agentProcessClient(sb *sandbox.Sandbox, user string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(agentHTTP(sb, user), channel.AgentURL)
}
