package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"

	"github.com/cella-sandbox/cella/internal/sandbox"
)

// The traffic token: a create request whose network says
// allowPublicTraffic: false gets one, and the sandbox traffic proxy
// (internal/edge) lets no request reach a port of the sandbox but the
// agent's without it (e2b-traffic-access-token).

// trafficTokenFor returns a new traffic token when the create request's
// network object sets allowPublicTraffic to false, else "".
func trafficTokenFor(network json.RawMessage) string {
	if len(network) == 0 {
		return ""
	}
	// One field of the raw network (apiwire.SandboxNetworkConfig), read
	// leniently: a network the egress parser refuses is its error to give.
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

// trafficTokenPtr is the Sandbox response's trafficAccessToken (null when
// public traffic is allowed).
func trafficTokenPtr(o sandbox.Options) *string {
	if o.TrafficAccessToken == "" {
		return nil
	}
	t := o.TrafficAccessToken
	return &t
}
