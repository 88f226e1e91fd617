package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Snapshots through the gateway. A snapshot is made on its sandbox's node
// (POST /sandboxes/{id}/snapshots goes there like any sandbox request) and
// its files stay there: the nodes are the one truth of which snapshots
// exist, so the gateway keeps no record of them and asks the live nodes
// (each answers for the caller's team, as standalone):
//   - GET /snapshots merges every live node's snapshots, newest first (the
//     nodes' own order), paged by the gateway (nextToken is an offset into
//     the merged list, as a node's is into its own);
//   - DELETE /templates/{id} of a snapshot goes to the node holding it;
//   - a create from a snapshot goes to the node holding it (pin.go).
//
// A snapshot whose node is not live is not listed and cannot be found: its
// files are on that node.

// maxSnapshotPage is a node's largest page of GET /snapshots.
const maxSnapshotPage = 100

// snapItem is one snapshot of a node's list.
type snapItem struct {
	ID        string    `json:"snapshotID"`
	Names     []string  `json:"names"`
	CreatedAt time.Time `json:"createdAt"`
	node      string
	raw       json.RawMessage
}

// nodeSnapshots pages through node n's snapshots matching filter (the
// caller's sandboxID and name); a refusal is returned as the reply.
func (g *Gateway) nodeSnapshots(r *http.Request, n cluster.NodeInfo, filter url.Values) ([]snapItem, reply) {
	var out []snapItem
	for offset := 0; ; {
		q := url.Values{}
		for k, v := range filter {
			q[k] = v
		}
		q.Set("limit", strconv.Itoa(maxSnapshotPage))
		q.Set("nextToken", strconv.Itoa(offset))
		rep := g.askAsCaller(r, n, http.MethodGet, "/snapshots", q.Encode(), nil)
		if rep.failure() != "" {
			return nil, rep
		}
		var raws []json.RawMessage
		if err := json.Unmarshal(rep.body, &raws); err != nil {
			rep.err = fmt.Errorf("snapshot list: %w", err)
			return nil, rep
		}
		for _, raw := range raws {
			it := snapItem{node: n.Name, raw: raw}
			if json.Unmarshal(raw, &it) == nil {
				out = append(out, it)
			}
		}
		next := rep.header.Get("X-Next-Token")
		if next == "" || len(raws) == 0 {
			return out, reply{status: http.StatusOK}
		}
		if offset, rep.err = strconv.Atoi(next); rep.err != nil {
			return nil, rep
		}
	}
}

// allSnapshots are the caller's snapshots on every live node matching
// filter, newest first; a node's refusal is passed on (false).
func (g *Gateway) allSnapshots(w http.ResponseWriter, r *http.Request, nodes []cluster.NodeInfo, filter url.Values) ([]snapItem, bool) {
	type result struct {
		items []snapItem
		rep   reply
	}
	var mu sync.Mutex
	results := map[string]result{}
	<-eachLive(nodes, func(n cluster.NodeInfo) { // fanout.go
		items, rep := g.nodeSnapshots(r, n, filter)
		mu.Lock()
		results[n.Name] = result{items, rep}
		mu.Unlock()
	})
	var all []snapItem
	for name, res := range results {
		if res.rep.refused() {
			if w != nil {
				passOn(w, res.rep)
			}
			return nil, false
		}
		if f := res.rep.failure(); f != "" {
			g.cfg.Log.Warn("gateway: a node's snapshots are left out", "node", name, "err", f)
			continue
		}
		all = append(all, res.items...)
	}
	sort.SliceStable(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if !a.CreatedAt.Equal(b.CreatedAt) {
			return a.CreatedAt.After(b.CreatedAt)
		}
		return a.ID < b.ID
	})
	return all, true
}

// listSnapshots is GET /snapshots?sandboxID=&name=&limit=&nextToken=.
func (g *Gateway) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, offset := maxSnapshotPage, 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "limit must be a positive integer (got %q)", v)
			return
		}
		limit = min(n, maxSnapshotPage)
	}
	if v := q.Get("nextToken"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "invalid nextToken %q", v)
			return
		}
		offset = n
	}
	nodes, ok := g.liveNodes(w, r)
	if !ok {
		return
	}
	filter := url.Values{}
	for _, k := range []string{"sandboxID", "name"} {
		if v := q.Get(k); v != "" {
			filter.Set(k, v)
		}
	}
	all, ok := g.allSnapshots(w, r, nodes, filter)
	if !ok {
		return
	}
	out := []json.RawMessage{}
	for i := offset; i < len(all) && len(out) < limit; i++ {
		out = append(out, all[i].raw)
	}
	if next := offset + len(out); next < len(all) {
		w.Header().Set("X-Next-Token", strconv.Itoa(next))
	}
	writeJSONOut(w, http.StatusOK, out)
}

// findSnapshot is the caller's snapshot ref (its ID or a name) on a live
// node (node "" when none has it).
func (g *Gateway) findSnapshot(r *http.Request, nodes []cluster.NodeInfo, ref string) (snapItem, error) {
	if ref == "" {
		return snapItem{}, nil
	}
	all, ok := g.allSnapshots(nil, r, nodes, nil)
	if !ok {
		return snapItem{}, errdefs.Unavailable("the nodes refused to list snapshots")
	}
	for _, s := range all { // newest first: a name means its newest snapshot, as on a node
		if s.ID == ref || slices.Contains(s.Names, ref) {
			return s, nil
		}
	}
	return snapItem{}, nil
}

// deleteSnapshot serves DELETE /templates/{id} when id is one of the
// caller's snapshots (false: it is not, the request is a template's).
func (g *Gateway) deleteSnapshot(w http.ResponseWriter, r *http.Request) bool {
	id, ok := strings.CutPrefix(r.URL.Path, "/templates/")
	if r.Method != http.MethodDelete || !ok || id == "" || strings.Contains(id, "/") {
		return false
	}
	nodes, err := g.nodes(r.Context())
	if err != nil {
		return false
	}
	s, err := g.findSnapshot(r, nodes, id)
	if err != nil || s.node == "" {
		return false
	}
	n, _ := findNode(nodes, s.node)
	u, err := urlOf(n)
	if err != nil {
		return false
	}
	g.forward(w, r, u)
	return true
}

func quote(s string) string { return strconv.Quote(s) }

// forkOf is the original's ID of POST /sandboxes/{id}/fork.
func forkOf(r *http.Request) (string, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/sandboxes/")
	id, tail, _ := strings.Cut(rest, "/")
	return id, ok && r.Method == http.MethodPost && id != "" && tail == "fork"
}

// fork forwards a fork to the original's node and remembers the forks
// there, as a create's placement: the client uses them at once, before
// the node's next sync records them.
func (g *Gateway) fork(w http.ResponseWriter, r *http.Request, id string) {
	u, err := g.nodeOf(r.Context(), id)
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	// The answer is held until the placements are kept: the client's next
	// request, sent as soon as it has the 201, finds them.
	b := newBuffered() // volumes.go
	g.forward(b, r, u)
	defer b.replay(w)
	var forks []struct {
		Sandbox *struct {
			SandboxID string `json:"sandboxID"`
		} `json:"sandbox"`
	}
	if b.status != http.StatusCreated || json.Unmarshal(b.body.Bytes(), &forks) != nil {
		return
	}
	nodes, err := g.nodes(r.Context())
	if err != nil {
		return
	}
	name := ""
	for _, n := range nodes {
		if nu, err := urlOf(n); err == nil && nu.String() == u.String() {
			name = n.Name
		}
	}
	p, _ := caller(r.Context())
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range forks {
		if f.Sandbox != nil && f.Sandbox.SandboxID != "" && name != "" {
			g.placed[f.Sandbox.SandboxID] = placement{node: name, owner: p.Owner(), at: time.Now()}
		}
	}
	g.prunePlacedLocked()
}
