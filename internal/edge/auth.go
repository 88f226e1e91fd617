package edge

import (
	"crypto/subtle"
	"net/http"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// hdrTrafficToken is E2B's header for a sandbox's non-envd ports when it
// was created with network.allowPublicTraffic: false.
const hdrTrafficToken = "E2b-Traffic-Access-Token"

// refusal is a request the edge answers itself: its credential is missing
// or wrong.
type refusal struct {
	status int
	body   any
}

func (r *refusal) Error() string { return http.StatusText(r.status) }

// admit checks the credential of a request to a port of sb (it was found
// for any owner: tenant.Traffic): the envd access token for the agent's
// port, checked here before the agent checks it again, so that nothing
// reaches a sandbox's agent — genuine or not — without its owner's token;
// the traffic token for the others, when the sandbox has one.
func admit(r *http.Request, sb Sandbox, port int) error {
	if port == agentapi.Port {
		if agentapi.DaemonOnly(r.Method, r.URL.Path) {
			return &refusal{http.StatusNotFound, errorBody{Code: http.StatusNotFound, Message: "not found: " + r.URL.Path + " is the daemon's own"}}
		}
		return admitEnvd(r, sb)
	}
	want := sb.TrafficAccessToken()
	if want == "" {
		return nil
	}
	got := r.Header.Get(hdrTrafficToken)
	if got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 {
		return nil
	}
	msg := "this sandbox does not allow public traffic: send the sandbox's trafficAccessToken in the e2b-traffic-access-token header"
	if got != "" {
		msg = "invalid e2b-traffic-access-token for this sandbox"
	}
	return &refusal{http.StatusForbidden, sandboxError{SandboxID: sb.ID(), Message: msg, Code: http.StatusForbidden}}
}

// admitEnvd is envd's WithAuthorization at the daemon's edge: every agent
// request carries the sandbox's access token, except the health check and
// /files requests authorized by a URL signature (uploadUrl/downloadUrl),
// which the agent verifies itself. Narrower than agentapi.AuthExempt on
// purpose: /init checks its callers itself inside the agent, and from
// outside it needs the token first (the channel's credential never passes
// the edge: agentapi.DaemonOnly).
// A refusal reads as the agent's.
func admitEnvd(r *http.Request, sb Sandbox) error {
	want := sb.EnvdAccessToken()
	if want == "" {
		return nil
	}
	got := r.Header.Get(agentapi.AccessTokenHeader)
	if got == "" && sb.EnvdTokenOptional() {
		// secure: false. The request stands for the sandbox's owner, who
		// chose to let anyone with its ID in; the agent gets the token.
		r.Header.Set(agentapi.AccessTokenHeader, want)
		return nil
	}
	switch {
	case got != "":
		if subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 {
			return nil
		}
	case r.Method == http.MethodGet && r.URL.Path == agentapi.HealthPath:
		return nil
	case (r.Method == http.MethodGet || r.Method == http.MethodPost) && r.URL.Path == agentapi.FilesPath && r.URL.Query().Get("signature") != "":
		return nil
	}
	return &refusal{http.StatusUnauthorized, errorBody{Code: http.StatusUnauthorized, Message: agentapi.UnauthorizedMessage}}
}
