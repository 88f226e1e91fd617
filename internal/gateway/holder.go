package gateway

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/gatewayauth"
	"github.com/cella-sandbox/cella/internal/store"
)

// Sandboxes without a record yet. The records follow the nodes: a node
// writes its sandboxes' records once a recordInterval (a second), and not
// at all while its writes fail or wait on the API server. A sandbox made on
// a node directly, or through another gateway replica, has none until
// then — and a request for it through this gateway meanwhile must not be a
// 404 for a sandbox that exists (E2B's SDKs take a 404 as gone for good).
// So before it answers that, the gateway asks the live nodes themselves,
// which are the truth the records lag behind.

// holderTimeout bounds a node's answer to whether it holds a sandbox: one
// that does not answer in time is taken not to.
const holderTimeout = 5 * time.Second

// sandboxID is what a sandbox ID may be (a Sandbox record's name, as the
// CRD has it): anything else no node holds, and is never put in a path.
var sandboxID = regexp.MustCompile(`^[a-z0-9]{1,63}$`)

// holder asks every live node whether it holds sandbox id, as the caller in
// ctx (a node answers 404 for another team's sandbox); sandbox traffic,
// which carries no key, asks as the cluster's admin, and the node's edge
// then checks the sandbox's own tokens as for any sandbox. It returns the
// name of the first node that does.
func (g *Gateway) holder(ctx context.Context, id string) (string, bool) {
	if !sandboxID.MatchString(id) {
		return "", false
	}
	nodes, err := g.nodes(ctx)
	if err != nil {
		return "", false
	}
	ctx, cancel := context.WithTimeout(ctx, holderTimeout)
	defer cancel() // the other nodes' questions end with the first yes
	found := make(chan string, len(nodes))
	done := eachLive(nodes, func(n cluster.NodeInfo) { // fanout.go
		if g.holds(ctx, n, id) {
			found <- n.Name
		}
	})
	var name string
	var ok bool
	select {
	case name, ok = <-found:
	case <-done:
		select { // the last node to answer may have said yes
		case name, ok = <-found:
		default:
		}
	}
	if ok {
		g.cfg.Log.Info("gateway: a sandbox without a record yet is on its node", "sandbox", id, "node", name)
	}
	return name, ok
}

// holds asks node n for sandbox id (GET /sandboxes/{id}, which changes
// nothing).
func (g *Gateway) holds(ctx context.Context, n cluster.NodeInfo, id string) bool {
	u, err := url.Parse(n.Endpoint)
	if err != nil {
		return false
	}
	u = u.JoinPath("sandboxes", id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false
	}
	k, err := g.akey.get(ctx, g)
	if err != nil {
		return false
	}
	keyID := store.AdminKeyID
	if p, ok := caller(ctx); ok {
		keyID = p.Key
	}
	if err := gatewayauth.Sign(k, req, keyID, time.Now()); err != nil {
		return false
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode == http.StatusOK
}
