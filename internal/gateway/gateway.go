// Package gateway is `cella gateway`: one endpoint for a cluster of cella
// nodes. It places each create on a live node (the nodes and their
// capacity are their Leases: internal/cluster) and forwards every later
// request for a sandbox — REST and sandbox traffic, WebSockets included —
// to the node that holds it (its Sandbox record, or the gateway's own
// placement until the node has recorded it; with neither, the live nodes
// are asked before a 404: holder.go).
//
// It forwards at the HTTP level rather than implementing edge.Router over
// remote nodes: the node's own API and edge answer every request (its
// credential checks, idle clock, PTY sessions, E2B's error shapes), so the
// wire a client sees through the gateway is byte for byte the node's, and
// the gateway holds no sandbox token. It is stateless: any number of
// replicas serve the same cluster.
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/gatewayauth"
	"github.com/cella-sandbox/cella/internal/tenant"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Config is a gateway's cluster.
type Config struct {
	Client    client.Client
	Namespace string
	// Domain is the sandbox domain (PORT-ID.DOMAIN), the nodes' --domain.
	Domain string
	Log    *slog.Logger
}

// Gateway is the cluster's front.
type Gateway struct {
	cfg     Config
	records *cluster.Records
	keys    *cluster.Keys
	volumes *cluster.VolumeRecords
	akey    assertionKey
	proxy   *httputil.ReverseProxy
	// client asks the nodes for their part of a list (list.go).
	client *http.Client
	// nodesCache is the last LIST of Leases, for nodesTTL.
	nodesCache nodesCache
	// holderAsks are the questions to every node for sandboxes without a
	// record, and their recent misses (holder.go).
	holderAsks holderAsks

	mu sync.Mutex
	// placed are the creates this gateway forwarded, by sandbox ID, until
	// the node's record shows them (the node records within a second).
	placed map[string]placement
	// pending are, per node, the creates placed there that its Lease does
	// not count yet (place.go).
	pending map[string][]*pendingCreate
}

type placement struct {
	node  string
	owner tenant.Owner
	at    time.Time
}

// New makes a gateway.
func New(cfg Config) *Gateway {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	g := &Gateway{cfg: cfg, records: cluster.NewRecords(cfg.Client, cfg.Namespace), keys: cluster.NewKeys(cfg.Client, cfg.Namespace),
		volumes: cluster.NewVolumeRecords(cfg.Client, cfg.Namespace),
		placed:  map[string]placement{}, pending: map[string][]*pendingCreate{},
		client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			node := pr.In.Context().Value(nodeKey{}).(*url.URL)
			pr.SetURL(node)
			// The node routes sandbox traffic by Host (PORT-ID.DOMAIN) as
			// the client sent it.
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			g.sign(pr.In, pr.Out) // auth.go
		},
		FlushInterval: -1, // streams (envd's Connect streams, logs) flow as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			cfg.Log.Warn("gateway: node unreachable", "path", r.URL.Path, "err", err)
			writeError(w, http.StatusBadGateway, "the sandbox's node did not answer: %v", err)
		},
	}
	return g
}

type nodeKey struct{}

// ServeHTTP routes one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	gatewayauth.Strip(r.Header) // only this gateway asserts who asks
	if t, ok, err := edge.TargetOf(r, g.cfg.Domain); ok {
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // as the node's edge answers
			return
		}
		node, err := g.nodeOf(r.Context(), t.ID)
		if err != nil { // E2B's edge answer for a sandbox it cannot reach
			edge.BadGateway(w, t.ID, err.Error())
			return
		}
		g.forward(w, r, node)
		return
	}
	if r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if id, ok := isUpload(r); ok { // templates.go: its token is the credential
		g.upload(w, r, id)
		return
	}
	if id, ok := volumeContentID(r.URL.Path); ok { // volumes.go: a volume token is no API key
		g.volumeContent(w, r, id)
		return
	}
	p, err := g.authenticate(r) // auth.go
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
	if g.serveMore(w, r) { // more.go: volumes, snapshots, events, metrics, pools
		return
	}
	switch {
	case r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes"):
		g.create(w, r)
	case r.Method == http.MethodGet && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes"):
		g.list(w, r) // list.go
	case r.URL.Path == "/keys" || strings.HasPrefix(r.URL.Path, "/keys/") ||
		r.URL.Path == "/secrets" || strings.HasPrefix(r.URL.Path, "/secrets/"):
		// The cluster's keys and secrets are in the Kubernetes API: any
		// node serves them.
		g.toAnyNode(w, r)
	case g.templateRoute(w, r): // templates.go: serves what it reports as a template route
	default:
		if id, ok := sandboxPath(r.URL.Path); ok {
			g.toSandbox(w, r, id)
			return
		}
		writeError(w, http.StatusNotImplemented, "%s %s is not served by the gateway yet: only sandbox creates and requests for one sandbox are (ask a node directly)", r.Method, r.URL.Path)
	}
}

// sandboxPath finds the sandbox ID of /sandboxes/{id}[/...] and
// /v2/sandboxes/{id}[/...].
func sandboxPath(p string) (string, bool) {
	p = strings.TrimPrefix(p, "/v2")
	rest, ok := strings.CutPrefix(p, "/sandboxes/")
	if !ok {
		return "", false
	}
	id, _, _ := strings.Cut(rest, "/")
	if id == "" || id == "metrics" {
		return "", false
	}
	return id, true
}

// nodesTTL is how long one LIST of the nodes' Leases serves every
// request: far below a Lease's renewal interval, so a lapse is seen as
// soon as without it, and a request's route costs no API call in a burst.
const nodesTTL = 250 * time.Millisecond

type nodesCache struct {
	mu    sync.Mutex
	at    time.Time
	nodes []cluster.NodeInfo
}

// nodes are the cluster's nodes, listed at most nodesTTL ago.
func (g *Gateway) nodes(ctx context.Context) ([]cluster.NodeInfo, error) {
	c := &g.nodesCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes != nil && time.Since(c.at) < nodesTTL {
		return c.nodes, nil
	}
	nodes, err := cluster.Nodes(ctx, g.cfg.Client, g.cfg.Namespace)
	if err != nil {
		return nil, err
	}
	c.nodes, c.at = nodes, time.Now()
	return nodes, nil
}

// visible says whether what the gateway knows of a sandbox owned by o may
// be told to the caller (sandbox traffic, which carries no key, is
// answered by the node's edge, which checks the sandbox's own tokens).
func visible(ctx context.Context, o tenant.Owner) bool {
	p, ok := caller(ctx)
	return !ok || p.Can(o)
}

// toAnyNode forwards r to a live node (for what every node serves alike).
func (g *Gateway) toAnyNode(w http.ResponseWriter, r *http.Request) {
	nodes, err := g.nodes(r.Context())
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	for _, n := range nodes {
		if u, err := url.Parse(n.Endpoint); err == nil && n.Live && n.Endpoint != "" {
			g.forward(w, r, u)
			return
		}
	}
	writeError(w, http.StatusServiceUnavailable, "no live node (%d nodes known, none renewing its lease)", len(nodes))
}

// toSandbox forwards r to the node of sandbox id.
func (g *Gateway) toSandbox(w http.ResponseWriter, r *http.Request, id string) {
	node, err := g.routeSandbox(r, id)
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	if isKill(r) {
		g.kill(w, r, id, node)
		return
	}
	g.forward(w, r, node)
}

// routeSandbox is the node r, a request for sandbox id, goes to.
func (g *Gateway) routeSandbox(r *http.Request, id string) (*url.URL, error) {
	node, err := g.nodeOf(r.Context(), id)
	if (err == nil || errdefs.Is(err, errdefs.KindUnavailable)) && (isResume(r) || isKill(r)) {
		// An archived sandbox outlives its node (archive.go).
		if n, ok := g.elsewhere(r.Context(), id); ok {
			node, err = n, nil
		}
	}
	return node, err
}

// maxKillMoves bounds how often one kill follows its sandbox to another
// node.
const maxKillMoves = 3

// kill forwards a kill of sandbox id to node. A node whose archived copy
// another node claimed since the route was read (a cross-node resume)
// forgets its copy and answers 409 (sandbox/remote.go, movedAway): the
// kill then goes where the record routes it now, so the client's kill
// ends the sandbox wherever it went. A 409 of a node the record still
// names is the node's answer.
func (g *Gateway) kill(w http.ResponseWriter, r *http.Request, id string, node *url.URL) {
	body, err := takeBody(r) // place.go: sent again on a retry
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	for moves := 0; ; moves++ {
		r.Body = io.NopCloser(bytes.NewReader(body))
		b := newBuffered() // volumes.go: a kill's answer is small
		g.forward(b, r, node)
		if b.status != http.StatusConflict || moves == maxKillMoves {
			b.replay(w)
			return
		}
		g.mu.Lock()
		delete(g.placed, id) // the record routes it now
		g.mu.Unlock()
		next, err := g.routeSandbox(r, id)
		if err != nil || next.String() == node.String() {
			b.replay(w)
			return
		}
		g.cfg.Log.Info("gateway: a kill follows its sandbox to another node", "sandbox", id, "from", node.Host, "to", next.Host)
		node = next
	}
}

// nodeOf finds the live node holding sandbox id and its endpoint.
func (g *Gateway) nodeOf(ctx context.Context, id string) (*url.URL, error) {
	name := ""
	// A sandbox this gateway placed a moment ago is routed by that
	// placement: no record read per request while a client works with a
	// sandbox it just made (its node's liveness is still checked below).
	g.mu.Lock()
	p, placed := g.placed[id]
	g.mu.Unlock()
	var sb *v1alpha1.Sandbox
	err := errdefs.NotFound("sandbox %q not found", id)
	if !placed || time.Since(p.at) > placedFresh {
		sb, err = g.records.Sandbox(ctx, id)
	}
	switch {
	case err == nil:
		if !visible(ctx, tenant.Owner{Team: sb.Spec.Team}) {
			return nil, errdefs.NotFound("sandbox %q not found", id)
		}
		if sb.Status.Phase == v1alpha1.SandboxLost {
			return nil, errdefs.Unavailable("sandbox %s is lost: %s", id, sb.Status.Message)
		}
		name = sb.Spec.Node
	case errdefs.Is(err, errdefs.KindNotFound) && placed:
		if !visible(ctx, p.owner) {
			return nil, errdefs.NotFound("sandbox %q not found", id)
		}
		name = p.node
	case errdefs.Is(err, errdefs.KindNotFound):
		// No record may be one its node has not written yet (holder.go).
		n, ok := g.holder(ctx, id)
		if !ok {
			return nil, errdefs.NotFound("sandbox %q not found", id)
		}
		name = n
	default:
		return nil, err
	}
	nodes, err := g.nodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if n.Name != name {
			continue
		}
		if !n.Live {
			reason := deadReason(n)
			// Every sandbox of the node is reported lost, not only this one
			// (resourceVersion-checked: a node that comes back records its
			// sandboxes' real phases again).
			if _, err := g.records.MarkLost(ctx, name, reason); err != nil {
				g.cfg.Log.Warn("gateway: marking a dead node's sandboxes lost failed", "node", name, "err", err)
			}
			return nil, errdefs.Unavailable("sandbox %s is lost: %s", id, reason)
		}
		return url.Parse(n.Endpoint)
	}
	return nil, errdefs.Unavailable("sandbox %s: its node %s has left the cluster", id, name)
}

// create places a create on the best live node, forwards it there and
// remembers where the sandbox went.
func (g *Gateway) create(w http.ResponseWriter, r *http.Request) {
	nodes, err := g.nodes(r.Context())
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	tpl, err := templateOf(r) // place.go
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	n, pc, ok, err := g.placeCreate(r, nodes, tpl) // pin.go: a volume's or a snapshot's node, else pick
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "no live node to place the sandbox on (%d nodes known, none renewing its lease and not drained)", len(nodes))
		return
	}
	u, err := url.Parse(n.Endpoint)
	if err != nil {
		writeError(w, http.StatusBadGateway, "node %s advertises a bad endpoint %q: %v", n.Name, n.Endpoint, err)
		return
	}
	rec := &recorder{ResponseWriter: w}
	g.forward(rec, r, u)
	g.placedDone(n.Name, pc, rec.status/100 == 2)
	if rec.status/100 != 2 {
		return
	}
	var created struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(rec.body.Bytes(), &created); err != nil || created.SandboxID == "" {
		g.cfg.Log.Warn("gateway: create answer without a sandboxID", "node", n.Name, "err", err)
		return
	}
	g.mu.Lock()
	p, _ := caller(r.Context())
	g.placed[created.SandboxID] = placement{node: n.Name, owner: p.Owner(), at: time.Now()}
	g.prunePlacedLocked()
	g.mu.Unlock()
	g.cfg.Log.Info("gateway: placed", "sandbox", created.SandboxID, "node", n.Name)
}

// placedFresh is how long a placement routes its sandbox without a read of
// its record: well within a Lease's renewal (a kill meanwhile is the node's
// to answer 404 for).
const placedFresh = 10 * time.Second

// placedTTL is how long the gateway remembers a placement: long after the
// node's first record of it (recordInterval, a second).
const placedTTL = time.Minute

func (g *Gateway) prunePlacedLocked() {
	for id, p := range g.placed {
		if time.Since(p.at) > placedTTL {
			delete(g.placed, id)
		}
	}
}

func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, node *url.URL) {
	// As the node's edge does (edge/proxy.go): without full duplex, net/http
	// closes the request body as the answer starts, and the transport, still
	// sending it, tears the connection down mid-answer (a Connect RPC's
	// small answer then arrived cut short).
	_ = http.NewResponseController(w).EnableFullDuplex()
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nodeKey{}, node)))
}

// recorder keeps a copy of a create's answer (small JSON) as it passes.
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.body.Len() < 1<<20 {
		r.body.Write(b)
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (full duplex).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// writeError is E2B's error shape, as the nodes answer.
func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, fmt.Sprintf(format, args...)})
}
