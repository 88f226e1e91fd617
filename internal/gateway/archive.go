package gateway

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/cella-sandbox/cella/internal/cluster"
)

// Sandboxes that outlive their node: a sandbox paused on a node started
// with --archive is in the object store (internal/archive), and its record
// says archived. Once its node's Lease lapsed, or the node is drained, a
// connect or resume goes to the live node with the most room, which
// imports and resumes it (internal/sandbox/remote.go), and a kill goes
// there too, which deletes its objects; either moves the record there
// (cluster.Records.Claim).

// isResume is E2B's connect or resume of a paused sandbox.
func isResume(r *http.Request) bool {
	p := strings.TrimPrefix(r.URL.Path, "/v2")
	return r.Method == http.MethodPost && (strings.HasSuffix(p, "/connect") || strings.HasSuffix(p, "/resume")) &&
		strings.Count(p, "/") == 3
}

// isKill is DELETE /sandboxes/{id}.
func isKill(r *http.Request) bool {
	p := strings.TrimPrefix(r.URL.Path, "/v2")
	return r.Method == http.MethodDelete && strings.Count(strings.TrimSuffix(p, "/"), "/") == 2
}

// elsewhere picks the node to resume or kill sandbox id on when its
// record says it is archived and its own node is gone or drained (false:
// leave it to its node). The caller already checked the key may see the
// sandbox (nodeOf).
func (g *Gateway) elsewhere(ctx context.Context, id string) (*url.URL, bool) {
	sb, err := g.records.Sandbox(ctx, id)
	if err != nil || !sb.Status.Archived {
		return nil, false
	}
	nodes, err := cluster.Nodes(ctx, g.cfg.Client, g.cfg.Namespace)
	if err != nil {
		return nil, false
	}
	for _, n := range nodes {
		if n.Name == sb.Spec.Node && n.Live && !n.Drained() {
			return nil, false // its node resumes it itself
		}
	}
	n, pc, ok := g.pick(nodes, sb.Spec.Template) // place.go: as a create of its template
	if !ok {
		return nil, false
	}
	g.placedDone(n.Name, pc, true) // it takes room there until the node's next renewal counts it
	g.mu.Lock()
	delete(g.placed, id) // a placement on its old node no longer routes it: its record does
	g.mu.Unlock()
	u, err := url.Parse(n.Endpoint)
	if err != nil {
		return nil, false
	}
	g.cfg.Log.Info("gateway: an archived sandbox of a gone or drained node goes to another", "sandbox", id, "from", sb.Spec.Node, "to", n.Name)
	return u, true
}
