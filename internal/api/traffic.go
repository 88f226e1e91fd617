package api

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"net/http"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// hdrTrafficToken is E2B's header for a sandbox's non-envd ports when it
// was created with network.allowPublicTraffic: false.
const hdrTrafficToken = "E2b-Traffic-Access-Token"

// trafficTokenFor returns a new traffic token when the create request's
// network object sets allowPublicTraffic to false, else "".
func trafficTokenFor(network json.RawMessage) string {
	if len(network) == 0 {
		return ""
	}
	var n struct {
		AllowPublicTraffic *bool `json:"allowPublicTraffic"`
	}
	if json.Unmarshal(network, &n) != nil || n.AllowPublicTraffic == nil || *n.AllowPublicTraffic {
		return ""
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// trafficAllowed checks the credential of a request to a sandbox's port
// (tenant.Traffic): the envd access token for the agent's port, checked here
// before the agent checks it again, so that nothing reaches a sandbox's
// agent — genuine or not — without its owner's token; the traffic token for
// the others, when the sandbox has one. It answers the refusal itself.
func trafficAllowed(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port int) bool {
	if port == agentapi.Port {
		return envdAllowed(w, r, sb)
	}
	want := sb.Options.TrafficAccessToken
	if want == "" {
		return true
	}
	got := r.Header.Get(hdrTrafficToken)
	if got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 {
		return true
	}
	msg := "this sandbox does not allow public traffic: send the sandbox's trafficAccessToken in the e2b-traffic-access-token header"
	if got != "" {
		msg = "invalid e2b-traffic-access-token for this sandbox"
	}
	writeJSON(w, http.StatusForbidden, sandboxGone{SandboxID: sb.ID, Message: msg, Code: http.StatusForbidden})
	return false
}

// envdAllowed is envd's WithAuthorization at the daemon's edge: every agent
// request carries the sandbox's X-Access-Token, except the health check and
// /files requests authorized by a URL signature (uploadUrl/downloadUrl),
// which the agent verifies itself. A refusal reads as the agent's.
func envdAllowed(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox) bool {
	if sb.EnvdAccessToken == "" {
		return true
	}
	got := r.Header.Get(agentapi.AccessTokenHeader)
	switch {
	case got != "":
		if subtle.ConstantTimeCompare([]byte(got), []byte(sb.EnvdAccessToken)) == 1 {
			return true
		}
	case r.Method == http.MethodGet && r.URL.Path == agentapi.HealthPath:
		return true
	case (r.Method == http.MethodGet || r.Method == http.MethodPost) && r.URL.Path == agentapi.FilesPath && r.URL.Query().Get("signature") != "":
		return true
	}
	writeJSON(w, http.StatusUnauthorized, errorBody{Code: http.StatusUnauthorized,
		Message: agentapi.UnauthorizedMessage})
	return false
}

// trafficTokenPtr is the Sandbox response's trafficAccessToken (null when
// public traffic is allowed).
func trafficTokenPtr(o sandbox.Options) *string {
	if o.TrafficAccessToken == "" {
		return nil
	}
	t := o.TrafficAccessToken
	return &t
}
