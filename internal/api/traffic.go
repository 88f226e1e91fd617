package api

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"net/http"

	"github.com/cella-sandbox/cella/internal/channel"
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

// trafficAllowed checks the traffic token on requests to a sandbox's own
// ports (the agent's port is guarded by the envd access token instead).
// It answers 403 itself when the token is missing or wrong.
func trafficAllowed(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port int) bool {
	want := sb.Options.TrafficAccessToken
	if want == "" || port == channel.AgentPort {
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

// trafficTokenPtr is the Sandbox response's trafficAccessToken (null when
// public traffic is allowed).
func trafficTokenPtr(o sandbox.Options) *string {
	if o.TrafficAccessToken == "" {
		return nil
	}
	t := o.TrafficAccessToken
	return &t
}
