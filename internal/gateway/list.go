package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// The cluster's sandbox lists (GET /sandboxes, GET /v2/sandboxes) are a
// fan-out: every live node is asked the same query as the caller (the node
// applies E2B's filters and the caller's team, as standalone) and the
// answers are merged in the nodes' own order — startedAt, then ID — so
// E2B's cursor (the last item's "startedAt-nanoseconds_ID", which every
// node reads alike) pages through the merged list: each node returns its
// first `limit` after the cursor, the gateway keeps the first `limit` of
// all, and sets X-Next-Token when any node or the merge had more.
//
// Sandboxes the nodes cannot answer for are listed from their records with
// state "lost" and a reason (cella's lostReason): those of a node whose
// Lease lapsed or that is gone, and those of a live node that did not
// answer. They are shown when the query names no state or names "lost"
// (which the nodes do not know, so it is not forwarded), and pass the
// template and startedAfter filters; a metadata filter hides them (a record
// has no metadata).

// listed is one item of a node's answer: the fields the merge reads, and
// the item as the node wrote it.
type listed struct {
	ID        string    `json:"sandboxID"`
	StartedAt time.Time `json:"startedAt"`
	raw       json.RawMessage
}

// lostSandbox is a sandbox listed from its record: E2B's list item (what
// the record knows of it) plus why and where.
type lostSandbox struct {
	apiwire.ListedSandbox
	// LostReason says why the gateway cannot reach the sandbox.
	LostReason string `json:"lostReason"`
	Node       string `json:"node"`
}

// StateLost is the state of a sandbox its node cannot answer for.
const StateLost = string(apiwire.SandboxStateLost)

type listQuery struct {
	v2       bool
	asc      bool
	limit    int
	withLost bool
	// toNodes is the query the nodes get ("" when only lost ones are asked).
	toNodes  string
	askNodes bool
	template string
	metadata bool
	after    time.Time
	// cursor is nextToken parsed (ok false: none).
	cursorNS int64
	cursorID string
	cursor   bool
}

func parseList(r *http.Request) (listQuery, error) {
	q := r.URL.Query()
	// Lost sandboxes are listed when asked for (state=lost), as a node
	// lists its dead ones: E2B's clients parse an unasked state as an
	// error, and each sandbox's own route answers why it is lost.
	lq := listQuery{v2: strings.HasPrefix(r.URL.Path, "/v2/"), limit: 100, askNodes: true,
		template: q.Get("template"), metadata: q.Get("metadata") != "", asc: q.Get("order") == "asc"}
	if !lq.v2 {
		lq.toNodes = r.URL.RawQuery
		return lq, nil
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return lq, errdefs.InvalidArgument("limit: %q is not an integer from 1 to 100", v)
		}
		lq.limit = n
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return lq, errdefs.InvalidArgument("startedAfter: %q is not an RFC 3339 time", v)
		}
		lq.after = t
	}
	if v := q.Get("nextToken"); v != "" {
		ns, id, ok := strings.Cut(v, "_")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil || id == "" {
			return lq, errdefs.InvalidArgument("nextToken: %q is not a token of this list", v)
		}
		lq.cursorNS, lq.cursorID, lq.cursor = n, id, true
	}
	if st := q.Get("state"); st != "" {
		var keep []string
		lq.withLost = false
		for _, s := range strings.Split(st, ",") {
			if s == StateLost {
				lq.withLost = true
				continue
			}
			keep = append(keep, s)
		}
		if len(keep) == 0 {
			lq.askNodes = false
		}
		q.Set("state", strings.Join(keep, ","))
	}
	lq.toNodes = q.Encode()
	return lq, nil
}

// before is the merged list's order: the nodes' own.
func (lq listQuery) before(a, b listed) bool {
	less := a.StartedAt.Before(b.StartedAt) || (a.StartedAt.Equal(b.StartedAt) && a.ID < b.ID)
	if lq.asc {
		return less
	}
	return !less
}

// pastCursor says whether an item comes after nextToken's.
func (lq listQuery) pastCursor(it listed) bool {
	if !lq.cursor {
		return true
	}
	k := it.StartedAt.UnixNano()
	if lq.asc {
		return k > lq.cursorNS || (k == lq.cursorNS && it.ID > lq.cursorID)
	}
	return k < lq.cursorNS || (k == lq.cursorNS && it.ID < lq.cursorID)
}

// nodeAnswer is one node's part of a list.
type nodeAnswer struct {
	items []listed
	more  bool
	err   error
	// status and body are a node's refusal of the query (a 4xx), passed on.
	status int
	body   []byte
}

func (g *Gateway) list(w http.ResponseWriter, r *http.Request) {
	lq, err := parseList(r)
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	nodes, err := g.nodes(r.Context())
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	answers := map[string]*nodeAnswer{}
	if lq.askNodes {
		var mu sync.Mutex
		<-eachLive(nodes, func(n cluster.NodeInfo) { // fanout.go
			a := g.askNode(r, n, lq)
			mu.Lock()
			answers[n.Name] = a
			mu.Unlock()
		})
	}
	var items []listed
	more := false
	for _, a := range answers {
		if a.status != 0 { // the query itself is refused: every node would say the same
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(a.status)
			_, _ = w.Write(a.body)
			return
		}
		items = append(items, a.items...)
		more = more || a.more
	}
	if lq.withLost {
		lost, err := g.lostItems(r.Context(), nodes, answers, lq)
		if err != nil {
			writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
			return
		}
		items = append(items, lost...)
	}
	sort.SliceStable(items, func(i, j int) bool { return lq.before(items[i], items[j]) })
	if lq.v2 && len(items) > lq.limit {
		items, more = items[:lq.limit], true
	}
	if lq.v2 && more && len(items) > 0 {
		last := items[len(items)-1]
		w.Header().Set("X-Next-Token", strconv.FormatInt(last.StartedAt.UnixNano(), 10)+"_"+last.ID)
	}
	out := make([]json.RawMessage, 0, len(items))
	for _, it := range items {
		out = append(out, it.raw)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(out)
}

// listTimeout bounds one node's answer to a list: a node that does not
// answer in time has its sandboxes listed from their records.
const listTimeout = 15 * time.Second

// askNode sends the list query to node n as the caller.
func (g *Gateway) askNode(in *http.Request, n cluster.NodeInfo, lq listQuery) *nodeAnswer {
	rep := g.askAsCaller(in, n, http.MethodGet, in.URL.Path, lq.toNodes, nil) // fanout.go
	if rep.refused() {
		return &nodeAnswer{status: rep.status, body: rep.body}
	}
	if f := rep.failure(); f != "" {
		return &nodeAnswer{err: errors.New(f)}
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(rep.body, &raws); err != nil {
		return &nodeAnswer{err: fmt.Errorf("list answer: %w", err)}
	}
	a := &nodeAnswer{more: rep.header.Get("X-Next-Token") != ""}
	for _, raw := range raws {
		it := listed{raw: raw}
		if err := json.Unmarshal(raw, &it); err != nil {
			return &nodeAnswer{err: fmt.Errorf("list item: %w", err)}
		}
		a.items = append(a.items, it)
	}
	return a
}

// lostItems are the caller's sandboxes no node answered for: recorded on
// a node whose Lease lapsed or that left, already marked Lost, or on a live
// node whose answer failed.
func (g *Gateway) lostItems(ctx context.Context, nodes []cluster.NodeInfo, answers map[string]*nodeAnswer, lq listQuery) ([]listed, error) {
	if lq.metadata {
		return nil, nil
	}
	recs, err := g.records.Sandboxes(ctx, "")
	if err != nil {
		return nil, err
	}
	byName := make(map[string]cluster.NodeInfo, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	answered := map[string]bool{}
	for _, a := range answers {
		for _, it := range a.items {
			answered[it.ID] = true
		}
	}
	var out []listed
	marked := map[string]bool{}
	for i := range recs {
		sb := &recs[i]
		if answered[sb.Name] || !visible(ctx, tenant.Owner{Team: sb.Spec.Team}) {
			continue
		}
		n, known := byName[sb.Spec.Node]
		var reason string
		switch a := answers[sb.Spec.Node]; {
		case !known:
			reason = fmt.Sprintf("node %s has left the cluster", sb.Spec.Node)
		case !n.Live:
			reason = deadReason(n)
			if sb.Status.Phase != v1alpha1.SandboxLost && !marked[n.Name] {
				marked[n.Name] = true
				if _, err := g.records.MarkLost(ctx, n.Name, reason); err != nil {
					g.cfg.Log.Warn("gateway: marking a dead node's sandboxes lost failed", "node", n.Name, "err", err)
				}
			}
		case sb.Status.Phase == v1alpha1.SandboxLost:
			reason = sb.Status.Message
		case a != nil && a.err != nil:
			reason = fmt.Sprintf("node %s did not answer the list: %v", n.Name, a.err)
		default:
			continue // the node answered for it (or the query did not ask it)
		}
		if sb.Status.Phase == v1alpha1.SandboxLost && sb.Status.Message != "" {
			reason = sb.Status.Message
		}
		it := lostSandbox{ListedSandbox: apiwire.ListedSandbox{SandboxID: sb.Name, TemplateID: sb.Spec.Template, Alias: sb.Spec.Template,
			ClientID: sb.Spec.Node, Metadata: apiwire.SandboxMetadata{}, State: apiwire.SandboxStateLost, VolumeMounts: []apiwire.SandboxVolumeMountDetail{}},
			LostReason: reason, Node: sb.Spec.Node}
		if sb.Status.StartedAt != nil {
			it.StartedAt = sb.Status.StartedAt.Time
		}
		if sb.Spec.Lifecycle.EndAt != nil {
			it.EndAt = sb.Spec.Lifecycle.EndAt.Time
		}
		if lq.template != "" && it.TemplateID != lq.template {
			continue
		}
		if !lq.after.IsZero() && !it.StartedAt.After(lq.after) {
			continue
		}
		raw, err := json.Marshal(it)
		if err != nil {
			return nil, err
		}
		l := listed{ID: it.SandboxID, StartedAt: it.StartedAt, raw: raw}
		if lq.pastCursor(l) {
			out = append(out, l)
		}
	}
	return out, nil
}

// deadReason is why a node's sandboxes are lost.
func deadReason(n cluster.NodeInfo) string {
	return fmt.Sprintf("node %s stopped renewing its lease at %s", n.Name, n.RenewedAt.UTC().Format(time.RFC3339))
}
