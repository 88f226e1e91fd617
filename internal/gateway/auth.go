package gateway

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/gatewayauth"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// The gateway authenticates every API request itself, before it routes:
// a bad key is a 401 whatever sandbox the path names, and what the
// gateway knows (which sandboxes exist, on which node, lost or not) is
// only told to a key whose team owns it. The node is told who asks by an
// assertion (internal/gatewayauth) under the cluster's gateway key, not by
// the client's own headers.

type principalKey struct{}

// caller is the principal authenticate put in ctx.
func caller(ctx context.Context) (tenant.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(tenant.Principal)
	return p, ok
}

// ptyKeyProtocolPrefix is the WebSocket subprotocol a browser passes its
// key in (as internal/api's PTY route reads it).
const ptyKeyProtocolPrefix = "cella-key."

// keyOf is the API key r carries: X-API-Key, a bearer token, or (for the
// PTY WebSocket, which browsers open without headers) ?key= or a
// cella-key.KEY subprotocol.
func keyOf(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		return strings.TrimPrefix(a, "Bearer ")
	}
	if !strings.HasSuffix(r.URL.Path, "/pty") {
		return ""
	}
	if k := r.URL.Query().Get("key"); k != "" {
		return k
	}
	for _, p := range edge.WebSocketProtocols(r) {
		if k, ok := strings.CutPrefix(p, ptyKeyProtocolPrefix); ok {
			return k
		}
	}
	return ""
}

// authenticate checks r's key against the cluster's keys.
func (g *Gateway) authenticate(r *http.Request) (tenant.Principal, error) {
	key := keyOf(r)
	if key == "" {
		return tenant.Principal{}, errdefs.Unauthenticated("missing API key: send it in the X-API-Key header")
	}
	k, err := g.keys.LookupAPIKey(r.Context(), key)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return tenant.Principal{}, errdefs.Unauthenticated("invalid API key")
	}
	if err != nil {
		return tenant.Principal{}, err
	}
	admin := k.ID == store.AdminKeyID
	team := k.TeamID
	if admin && team == "" {
		team = tenant.AdminTeam
	}
	return tenant.Principal{Key: k.ID, Team: team, Admin: admin}, nil
}

// assertionKey is the cluster's gateway key, read once it exists (the
// first node makes it; a gateway may start before any node).
type assertionKey struct {
	mu  sync.Mutex
	key []byte
}

func (a *assertionKey) get(ctx context.Context, g *Gateway) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.key != nil {
		return a.key, nil
	}
	k, err := cluster.GatewayKey(ctx, g.cfg.Client, g.cfg.Namespace, false)
	if err != nil {
		return nil, err
	}
	a.key = k
	return k, nil
}

// sign adds the assertion of the caller in in's context to out, the
// request forwarded to a node.
func (g *Gateway) sign(in, out *http.Request) {
	gatewayauth.Strip(out.Header)
	p, ok := caller(in.Context())
	if !ok {
		return // sandbox traffic: the node's edge checks its own tokens
	}
	g.assert(in.Context(), out, p.Key)
}

// callerKey is the ID of the key that authenticated the request of ctx
// ("" for sandbox traffic, which carries none).
func callerKey(ctx context.Context) string {
	p, _ := caller(ctx)
	return p.Key
}

// assert signs out, a request to a node, as key keyID.
func (g *Gateway) assert(ctx context.Context, out *http.Request, keyID string) {
	k, err := g.akey.get(ctx, g)
	if err != nil {
		// Forwarded unsigned, the node authenticates the client's key
		// itself (a cluster node's keys are the cluster's).
		g.cfg.Log.Warn("gateway: no assertion key yet", "err", err)
		return
	}
	if err := gatewayauth.Sign(k, out, keyID, time.Now()); err != nil {
		g.cfg.Log.Warn("gateway: sign", "err", err)
		return
	}
	// The node acts on the assertion alone and never sees the client's
	// key — except MCP's, whose tools call the node's API again with it.
	if out.URL.Path != "/mcp" {
		out.Header.Del("X-API-Key")
		out.Header.Del("Authorization")
	}
}
