package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/cella-sandbox/cella/internal/builds"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Templates through the gateway. The cluster's API templates are Template
// records (internal/cluster), one per template ID, with the owning team,
// the aliases, the node that builds it (spec.node) and, once built, the
// OCI reference and digest every node pulls it from. A build's calls —
// the request, the files links and their uploads, the trigger, the status
// and logs, tags, aliases — go to the record's node: its files cache, its
// log and its build state are there, and every gateway replica reads the
// same record (the node writes it before it answers the request). A new
// template's build goes to a node picked as a create is. GET /templates
// merges every live node's answer, kept to the caller team's records and
// the nodes' public templates (builtins); DELETE goes to the record's
// node, which removes its copy and the record; the other nodes drop their
// pulled copies on their next use of it.

// templateRoute reports whether r is a template route and serves it.
func (g *Gateway) templateRoute(w http.ResponseWriter, r *http.Request) bool {
	seg := pathSegments(r)
	version := ""
	if len(seg) > 0 && (seg[0] == "v2" || seg[0] == "v3") {
		version, seg = seg[0], seg[1:]
	}
	if len(seg) == 0 || seg[0] != "templates" {
		return false
	}
	seg = seg[1:]
	switch {
	case len(seg) == 0 && r.Method == http.MethodPost: // POST /v3/templates
		g.requestBuild(w, r)
	case len(seg) == 0 && r.Method == http.MethodGet && version == "": // GET /templates
		g.listTemplates(w, r)
	case len(seg) == 0:
		g.toAnyNode(w, r) // what a node answers for the rest
	case len(seg) == 1 && seg[0] == "tags": // POST/DELETE /templates/tags {target|name}
		g.tags(w, r)
	case len(seg) == 2 && seg[0] == "aliases":
		g.alias(w, r, seg[1])
	case len(seg) == 1 && r.Method == http.MethodDelete:
		g.deleteTemplate(w, r, seg[0])
	default: // /templates/{id}/...: files, builds, status, tags, PATCH
		g.toTemplate(w, r, seg[0])
	}
	return true
}

// isUpload is the PUT of an upload URL a files link returned: it carries
// no key (its token is the credential, checked by the node that signed
// it), so it is routed before authentication, by the template ID alone.
func isUpload(r *http.Request) (string, bool) {
	seg := pathSegments(r)
	if r.Method != http.MethodPut || len(seg) != 4 || seg[0] != "templates" || seg[2] != "files" {
		return "", false
	}
	return seg[1], true
}

// upload forwards an upload to the node building template id.
func (g *Gateway) upload(w http.ResponseWriter, r *http.Request, id string) {
	t, err := g.records.Template(r.Context(), id)
	if err != nil {
		writeError(w, http.StatusForbidden, "invalid or expired upload token") // as the node answers a bad token
		return
	}
	g.toNode(w, r, t)
}

// pathSegments are r's path segments, each unescaped: E2B's SDK
// percent-encodes path parameters (cella-demo%3Av1, team%2Falias).
func pathSegments(r *http.Request) []string {
	raw := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/")
	out := make([]string, 0, len(raw))
	for _, s := range raw {
		if u, err := url.PathUnescape(s); err == nil {
			s = u
		}
		out = append(out, s)
	}
	return out
}

// aliasOf is the alias an E2B name (namespace/alias:tag) names.
func aliasOf(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	name, _, _ = strings.Cut(name, ":")
	return name
}

// template is the record ref (a template ID, or an alias of the caller's
// team) names; another team's is NotFound, as an unknown one (a published
// one too: its node answers for it, as for any node's public template).
func (g *Gateway) template(ctx context.Context, ref string) (*v1alpha1.Template, error) {
	p, _ := caller(ctx)
	return g.records.FindTemplate(ctx, ref, aliasOf(ref), func(t *v1alpha1.Template) bool { return p.Can(tenant.Owner{Team: t.Spec.Team}) })
}

// toNode forwards r to the node building t. A node whose Lease lapsed
// still gets its build's calls (a build holds no sandbox of a client's: a
// node slow to renew under a build's load answers them; a dead one is the
// proxy's 502); one that left the cluster is a 503.
func (g *Gateway) toNode(w http.ResponseWriter, r *http.Request, t *v1alpha1.Template) {
	u, err := g.nodeURL(r.Context(), t.Spec.Node, "the build state and files of template "+t.Name, true) // fanout.go
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s (request a new build: POST /v3/templates)", err.Error())
		return
	}
	g.forward(w, r, u)
}

// toTemplate forwards a request about template ref to its node; a ref
// that is no record of the caller's team goes to any node (a builtin, a
// node's own template), which answers for it.
func (g *Gateway) toTemplate(w http.ResponseWriter, r *http.Request, ref string) {
	t, err := g.template(r.Context(), ref)
	switch {
	case errdefs.Is(err, errdefs.KindNotFound):
		g.toAnyNode(w, r)
	case err != nil:
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
	default:
		g.toNode(w, r, t)
	}
}

// requestBuild is POST /v3/templates: a rebuild goes to the node of the
// alias's record while it is live and not drained (its step cache is
// there), a new template or one whose builder is gone or drained to a node
// picked as a create is (the node records itself as the builder before it
// answers).
func (g *Gateway) requestBuild(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if err := peekBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	nodes, err := g.nodes(r.Context())
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	if req.Name != "" {
		t, err := g.template(r.Context(), aliasOf(req.Name))
		if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
			return
		}
		for _, n := range nodes {
			// A drained builder gets no new build: another node takes the
			// template over (same ID; the record names it from then on).
			if err == nil && n.Name == t.Spec.Node && n.Live && !n.Drained() && n.Endpoint != "" {
				if u, perr := url.Parse(n.Endpoint); perr == nil {
					g.forward(w, r, u)
					return
				}
			}
		}
	}
	n, pc, ok := g.pick(nodes, "")
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "no live node to build the template on (%d nodes known, none renewing its lease and not drained)", len(nodes))
		return
	}
	g.placedDone(n.Name, pc, false) // a build is no sandbox
	u, err := url.Parse(n.Endpoint)
	if err != nil {
		writeError(w, http.StatusBadGateway, "node %s advertises a bad endpoint %q: %v", n.Name, n.Endpoint, err)
		return
	}
	g.forward(w, r, u)
}

// tags is POST /templates/tags {target} and DELETE /templates/tags
// {name}: the template's node holds its tags.
func (g *Gateway) tags(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Target string `json:"target"`
		Name   string `json:"name"`
	}
	if err := peekBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	ref := req.Target
	if ref == "" {
		ref = req.Name
	}
	g.toTemplate(w, r, aliasOf(ref))
}

// alias is GET /templates/aliases/{alias}: the record's node answers
// (tags included); with that node gone, the record itself does.
func (g *Gateway) alias(w http.ResponseWriter, r *http.Request, alias string) {
	t, err := g.template(r.Context(), aliasOf(alias))
	switch {
	case errdefs.Is(err, errdefs.KindNotFound):
		g.toAnyNode(w, r) // builtins and the nodes' own templates
		return
	case err != nil:
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	if u, err := g.nodeURL(r.Context(), t.Spec.Node, "template "+t.Name, false); err == nil {
		g.forward(w, r, u)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(struct {
		TemplateID string `json:"templateID"`
		Public     bool   `json:"public"`
	}{t.Name, false})
}

// deleteTemplate is DELETE /templates/{id}: the record's node removes its
// copy and the record (refused while sandboxes use it); with that node
// gone, the gateway removes the record. Every other node drops its pulled
// copy on its next use of the template (builds.resolveShared).
func (g *Gateway) deleteTemplate(w http.ResponseWriter, r *http.Request, ref string) {
	t, err := g.template(r.Context(), ref)
	switch {
	case errdefs.Is(err, errdefs.KindNotFound):
		g.toAnyNode(w, r)
		return
	case err != nil:
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	if u, err := g.nodeURL(r.Context(), t.Spec.Node, "template "+t.Name, false); err == nil {
		rec := &recorder{ResponseWriter: w}
		g.forward(rec, r, u)
		if rec.status/100 == 2 {
			// The node removed the record; one it left (it answered for
			// a local template of that name only) goes now.
			g.dropRecord(r.Context(), t)
		}
		return
	}
	if err := g.records.DeleteTemplate(r.Context(), t); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (g *Gateway) dropRecord(ctx context.Context, t *v1alpha1.Template) {
	cur, err := g.records.Template(ctx, t.Name)
	if err != nil || cur.UID != t.UID {
		return
	}
	if err := g.records.DeleteTemplate(ctx, cur); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		g.cfg.Log.Warn("gateway: deleting a template's record failed", "template", t.Name, "err", err)
	}
}

// listedTemplate is what the merge reads of a node's GET /templates item.
type listedTemplate struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
	StoreName  string `json:"storeName"`
}

// listTemplates is GET /templates: every live node's answer for the
// caller, merged by template ID — the caller team's records (the entry of
// the record's node first), then the nodes' public templates (builtins) —
// and the team's records no live node listed.
func (g *Gateway) listTemplates(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	nodes, err := g.nodes(ctx)
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	recs, err := g.records.Templates(ctx)
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	p, _ := caller(ctx)
	ours := map[string]*v1alpha1.Template{}
	byName := map[string]*v1alpha1.Template{}
	for i := range recs {
		byName[recs[i].Name] = &recs[i]
		if p.Can(tenant.Owner{Team: recs[i].Spec.Team}) {
			ours[recs[i].Name] = &recs[i]
		}
	}
	// Each live node's list, as the caller (fanout.go); a node that does
	// not answer is left out (its templates are the records' below).
	answers := map[string][]json.RawMessage{}
	for _, rep := range g.askLive(r, nodes, http.MethodGet, "/templates", "", nil) {
		var items []json.RawMessage
		if rep.failure() == "" && json.Unmarshal(rep.body, &items) == nil {
			answers[rep.node] = items
		}
	}
	if len(answers) == 0 {
		writeError(w, http.StatusServiceUnavailable, "no live node answered (%d nodes known)", len(nodes))
		return
	}
	byID := map[string]json.RawMessage{}
	var order []string
	take := func(node string, own bool) {
		for _, raw := range answers[node] {
			var lt listedTemplate
			if json.Unmarshal(raw, &lt) != nil || lt.TemplateID == "" {
				continue
			}
			if _, seen := byID[lt.TemplateID]; seen {
				continue
			}
			rec, isRec := byName[lt.TemplateID]
			_, isOurs := ours[lt.TemplateID]
			switch {
			case own && (!isOurs || rec.Spec.Node != node):
				continue
			case isRec && !isOurs && !rec.Spec.Public:
				continue // another team's, published no longer (a pulled copy may lag)
			case !isRec && (!lt.Public || builds.IsStoreName(lt.StoreName)):
				// An API template with no record: deleted from the
				// cluster (this node drops its copy on its next use).
				continue
			}
			byID[lt.TemplateID] = raw
			order = append(order, lt.TemplateID)
		}
	}
	for _, n := range nodes { // the records' own nodes first
		take(n.Name, true)
	}
	for _, n := range nodes {
		take(n.Name, false)
	}
	for id, rec := range ours {
		if _, ok := byID[id]; ok {
			continue
		}
		status := "waiting"
		if rec.Spec.Digest != "" {
			status = "ready"
		}
		names := []string{}
		for _, a := range rec.Spec.Aliases {
			names = append(names, rec.Spec.Team+"/"+a)
		}
		// E2B's Template as a node answers it, from what the record says.
		at := rec.CreationTimestamp.UTC()
		raw, _ := json.Marshal(map[string]any{"templateID": id, "buildID": rec.Spec.Build, "cpuCount": 0, "memoryMB": 0, "diskSizeMB": 0,
			"public": rec.Spec.Public, "aliases": append([]string{}, rec.Spec.Aliases...), "names": names, "createdAt": at, "updatedAt": at,
			"createdBy": nil, "lastSpawnedAt": nil, "spawnCount": 0, "buildCount": 1, "envdVersion": "", "buildStatus": status})
		byID[id] = raw
		order = append(order, id)
	}
	out := make([]json.RawMessage, 0, len(order))
	for _, id := range order {
		out = append(out, byID[id])
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(out)
}
