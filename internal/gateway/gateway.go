// Package gateway is `cella gateway`: one endpoint for a cluster of cella
// nodes. It places each create on a live node (the nodes and their
// capacity are their Leases: internal/cluster) and forwards every later
// request for a sandbox — REST and sandbox traffic, WebSockets included —
// to the node that holds it (its Sandbox record, or the gateway's own
// placement until the node has recorded it).
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
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
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
	akey    assertionKey
	proxy   *httputil.ReverseProxy
	// client asks the nodes for their part of a list (list.go).
	client *http.Client

	mu sync.Mutex
	// placed are the creates this gateway forwarded, by sandbox ID, until
	// the node's record shows them (the node records within a second).
	placed map[string]placement
	// pending counts, per node, the creates placed since its last Lease
	// beat, so a burst of creates does not all go to the node that looked
	// best at the start of it.
	pending map[string]pendingCount
}

type placement struct {
	node  string
	owner tenant.Owner
	at    time.Time
}

type pendingCount struct {
	n       int
	renewal time.Time // the Lease renewal they were counted against
}

// New makes a gateway.
func New(cfg Config) *Gateway {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	g := &Gateway{cfg: cfg, records: cluster.NewRecords(cfg.Client, cfg.Namespace), keys: cluster.NewKeys(cfg.Client, cfg.Namespace),
		placed: map[string]placement{}, pending: map[string]pendingCount{},
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
		g.toSandbox(w, r, t.ID)
		return
	}
	if r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	p, err := g.authenticate(r) // auth.go
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
	switch {
	case r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes"):
		g.create(w, r)
	case r.Method == http.MethodGet && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes"):
		g.list(w, r) // list.go
	case r.URL.Path == "/keys" || strings.HasPrefix(r.URL.Path, "/keys/"):
		// The cluster's keys are in the Kubernetes API: any node serves them.
		g.toAnyNode(w, r)
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

// visible says whether what the gateway knows of a sandbox owned by o may
// be told to the caller (sandbox traffic, which carries no key, is
// answered by the node's edge, which checks the sandbox's own tokens).
func visible(ctx context.Context, o tenant.Owner) bool {
	p, ok := caller(ctx)
	return !ok || p.Can(o)
}

// toAnyNode forwards r to a live node (for what every node serves alike).
func (g *Gateway) toAnyNode(w http.ResponseWriter, r *http.Request) {
	nodes, err := cluster.Nodes(r.Context(), g.cfg.Client, g.cfg.Namespace)
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
	node, err := g.nodeOf(r.Context(), id)
	if (err == nil || errdefs.Is(err, errdefs.KindUnavailable)) && (isResume(r) || isKill(r)) {
		// An archived sandbox outlives its node (archive.go).
		if n, ok := g.elsewhere(r.Context(), id); ok {
			node, err = n, nil
		}
	}
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	g.forward(w, r, node)
}

// nodeOf finds the live node holding sandbox id and its endpoint.
func (g *Gateway) nodeOf(ctx context.Context, id string) (*url.URL, error) {
	name := ""
	sb, err := g.records.Sandbox(ctx, id)
	switch {
	case err == nil:
		if !visible(ctx, tenant.Owner{Team: sb.Spec.Team}) {
			return nil, errdefs.NotFound("sandbox %q not found", id)
		}
		if sb.Status.Phase == v1alpha1.SandboxLost {
			return nil, errdefs.Unavailable("sandbox %s is lost: %s", id, sb.Status.Message)
		}
		name = sb.Spec.Node
	case errdefs.Is(err, errdefs.KindNotFound):
		g.mu.Lock()
		p, ok := g.placed[id]
		g.mu.Unlock()
		if !ok || !visible(ctx, p.owner) {
			return nil, errdefs.NotFound("sandbox %q not found", id)
		}
		name = p.node
	default:
		return nil, err
	}
	nodes, err := cluster.Nodes(ctx, g.cfg.Client, g.cfg.Namespace)
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
	nodes, err := cluster.Nodes(r.Context(), g.cfg.Client, g.cfg.Namespace)
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	n, ok := g.pick(nodes)
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

// pick is the live node with the most room: free memory (as a fraction of
// its total) plus idle CPU, less a share for each sandbox it holds or was
// just given; ties go to the first name.
func (g *Gateway) pick(nodes []cluster.NodeInfo) (cluster.NodeInfo, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var live []cluster.NodeInfo
	for _, n := range nodes {
		if n.Live && !n.Drained() && n.Endpoint != "" && n.CapacityErr == "" && n.Capacity.MemoryTotalBytes > 0 {
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return cluster.NodeInfo{}, false
	}
	scores := make(map[string]float64, len(live))
	for _, n := range live {
		p := g.pending[n.Name]
		if !p.renewal.Equal(n.RenewedAt) { // a new beat counts what was placed before it
			p = pendingCount{renewal: n.RenewedAt}
			g.pending[n.Name] = p
		}
		mem := float64(n.Capacity.MemoryFreeBytes) / float64(n.Capacity.MemoryTotalBytes)
		scores[n.Name] = mem + n.Capacity.CPUIdle - 0.05*float64(n.Capacity.Sandboxes+p.n)
	}
	sort.SliceStable(live, func(i, j int) bool { return scores[live[i].Name] > scores[live[j].Name] })
	best := live[0]
	p := g.pending[best.Name]
	p.n++
	g.pending[best.Name] = p
	return best, true
}

func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, node *url.URL) {
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
