package gateway

import (
	"net/http"
	"strings"
)

// serveMore routes what the gateway answers beyond one sandbox's requests,
// creates, lists, keys and secrets (false: not one of these).
func (g *Gateway) serveMore(w http.ResponseWriter, r *http.Request) bool {
	p := r.URL.Path
	if id, ok := forkOf(r); ok {
		g.fork(w, r, id) // snapshots.go
		return true
	}
	switch {
	case isVolumes(p):
		g.serveVolumes(w, r) // volumes.go
	case p == "/snapshots" && r.Method == http.MethodGet:
		g.listSnapshots(w, r) // snapshots.go
	case strings.HasPrefix(p, "/templates/") && r.Method == http.MethodDelete:
		return g.deleteSnapshot(w, r) // snapshots.go; else a template's
	case p == "/sandboxes/metrics" && r.Method == http.MethodGet:
		g.batchMetrics(w, r) // events.go
	case (p == "/events/sandboxes" || strings.HasPrefix(p, "/events/sandboxes/")) && r.Method == http.MethodGet:
		g.sandboxEvents(w, r) // events.go
	case p == "/events/webhooks" || strings.HasPrefix(p, "/events/webhooks/"):
		g.toAnyNode(w, r) // the cluster's webhooks are in the Kubernetes API (cluster.WebhookRecords)
	case p == "/pools" && r.Method == http.MethodGet:
		g.listPools(w, r) // events.go
	case strings.HasPrefix(p, "/pools/") && r.Method == http.MethodPut:
		g.setPool(w, r) // events.go
	case p == "/openapi.json":
		g.toAnyNode(w, r) // every node serves the same
	case p == "/overview" || p == "/metrics" || p == "/ui" || strings.HasPrefix(p, "/ui/") || p == "/mcp":
		writeError(w, http.StatusNotImplemented, "%s is a node's own view, not served by the gateway: ask a node directly (its endpoint is on its Lease, `cella node ls`)", p)
	default:
		return false
	}
	return true
}
