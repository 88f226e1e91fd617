package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Placement. Each live, undrained node's room is what its Lease last said:
// free memory as a fraction of its total and its idle CPU fraction. A node
// with too little free memory (minRoom) is chosen only when every node is
// that full; CPU is shared and its idle fraction, sampled over a beat, is
// too noisy to rule a node out, so it only ranks. Among the others the gateway prefers, in order: a node that
// already holds the create's template (no pull), the node holding the
// fewest sandboxes — counting the creates this gateway placed that the
// node's Lease does not count yet —, the one with more room, then the
// first name. Counting sandboxes before room makes placement even on
// nodes of equal size, whose room differs only by measurement noise.
//
// A placed create counts as pending on its node until a Lease renewal
// later than its answer (by then the node counts it itself), or until it
// failed.

// minRoom is the least free memory fraction a node must have to be
// preferred.
const minRoom = 0.1

type pendingCreate struct {
	// done is when the node answered (zero: still in flight).
	done time.Time
}

// templateOf reads the create body's templateID and puts the body back.
func templateOf(r *http.Request) (string, error) {
	var b struct {
		TemplateID string `json:"templateID"`
	}
	if err := peekBody(r, &b); err != nil {
		return "", err
	}
	if b.TemplateID == "" {
		b.TemplateID = "base"
	}
	return b.TemplateID, nil
}

// peekBody decodes r's JSON body (takeBody) into v; a body that is no JSON
// leaves v as it was (the node's to refuse).
func peekBody(r *http.Request, v any) error {
	body, err := takeBody(r)
	if err == nil {
		_ = json.Unmarshal(body, v)
	}
	return err
}

// takeBody reads r's small body (at most 1 MiB) and puts it back for the
// node.
func takeBody(r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	r.Body.Close()
	if err != nil {
		return nil, errdefs.InvalidArgument("read the request body: %v", err)
	}
	if len(body) > 1<<20 {
		return nil, errdefs.InvalidArgument("the request body is larger than 1 MiB")
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return body, nil
}

// pick chooses the node for a create of template tpl and counts the
// create as pending there.
func (g *Gateway) pick(nodes []cluster.NodeInfo, tpl string) (cluster.NodeInfo, *pendingCreate, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	type cand struct {
		n             cluster.NodeInfo
		roomy, hasTpl bool
		count         int
		room          float64
	}
	var cands []cand
	for _, n := range nodes {
		if !n.Live || n.Drained() || n.Endpoint == "" || n.CapacityErr != "" || n.Capacity.MemoryTotalBytes == 0 {
			continue
		}
		// Drop what the node's last renewal already counts.
		var still []*pendingCreate
		for _, p := range g.pending[n.Name] {
			if p.done.IsZero() || !p.done.Before(n.RenewedAt) {
				still = append(still, p)
			}
		}
		g.pending[n.Name] = still
		mem := float64(n.Capacity.MemoryFreeBytes) / float64(n.Capacity.MemoryTotalBytes)
		cands = append(cands, cand{n: n, roomy: mem >= minRoom,
			hasTpl: slices.Contains(n.Capacity.Templates, tpl), count: n.Capacity.Sandboxes + len(still), room: mem + n.Capacity.CPUIdle})
	}
	if len(cands) == 0 {
		return cluster.NodeInfo{}, nil, false
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		switch {
		case a.roomy != b.roomy:
			return a.roomy
		case !a.roomy: // all full: the most room
			return a.room > b.room
		case a.hasTpl != b.hasTpl:
			return a.hasTpl
		case a.count != b.count:
			return a.count < b.count
		case a.room != b.room:
			return a.room > b.room
		}
		return a.n.Name < b.n.Name
	})
	best := cands[0].n
	p := &pendingCreate{}
	g.pending[best.Name] = append(g.pending[best.Name], p)
	return best, p, true
}

// placedDone records the node's answer to a placed create: a failed one
// is no longer pending.
func (g *Gateway) placedDone(node string, p *pendingCreate, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ok {
		p.done = time.Now()
		return
	}
	list := g.pending[node]
	if i := slices.Index(list, p); i >= 0 {
		g.pending[node] = slices.Delete(list, i, i+1)
	}
}
