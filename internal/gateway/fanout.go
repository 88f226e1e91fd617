package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/gatewayauth"
)

// The gateway's own requests to nodes, for what it answers from several
// of them (lists, batch metrics, pools): each is sent as the caller (its
// assertion, auth.go), so every node applies the caller's team exactly as
// it does standalone, and the gateway only merges.

// reply is one node's answer to a request of the gateway.
type reply struct {
	node   string
	status int
	header http.Header
	body   []byte
	err    error // the node did not answer (or answered unreadably)
}

// refused says whether the node refused the request itself (a 4xx: every
// node would, so it is the caller's answer).
func (r reply) refused() bool { return r.err == nil && r.status/100 == 4 }

// failure is why a node's answer is no answer ("" when it is one).
func (r reply) failure() string {
	switch {
	case r.err != nil:
		return r.err.Error()
	case r.status/100 != 2:
		return fmt.Sprintf("answered %d: %.200s", r.status, r.body)
	}
	return ""
}

// ask sends method path?query (with body, if any) to node n, asserting
// the key keyID ("": none); in, when not nil, is the client's request,
// whose Host and headers go along (its key's dropped once asserted).
func (g *Gateway) ask(ctx context.Context, in *http.Request, keyID string, n cluster.NodeInfo, method, path, query string, body []byte) reply {
	rep := reply{node: n.Name}
	u, err := url.Parse(n.Endpoint)
	if err != nil {
		rep.err = fmt.Errorf("node %s advertises a bad endpoint %q: %w", n.Name, n.Endpoint, err)
		return rep
	}
	u.Path, u.RawQuery = path, query
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	out, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		rep.err = err
		return rep
	}
	if in != nil {
		out.Host = in.Host
		out.Header = in.Header.Clone()
		out.Header.Del("Content-Length")
	}
	gatewayauth.Strip(out.Header)
	if keyID != "" {
		g.assert(ctx, out, keyID) // auth.go
	}
	resp, err := g.client.Do(out)
	if err != nil {
		rep.err = err
		return rep
	}
	defer resp.Body.Close()
	rep.status, rep.header = resp.StatusCode, resp.Header
	rep.body, rep.err = io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return rep
}

// askAsCaller is ask as in's caller, with in's Host and headers.
func (g *Gateway) askAsCaller(in *http.Request, n cluster.NodeInfo, method, path, query string, body []byte) reply {
	return g.ask(in.Context(), in, callerKey(in.Context()), n, method, path, query, body)
}

// eachLive calls f for every live node with an endpoint, all at once; the
// channel is closed once every f returned (<-eachLive(...) waits for all).
func eachLive(nodes []cluster.NodeInfo, f func(n cluster.NodeInfo)) <-chan struct{} {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n.Live && n.Endpoint != "" {
			wg.Go(func() { f(n) })
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// askLive sends the same request to every live node at once.
func (g *Gateway) askLive(in *http.Request, nodes []cluster.NodeInfo, method, path, query string, body []byte) []reply {
	var mu sync.Mutex
	var out []reply
	<-eachLive(nodes, func(n cluster.NodeInfo) {
		r := g.askAsCaller(in, n, method, path, query, body)
		mu.Lock()
		out = append(out, r)
		mu.Unlock()
	})
	return out
}

// liveNodes lists the nodes, answering the error itself (false) when it
// cannot.
func (g *Gateway) liveNodes(w http.ResponseWriter, r *http.Request) ([]cluster.NodeInfo, bool) {
	nodes, err := g.nodes(r.Context())
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return nil, false
	}
	return nodes, true
}

// passOn writes a node's answer as it is (a refusal every node would
// give).
func passOn(w http.ResponseWriter, r reply) {
	if ct := r.header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body)
}

// refusal is the first reply that refused the request, if any.
func refusal(replies []reply) (reply, bool) {
	for _, r := range replies {
		if r.refused() {
			return r, true
		}
	}
	return reply{}, false
}

// urlOf is node n's endpoint.
func urlOf(n cluster.NodeInfo) (*url.URL, error) {
	u, err := url.Parse(n.Endpoint)
	if err != nil || n.Endpoint == "" {
		return nil, fmt.Errorf("node %s advertises a bad endpoint %q: %v", n.Name, n.Endpoint, err)
	}
	return u, nil
}

// writeJSONOut answers v as JSON.
func writeJSONOut(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// unusable says why node name (n, found among the nodes) cannot take
// what is on it (nil: it can). With lapsedOK a node whose Lease lapsed
// but is still there can (what it holds is no client's sandbox: a node
// slow to renew under a build's load answers its build's calls).
func unusable(n cluster.NodeInfo, found bool, name, what string, lapsedOK bool) error {
	switch {
	case !found:
		return errdefs.Unavailable("%s is on node %s, which has left the cluster", what, name)
	case !n.Live && !lapsedOK:
		return errdefs.Unavailable("%s is on node %s, which stopped renewing its lease at %s", what, name, n.RenewedAt.UTC().Format(time.RFC3339))
	case n.Endpoint == "":
		return errdefs.Unavailable("%s is on node %s, which advertises no endpoint", what, name)
	}
	return nil
}

func findNode(nodes []cluster.NodeInfo, name string) (cluster.NodeInfo, bool) {
	for _, n := range nodes {
		if n.Name == name {
			return n, true
		}
	}
	return cluster.NodeInfo{}, false
}

// nodeURL is the endpoint of node name, which holds what (for the error:
// "volume \"data\""), when it is live — with lapsedOK, while it has a
// Lease at all (unusable).
func (g *Gateway) nodeURL(ctx context.Context, name, what string, lapsedOK bool) (*url.URL, error) {
	nodes, err := g.nodes(ctx)
	if err != nil {
		return nil, err
	}
	n, found := findNode(nodes, name)
	if err := unusable(n, found, name, what, lapsedOK); err != nil {
		return nil, err
	}
	u, err := urlOf(n)
	if err != nil {
		return nil, errdefs.Unavailable("%s: %v", what, err)
	}
	return u, nil
}
