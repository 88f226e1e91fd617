package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/channel"
)

// The agent's channel credential: the token its hello carries. The first
// one comes from the config file, which the daemon removes from the
// sandbox's view once the agent has said hello with it; after every hello
// the daemon sends the next one over the established channel
// (POST /cella/channel-token), and the agent keeps it in its memory only,
// which the sandbox's root cannot read (Main makes the agent undumpable).
// So no process inside a sandbox ever holds a credential it could dial
// the daemon with.

// hello is the agent's next hello to the daemon.
func (s *Server) hello() channel.Hello {
	cfg := s.config()
	return channel.Hello{SandboxID: cfg.SandboxID, Token: cfg.ChannelToken, Version: agentapi.Version, PID: os.Getpid()}
}

// handleChannelToken replaces the credential of the agent's next hello.
func (s *Server) handleChannelToken(w http.ResponseWriter, r *http.Request) {
	var req agentapi.ChannelTokenRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("parse channel token request: %w", err))
		return
	}
	if len(req.Token) < agentapi.MinChannelToken {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("token: want at least %d characters", agentapi.MinChannelToken))
		return
	}
	s.mu.Lock()
	s.cfg.ChannelToken = req.Token
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
