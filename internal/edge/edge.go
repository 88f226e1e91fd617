// Package edge is the sandbox traffic proxy, E2B's "edge": it takes the
// requests meant for a port of a sandbox (routed by E2B's headers or by the
// Host), checks the sandbox's credential, and passes them on into the
// sandbox with full duplex streaming and WebSocket upgrades; it also keeps
// the interactive shells (PTY sessions with replay) that clients attach to
// over WebSockets.
//
// It knows nothing of the REST API, of keys or of how sandboxes live: it
// reaches them through a Router and the Sandbox interface, which
// internal/sandbox implements for one daemon's sandboxes (a gateway in front
// of several daemons can implement them with remote nodes). Everything it
// answers itself is in E2B's shapes.
package edge

import (
	"context"
	"net/http"
	"time"

	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
)

// Router finds the sandbox of a request.
type Router interface {
	// Route returns sandbox id for traffic: whoever owns it, since the
	// credential decides (admit, called with the sandbox before anything
	// else happens to it, returns the refusal). A sandbox paused with
	// autoResume is resumed, after admit; one paused without is a
	// *PausedError, and so is a failed resume. Any other error (unknown,
	// dead, not running) reads as "not found".
	Route(ctx context.Context, id string, admit func(Sandbox) error) (Sandbox, error)
	// Signed returns the ID of the sandbox whose envd access token signs
	// a request (signs holds for it), of any owner: a signed file URL
	// carries no sandbox ID (signed.go). Sandboxes without a token never
	// match.
	Signed(signs func(envdAccessToken string) bool) (id string, ok bool)
}

// Sandbox is what the edge needs of a sandbox.
type Sandbox interface {
	ID() string
	// EnvdAccessToken is what requests to the agent's port must carry
	// ("" = none); TrafficAccessToken what requests to other ports must
	// carry ("" = public traffic allowed).
	EnvdAccessToken() string
	TrafficAccessToken() string
	// EnvdTokenOptional is E2B's secure: false: requests to the agent's
	// port are let in without the envd token, which the edge then adds
	// (the agent still requires it of programs inside the sandbox).
	EnvdTokenOptional() bool
	// RequestHost is the Host header requests to port (never the
	// agent's) are given inside the sandbox: network.maskRequestHost
	// with its port filled in; "" keeps the request's own.
	RequestHost(port int) string
	// BeginActivity marks a request in progress for the sandbox's idle
	// clock; the returned func ends it.
	BeginActivity() (end func())
	// Link returns the way into the sandbox, waiting a moment for an agent
	// that is re-dialing; an error when there is none.
	Link(ctx context.Context) (Link, error)
	// Process is envd's process service of the sandbox's agent, as user.
	Process(user string) processconnect.ProcessClient
	// Ended reports a sandbox that will not run again (its shells end).
	Ended() (reason string, ended bool)
}

// Link is a live connection into a sandbox.
type Link interface {
	// RoundTrip sends a request to the port of its URL inside the
	// sandbox (the host is only a name).
	http.RoundTripper
	// Closed reports whether the link ended (the sandbox is gone).
	Closed() bool
}

// PausedError is a sandbox that is paused and stays paused: without
// autoResume (Resume nil), or because its resume failed.
type PausedError struct{ Resume error }

func (e *PausedError) Error() string {
	if e.Resume == nil {
		return "The sandbox is paused (resume it with connect)"
	}
	return "The sandbox is paused and could not be resumed: " + e.Resume.Error()
}

func (e *PausedError) Unwrap() error { return e.Resume }

// Config configures a Proxy.
type Config struct {
	Router Router
	// Domain is the domain of <port>-<id>.<domain> hosts ("" = routing by
	// headers only).
	Domain string
	// ExecStarted, when set, learns how long each envd process Start
	// through the proxy took to its start event (execstart.go).
	ExecStarted func(sb Sandbox, took time.Duration)
}

// Proxy routes sandbox traffic.
type Proxy struct {
	router      Router
	domain      string
	execStarted func(Sandbox, time.Duration)
}

// New makes a proxy.
func New(cfg Config) *Proxy {
	return &Proxy{router: cfg.Router, domain: cfg.Domain, execStarted: cfg.ExecStarted}
}

// Handle serves r if it is sandbox traffic (E2B's routing: route.go) and
// reports whether it was; any other request is the caller's.
func (p *Proxy) Handle(w http.ResponseWriter, r *http.Request) bool {
	t, ok, err := target(r, p.domain)
	if !ok {
		if t, ok = p.signedTarget(r); !ok {
			return false
		}
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Code: http.StatusBadRequest, Message: err.Error()})
		return true
	}
	p.serve(w, r, t)
	return true
}
