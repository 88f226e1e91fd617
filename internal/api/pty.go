package api

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Interactive shells over WebSocket: GET /sandboxes/{id}/pty. The route
// authenticates the caller (an API key, which browsers pass as ?key= or a
// subprotocol: wsKey), finds the sandbox as the caller's and reads the
// query; the shells themselves, their replay and the WebSocket protocol are
// internal/edge's (edge.Shells).
//
// Query: session=ID re-attaches (404 if unknown); offset=O replays only what
// came after stream offset O (the offset of a previous session message plus
// the bytes received since); cols, rows size a new shell (default 80x24);
// user runs a new shell as that user.

// ptyKeyProtocolPrefix carries the API key in Sec-WebSocket-Protocol for
// browsers, which cannot set headers on a WebSocket.
const ptyKeyProtocolPrefix = "cella-key."

func (s *Server) interactRoutes(auth func(http.HandlerFunc) http.Handler) {
	s.mux.Handle("GET /sandboxes/{id}/pty", s.wsKey(auth(s.ptyHandler)))
	s.mux.Handle("POST /sandboxes/{id}/wait", auth(s.waitSandbox))
	s.mux.Handle("GET /sandboxes/{id}/processes/{pid}/logs", auth(s.processLogs))
}

// wsKey lets browsers, which cannot set headers on a WebSocket, pass the API
// key as ?key=KEY or as a subprotocol "cella-key.KEY".
func (s *Server) wsKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") == "" && r.Header.Get("Authorization") == "" {
			key := r.URL.Query().Get("key")
			if key == "" {
				for _, p := range edge.WebSocketProtocols(r) {
					if strings.HasPrefix(p, ptyKeyProtocolPrefix) {
						key = strings.TrimPrefix(p, ptyKeyProtocolPrefix)
					}
				}
			}
			if key != "" {
				r = r.Clone(r.Context())
				r.Header.Set("X-API-Key", key)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// ptySize reads the cols or rows query parameter: 1 to edge.MaxPTYSize.
func ptySize(r *http.Request, name string, def uint32) (uint32, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n == 0 || n > edge.MaxPTYSize {
		return 0, errdefs.InvalidArgument("%s must be a number from 1 to %d (got %q)", name, edge.MaxPTYSize, v)
	}
	return uint32(n), nil
}

func (s *Server) ptyHandler(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, err := s.runningSandbox(r, id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	q := r.URL.Query()
	offset, cols, rows, err := parsePTYQuery(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// Only a WebSocket handshake gets a shell: a plain GET must not start
	// one that nobody can reach or end.
	if !isWebSocketUpgrade(r) {
		s.writeErr(w, r, errdefs.InvalidArgument("GET /sandboxes/%s/pty is a WebSocket: send the handshake (Connection: Upgrade, Upgrade: websocket)", id))
		return
	}
	var ss *edge.Shell
	if sid := q.Get("session"); sid != "" {
		if ss = s.pty.Get(id, sid); ss == nil {
			s.writeErr(w, r, errdefs.NotFound("no shell session %s in sandbox %s (it ended, or the daemon restarted)", sid, id))
			return
		}
	} else {
		if ss, err = s.pty.Start(r.Context(), sb.Traffic(), q.Get("user"), cols, rows); err != nil {
			s.writeErr(w, r, fmt.Errorf("start a shell in sandbox %s: %w", id, err))
			return
		}
	}
	ss.Serve(w, r, offset)
}

// isWebSocketUpgrade reports whether r asks for a WebSocket (RFC 6455 §4.1:
// a GET with Upgrade: websocket and Connection naming upgrade).
func isWebSocketUpgrade(r *http.Request) bool {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return false
	}
	for _, v := range r.Header.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}
