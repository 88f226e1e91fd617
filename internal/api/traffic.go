package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"regexp"
	"strings"

	"github.com/cella-sandbox/cella/internal/errdefs"
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

// envdTokenPtr is the Sandbox response's envdAccessToken: null for a
// sandbox created with secure: false, as E2B answers; the SDKs then send
// no X-Access-Token and sign no URLs, and the edge lets requests to the
// agent's port in without one (the sandbox ID is then their only
// credential: README, Security model).
func envdTokenPtr(in sandbox.Info) *string {
	if in.Options.Insecure || in.EnvdAccessToken == "" {
		return nil
	}
	t := in.EnvdAccessToken
	return &t
}

// maskHostRe is an ASCII host name or address (E2B refuses the others).
var maskHostRe = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)$`)

// maskRequestHostFor reads network.maskRequestHost: the Host header that
// requests proxied to the sandbox's ports (not the agent's) carry instead
// of the one they came with, ${PORT} replaced by the port, the original
// in X-Forwarded-Host (E2B's orchestrator proxy). "" when unset.
func maskRequestHostFor(network json.RawMessage) (string, error) {
	if len(network) == 0 {
		return "", nil
	}
	var n struct {
		MaskRequestHost *string `json:"maskRequestHost"`
	}
	if json.Unmarshal(network, &n) != nil || n.MaskRequestHost == nil || *n.MaskRequestHost == "" {
		return "", nil
	}
	mask := *n.MaskRequestHost
	probe := strings.ReplaceAll(mask, sandbox.MaskPortPlaceholder, "1")
	host := probe
	if h, port, err := net.SplitHostPort(probe); err == nil {
		if port == "" || strings.Trim(port, "0123456789") != "" {
			return "", errdefs.InvalidArgument("network.maskRequestHost %q: the port must be a number or %s", mask, sandbox.MaskPortPlaceholder)
		}
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	if !maskHostRe.MatchString(host) {
		return "", errdefs.InvalidArgument("network.maskRequestHost %q is not a valid host: use ASCII letters, digits, '.', '-' and %s, with an optional :port", mask, sandbox.MaskPortPlaceholder)
	}
	return mask, nil
}
