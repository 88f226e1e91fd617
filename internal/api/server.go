// Package api is cella's HTTP surface: the control-plane REST API (a superset
// of E2B's) on the listener it shares with the sandbox traffic proxy
// (internal/edge), to which ServeHTTP hands sandbox traffic.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/builds"
	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/events"
	"github.com/cella-sandbox/cella/internal/mcpserver"
	"github.com/cella-sandbox/cella/internal/metrics"
	"github.com/cella-sandbox/cella/internal/quota"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
	"github.com/cella-sandbox/cella/internal/ui"
)

// Config configures the API server. Its dependencies are the narrow
// interfaces of deps.go; the daemon passes the real types.
type Config struct {
	// Manager is the sandbox core (sandbox.Manager).
	Manager Sandboxes
	// Pools are the warm pools (sandbox.Manager too).
	Pools Pools
	// Store holds the API keys (store.Store).
	Store     Keys
	Templates Templates
	// Domain is returned to clients for <port>-<id>.<domain> hosts.
	Domain string
	// MCPMaxCalls is the tool-call budget of each /mcp session (0 = none).
	MCPMaxCalls int64
	Log         *slog.Logger
	// Volumes serves /volumes (volumes.go).
	Volumes Volumes
	// Secrets serves /secrets (secrets.go); nil answers 501.
	Secrets Secrets
	// Audit serves /sandboxes/{id}/logs (audit.go); nil answers 501.
	Audit AuditLog
	// EgressCeiling is the operator's egress ceiling (network.go); nil
	// means sandboxes run with no network at all.
	EgressCeiling *egress.Policy
	// Egress counts the proxy's decisions for /metrics (nil: not shown).
	Egress *EgressCounters
	// Metrics are the daemon's instruments, served at /metrics with the
	// API's own collectors (nil: a registry of the API's alone).
	Metrics *metrics.Metrics
	// AccessLog receives one line per API request (accesslog.go; nil: none).
	AccessLog *slog.Logger
	// Builds serves E2B's template build API (templatebuilds.go); nil
	// answers 501.
	Builds *builds.Service
	// Events serves /events (events.go); nil answers 501.
	Events *events.Service
	// GatewayKey, on a cluster node, is the key of the gateways'
	// assertions (gateway.go); nil: assertions are refused.
	GatewayKey []byte
}

// Server serves the REST API and the sandbox proxy on one listener.
type Server struct {
	cfg Config
	log *slog.Logger
	mux *routeMux
	// edge is the sandbox traffic proxy; pty the interactive shells
	// (pty.go), both internal/edge's.
	edge *edge.Proxy
	pty  edge.Shells
	// self is the API's in-process client (selfclient.go), MCP's way in.
	self *selfClient
	// buckets hold keys to their rates (quotas.go).
	buckets quota.Buckets
	// creates counts creates per minute for GET /overview (overview.go).
	creates createCounts
}

// New builds the server's routes.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Metrics == nil {
		rt := ""
		if cfg.Manager != nil {
			rt = cfg.Manager.RuntimeName()
		}
		cfg.Metrics = metrics.New(rt, nil)
	}
	s := &Server{cfg: cfg, log: cfg.Log, mux: newRouteMux()}
	var router edge.Router
	if cfg.Manager != nil {
		router = cfg.Manager.TrafficRouter()
	}
	s.edge = edge.New(edge.Config{Router: router, Domain: cfg.Domain, ExecStarted: s.execStarted})
	s.self = newSelfClient(s)
	s.routes()
	return s
}

type keyCtx struct{}

type principalCtx struct{}

func (s *Server) routes() {
	m := s.mux
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.Handle("GET /openapi.json", apiwire.Handler())
	m.Handle("GET /ui/", ui.Handler("/ui/")) // the web console (internal/ui); public assets, the app asks for a key

	auth := s.requireKey
	m.Handle("POST /sandboxes", auth(s.createSandbox))
	m.Handle("POST /v2/sandboxes", auth(s.createSandbox))
	m.Handle("GET /sandboxes", auth(s.listSandboxesV1))
	m.Handle("GET /v2/sandboxes", auth(s.listSandboxesV2))
	m.Handle("GET /sandboxes/{id}", auth(s.getSandbox))
	m.Handle("DELETE /sandboxes/{id}", auth(s.killSandbox))
	m.Handle("POST /sandboxes/{id}/timeout", auth(s.setTimeout))
	m.Handle("POST /sandboxes/{id}/refreshes", auth(s.refresh))
	m.Handle("POST /sandboxes/{id}/connect", auth(s.connectSandbox))
	m.Handle("POST /v2/sandboxes/{id}/connect", auth(s.connectSandbox))
	m.Handle("POST /sandboxes/{id}/pause", auth(s.pauseSandbox))
	m.Handle("POST /sandboxes/{id}/resume", auth(s.resumeSandbox))
	m.Handle("PUT /sandboxes/{id}/network", auth(s.updateNetwork))                                         // network.go
	m.Handle("GET /metrics", auth(s.adminOnly("read the daemon's metrics", s.metricsHandler().ServeHTTP))) // metrics.go
	m.Handle("GET /sandboxes/{id}/metrics", auth(s.sandboxMetrics))                                        // sandboxmetrics.go
	m.Handle("GET /sandboxes/metrics", auth(s.sandboxesMetrics))
	m.Handle("GET /templates", auth(s.listTemplates))
	s.snapshotRoutes(auth) // snapshots.go
	s.volumeRoutes(auth)   // volumes.go
	s.secretRoutes(auth)   // secrets.go
	s.auditRoutes(auth)    // audit.go
	s.interactRoutes(auth) // pty.go, wait.go: PTY WebSocket, readiness waits, process logs
	s.poolRoutes(auth)     // pools.go: warm pools
	s.overviewRoutes(auth) // overview.go: the console's host page
	s.eventRoutes(auth)    // events.go: lifecycle events and webhooks
	m.Handle("/mcp", auth(mcpserver.HTTPHandler(mcpserver.HTTPConfig{
		API: s.self.http, APIURL: selfURL, Budget: s.mcpBudget,
		Network: func(r *http.Request) string { return s.egressText(apiKeyFrom(r.Context())) },
	}).ServeHTTP))
	m.Handle("POST /keys", auth(s.adminOnly("manage API keys", s.createKey)))
	m.Handle("GET /keys", auth(s.adminOnly("manage API keys", s.listKeys)))
	m.Handle("GET /keys/self", auth(s.selfKey))
	m.Handle("DELETE /keys/{id}", auth(s.adminOnly("manage API keys", s.deleteKey)))
	m.Handle("PATCH /keys/{id}", auth(s.adminOnly("manage API keys", s.updateKey))) // quotas.go

	s.templateBuildRoutes(auth) // templatebuilds.go: E2B's template build API
}

// execStarted is the edge's report of a process start: its latency, by the
// sandbox's template.
func (s *Server) execStarted(sb edge.Sandbox, took time.Duration) {
	if x, err := s.cfg.Manager.Lookup(tenant.System, sb.ID()); err == nil {
		s.cfg.Metrics.ExecStart(x.TemplateID, took)
	}
}

// Close stops what the server runs besides its handler: the in-process
// listener of its own client.
func (s *Server) Close() { s.self.close() }

// ServeHTTP routes sandbox traffic to the proxy and the rest to the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.edge.Handle(w, r) {
		return
	}
	s.serveAPI(w, r) // accesslog.go
}

// requireKey checks X-API-Key (or a bearer token) against the stored hashes
// (or a cluster gateway's assertion: gateway.go).
func (s *Server) requireKey(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, err := s.authenticate(r)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		noteKey(r, k) // accesslog.go
		// The key's request rate (quotas.go).
		if err := s.takeRate(k, "requestRate", "--request-rate", k.Limits.RequestRate, 1); err != nil {
			s.writeErr(w, r, err)
			return
		}
		ctx := context.WithValue(r.Context(), keyCtx{}, k)
		ctx = context.WithValue(ctx, principalCtx{}, s.principal(k))
		h(w, r.WithContext(ctx))
	})
}

// authenticate finds the key of r: a cluster gateway's assertion, or the
// key the request carries.
func (s *Server) authenticate(r *http.Request) (store.APIKey, error) {
	if k, ok, err := s.asserted(r); ok || err != nil { // gateway.go
		return k, err
	}
	key := r.Header.Get("X-API-Key")
	if key == "" {
		if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
			key = strings.TrimPrefix(a, "Bearer ")
		}
	}
	if key == "" {
		return store.APIKey{}, errdefs.Unauthenticated("missing API key: send it in the X-API-Key header")
	}
	k, err := s.cfg.Store.LookupAPIKey(r.Context(), key)
	if err != nil {
		return store.APIKey{}, errdefs.Unauthenticated("invalid API key")
	}
	return k, nil
}

// principal is who a key is: its team, whether it is the admin, which
// secrets it may use and its egress ceiling. Every handler acts on the
// core as this principal.
func (s *Server) principal(k store.APIKey) tenant.Principal {
	admin := k.ID == store.AdminKeyID
	team := k.TeamID
	if team == "" && admin {
		team = tenant.AdminTeam
	}
	return tenant.Principal{Key: k.ID, Team: team, Admin: admin, Secrets: k.Secrets, Ceiling: s.egressCeiling(k)}
}

func apiKeyFrom(ctx context.Context) store.APIKey {
	k, _ := ctx.Value(keyCtx{}).(store.APIKey)
	return k
}

// caller is the principal of an authenticated request (requireKey). A
// request that did not pass requireKey has no team and can act on nothing.
func caller(r *http.Request) tenant.Principal {
	p, _ := r.Context().Value(principalCtx{}).(tenant.Principal)
	return p
}
