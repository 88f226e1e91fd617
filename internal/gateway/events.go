package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
)

// Batch metrics, lifecycle events and warm pools through the gateway.
//   - GET /sandboxes/metrics?sandbox_ids=a,b: each sandbox's node (as for
//     any of its requests) is asked for its own, the answers merged; an
//     unknown, foreign or unreachable sandbox is left out, as a node leaves
//     out one it does not know.
//   - GET /events/sandboxes[/{id}]: every live node is asked (a sandbox's
//     events stay on the nodes it ran on, after it is gone and wherever an
//     archived one was resumed), the answers merged by time and paged by
//     the gateway (offset and limit over the merge).
//   - GET /pools sums each template's pool over the live nodes; PUT
//     /pools/{template} sets the size on every live node (each keeps that
//     many warm: the cluster's pool is the sum).

// maxMetricsIDs is a node's bound on sandbox_ids.
const maxMetricsIDs = 100

// maxMetricsLookups bounds the sandboxes of one batch whose node is looked
// up at once.
const maxMetricsLookups = 16

func (g *Gateway) batchMetrics(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query().Get("sandbox_ids")
	ids := strings.Split(raw, ",")
	if raw == "" || len(ids) > maxMetricsIDs {
		g.toAnyNode(w, r) // the node's own refusal
		return
	}
	// Each sandbox's node, found as for any of its requests, several at
	// once (a record read each, and for one without a record a question
	// to every node: holder.go).
	endpoints := make([]string, len(ids))
	sem := make(chan struct{}, maxMetricsLookups)
	var wg sync.WaitGroup
	for i := range ids {
		ids[i] = strings.TrimSpace(ids[i])
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if u, err := g.nodeOf(r.Context(), ids[i]); err == nil { // unknown, foreign or lost: left out
				endpoints[i] = u.String()
			}
		})
	}
	wg.Wait()
	byNode := map[string][]string{}
	for i, ep := range endpoints {
		if ep != "" {
			byNode[ep] = append(byNode[ep], ids[i])
		}
	}
	nodes := make([]cluster.NodeInfo, 0, len(byNode))
	for ep := range byNode {
		nodes = append(nodes, cluster.NodeInfo{Name: ep, Endpoint: ep, Live: true})
	}
	out := map[string]json.RawMessage{}
	for _, rep := range g.askEach(r, nodes, func(n cluster.NodeInfo) string {
		return url.Values{"sandbox_ids": {strings.Join(byNode[n.Endpoint], ",")}}.Encode()
	}) {
		if rep.refused() {
			passOn(w, rep)
			return
		}
		var got struct {
			Sandboxes map[string]json.RawMessage `json:"sandboxes"`
		}
		if rep.failure() != "" || json.Unmarshal(rep.body, &got) != nil {
			g.cfg.Log.Warn("gateway: a node's metrics are left out", "node", rep.node, "err", rep.failure())
			continue
		}
		for id, m := range got.Sandboxes {
			out[id] = m
		}
	}
	writeJSONOut(w, http.StatusOK, struct {
		Sandboxes map[string]json.RawMessage `json:"sandboxes"`
	}{out})
}

// askEach sends GET r.URL.Path with a query of its own to each node, at
// once.
func (g *Gateway) askEach(r *http.Request, nodes []cluster.NodeInfo, query func(cluster.NodeInfo) string) []reply {
	out := make([]reply, len(nodes))
	done := make(chan struct{})
	for i, n := range nodes {
		go func() {
			defer func() { done <- struct{}{} }()
			out[i] = g.askAsCaller(r, n, http.MethodGet, r.URL.Path, query(n), nil)
		}()
	}
	for range nodes {
		<-done
	}
	return out
}

// maxEventsPage is a node's largest page of events.
const maxEventsPage = 1000

type event struct {
	ID        string    `json:"id"`
	Timestamp time.Time `json:"timestamp"`
	raw       json.RawMessage
}

func (g *Gateway) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, offset := 100, 0
	var err error
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxEventsPage {
			g.toAnyNode(w, r) // the node's own refusal
			return
		}
	}
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			g.toAnyNode(w, r)
			return
		}
	}
	asc, err := strconv.ParseBool(q.Get("orderAsc"))
	if q.Get("orderAsc") == "" {
		asc, err = false, nil
	}
	if err != nil {
		g.toAnyNode(w, r)
		return
	}
	nodes, ok := g.liveNodes(w, r)
	if !ok {
		return
	}
	// Each node's first offset+limit events in the asked order, page by
	// page: the merge's first offset+limit are among them.
	want := offset + limit
	var all []event
	for _, n := range nodes {
		if !n.Live || n.Endpoint == "" {
			continue
		}
		for from := 0; from < want; from += maxEventsPage {
			page := min(maxEventsPage, want-from)
			nq := url.Values{"offset": {strconv.Itoa(from)}, "limit": {strconv.Itoa(page)}, "orderAsc": {strconv.FormatBool(asc)}}
			rep := g.askAsCaller(r, n, http.MethodGet, r.URL.Path, nq.Encode(), nil)
			if rep.refused() {
				passOn(w, rep)
				return
			}
			var raws []json.RawMessage
			if f := rep.failure(); f != "" || json.Unmarshal(rep.body, &raws) != nil {
				g.cfg.Log.Warn("gateway: a node's events are left out", "node", n.Name, "err", f)
				break
			}
			for _, raw := range raws {
				ev := event{raw: raw}
				if json.Unmarshal(raw, &ev) == nil {
					all = append(all, ev)
				}
			}
			if len(raws) < page {
				break
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if !a.Timestamp.Equal(b.Timestamp) {
			return a.Timestamp.Before(b.Timestamp) == asc
		}
		return (a.ID < b.ID) == asc
	})
	out := []json.RawMessage{}
	for i := offset; i < len(all) && len(out) < limit; i++ {
		out = append(out, all[i].raw)
	}
	writeJSONOut(w, http.StatusOK, out)
}

// pool is a node's warm pool of one template.
type pool struct {
	Template  string `json:"template"`
	Size      int    `json:"size"`
	Ready     int    `json:"ready"`
	Filling   int    `json:"filling"`
	HandedOut int64  `json:"handedOut"`
	Misses    int64  `json:"misses"`
	LastError string `json:"lastError"`
}

// sumPools adds up the pools of the replies by template (sorted); a failed
// node's part is left out and its failure returned.
func sumPools(replies []reply) ([]pool, []string) {
	byTpl := map[string]*pool{}
	var failed []string
	for _, rep := range replies {
		var ps []pool
		if f := rep.failure(); f != "" {
			failed = append(failed, f)
			continue
		}
		if err := json.Unmarshal(rep.body, &ps); err != nil {
			var one pool // PUT answers one pool
			if json.Unmarshal(rep.body, &one) != nil {
				failed = append(failed, fmt.Sprintf("node %s: bad pool answer", rep.node))
				continue
			}
			ps = []pool{one}
		}
		for _, p := range ps {
			s := byTpl[p.Template]
			if s == nil {
				s = &pool{Template: p.Template}
				byTpl[p.Template] = s
			}
			s.Size += p.Size
			s.Ready += p.Ready
			s.Filling += p.Filling
			s.HandedOut += p.HandedOut
			s.Misses += p.Misses
			if p.LastError != "" {
				s.LastError = rep.node + ": " + p.LastError
			}
		}
	}
	out := make([]pool, 0, len(byTpl))
	for _, p := range byTpl {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Template < out[j].Template })
	return out, failed
}

func (g *Gateway) listPools(w http.ResponseWriter, r *http.Request) {
	nodes, ok := g.liveNodes(w, r)
	if !ok {
		return
	}
	replies := g.askLive(r, nodes, http.MethodGet, "/pools", "", nil)
	if rf, ok := refusal(replies); ok {
		passOn(w, rf)
		return
	}
	out, failed := sumPools(replies)
	if len(failed) > 0 {
		g.cfg.Log.Warn("gateway: some nodes' pools are left out", "err", failed)
	}
	writeJSONOut(w, http.StatusOK, out)
}

// setPool is PUT /pools/{template} on every live node: 200 with the
// cluster's pool (the sum), or 502 naming the nodes that did not take it.
func (g *Gateway) setPool(w http.ResponseWriter, r *http.Request) {
	body, err := takeBody(r) // place.go
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	nodes, ok := g.liveNodes(w, r)
	if !ok {
		return
	}
	replies := g.askLive(r, nodes, http.MethodPut, r.URL.Path, "", body)
	if rf, ok := refusal(replies); ok {
		passOn(w, rf)
		return
	}
	out, failed := sumPools(replies)
	switch {
	case len(replies) == 0:
		writeError(w, http.StatusServiceUnavailable, "no live node (%d nodes known, none renewing its lease)", len(nodes))
	case len(failed) > 0:
		writeError(w, http.StatusBadGateway, "the pool size was not set on every node: %s", strings.Join(failed, "; "))
	case len(out) != 1:
		writeError(w, http.StatusBadGateway, "the nodes answered %d pools for one template", len(out))
	default:
		writeJSONOut(w, http.StatusOK, out[0])
	}
}
