package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Volumes through the gateway. A volume's files are on one node; its
// Volume record (cluster.VolumeRecords) says which:
//   - POST /volumes picks a live node as for a sandbox create, reserves
//     the record (its name is the team's and the volume's: a name taken
//     anywhere in the cluster is E2B's 409), forwards the create there and
//     completes the record with the ID the node answered (a refused create
//     drops the reservation).
//   - GET and DELETE /volumes/{name or ID} and /volumecontent/{ID}/... go
//     to the record's node (a delete the node did drops the record); a node
//     that is not live is a 503 naming the volume and the node.
//   - GET /volumes asks every live node (each lists the caller's team's, as
//     standalone) and keeps the recorded ones; a recorded volume whose node
//     did not answer is listed from its record with "unavailable" saying
//     why.
//   - A sandbox create whose volumeMounts name a recorded volume is placed
//     on its node, or refused naming the volume and its node (place.go).
//
// Volumes made on a node directly, not through a gateway, are that node's
// own: no record, so the gateway neither lists nor routes them.

// volumeContentID is the volume ID of /volumecontent/{id}/...
func volumeContentID(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, "/volumecontent/")
	if !ok {
		return "", false
	}
	id, _, _ := strings.Cut(rest, "/")
	return id, id != ""
}

// isVolumes is /volumes and /volumes/{ref}.
func isVolumes(p string) bool {
	return p == "/volumes" || (strings.HasPrefix(p, "/volumes/") && !strings.Contains(p[len("/volumes/"):], "/"))
}

// volumeContent forwards a request for a volume's files to its node. Its
// bearer is the volume's token or an API key, which the node checks (the
// gateway does not authenticate it: a volume token is no API key), so it
// is forwarded as the client sent it. An unknown ID is the node's answer
// for a volume the bearer does not open, word for word.
func (g *Gateway) volumeContent(w http.ResponseWriter, r *http.Request, id string) {
	if r.Header.Get("X-API-Key") == "" && !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		writeError(w, http.StatusUnauthorized, "missing volume token: send it as Authorization: Bearer <token> (the token of POST or GET /volumes)")
		return
	}
	noAccess := func() { writeError(w, http.StatusNotFound, "volume %q not found, or the token does not open it", id) }
	v, err := g.volumes.ByID(r.Context(), id)
	if errdefs.Is(err, errdefs.KindNotFound) {
		noAccess()
		return
	}
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	u, err := g.nodeURL(r.Context(), v.Spec.Node, fmt.Sprintf("volume %q", id), false)
	if err != nil {
		// Only the node can check a volume token: that the volume exists
		// and where is told to a key of its owner alone.
		if p, aerr := g.authenticate(r); aerr != nil || !p.Can(tenant.Owner{Team: v.Spec.Team, Key: v.Spec.KeyID}) {
			noAccess()
			return
		}
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	g.forward(w, r, u)
}

// serveVolumes routes /volumes and /volumes/{ref}.
func (g *Gateway) serveVolumes(w http.ResponseWriter, r *http.Request) {
	ref := strings.TrimPrefix(r.URL.Path, "/volumes")
	ref = strings.TrimPrefix(ref, "/")
	switch {
	case ref == "" && r.Method == http.MethodPost:
		g.createVolume(w, r)
	case ref == "" && r.Method == http.MethodGet:
		g.listVolumes(w, r)
	case ref != "" && (r.Method == http.MethodGet || r.Method == http.MethodDelete):
		g.oneVolume(w, r, ref)
	default:
		writeError(w, http.StatusMethodNotAllowed, "%s %s: no such volume route", r.Method, r.URL.Path)
	}
}

// volumeCreateTimeout bounds a node's answer to a reserved volume create,
// well within cluster.VolumeRecords' reservation expiry (5 minutes).
const volumeCreateTimeout = 2 * time.Minute

func (g *Gateway) createVolume(w http.ResponseWriter, r *http.Request) {
	body, err := takeBody(r) // place.go
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%v", err)
		return
	}
	var in struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(body, &in) // a bad body is the node's to refuse
	nodes, ok := g.liveNodes(w, r)
	if !ok {
		return
	}
	n, pc, ok := g.pick(nodes, "") // place.go: the node a sandbox would go to
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "no live node to place the volume on (%d nodes known, none renewing its lease and not drained)", len(nodes))
		return
	}
	g.placedDone(n.Name, pc, false) // a volume is no sandbox: nothing pending
	u, err := urlOf(n)
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	p, _ := caller(r.Context())
	var rec *v1alpha1.Volume
	if in.Name != "" {
		o := p.Owner()
		rec, err = g.volumes.Reserve(r.Context(), v1alpha1.VolumeSpec{Team: o.Team, KeyID: o.Key, Name: in.Name, Node: n.Name})
		if err != nil {
			writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
			return
		}
	}
	if rec == nil {
		g.forward(w, r, u)
		return
	}
	// Reserved, the create runs to its end whatever the client does
	// (bounded well within the reservation's expiry): one cut off by a
	// client that went away could leave a volume on the node whose
	// reservation the gateway then dropped — a volume no gateway routes
	// and no later create of its name can replace.
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(r.Context()), volumeCreateTimeout)
	defer fcancel()
	stop := context.AfterFunc(r.Context(), func() {
		g.cfg.Log.Info("gateway: the client went away during a volume create: it runs to its end", "volume", in.Name, "node", n.Name)
	})
	defer stop()
	// The answer is held until the record is complete: once the client
	// has its 201, every gateway routes the volume.
	b := newBuffered()
	g.forward(b, r.WithContext(fctx), u)
	// The record outlives the client's request (its context may end).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	var made struct {
		VolumeID string `json:"volumeID"`
	}
	if b.status != http.StatusCreated || json.Unmarshal(b.body.Bytes(), &made) != nil || made.VolumeID == "" {
		if err := g.volumes.Delete(ctx, rec); err != nil {
			g.cfg.Log.Warn("gateway: dropping a refused volume's reservation failed", "volume", in.Name, "err", err)
		}
		b.replay(w)
		return
	}
	if err := g.volumes.Complete(ctx, rec, made.VolumeID); err != nil {
		g.cfg.Log.Error("gateway: recording a volume failed: the gateway will not route it", "volume", in.Name, "id", made.VolumeID, "node", n.Name, "err", err)
		writeError(w, errdefs.HTTPStatus(err), "volume %q was made on node %s as %s, but recording where failed: %v", in.Name, n.Name, made.VolumeID, err)
		return
	}
	g.cfg.Log.Info("gateway: volume placed", "volume", in.Name, "id", made.VolumeID, "node", n.Name)
	b.replay(w)
}

// buffered holds a node's small answer (a create's JSON) for the gateway
// to act on before the client sees it.
type buffered struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newBuffered() *buffered { return &buffered{header: http.Header{}} }

func (b *buffered) Header() http.Header { return b.header }

func (b *buffered) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}

func (b *buffered) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// replay writes the held answer to w.
func (b *buffered) replay(w http.ResponseWriter) {
	for k, v := range b.header {
		w.Header()[k] = v
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}

// volumeOf is the record of the volume the caller means by ref: the name
// of one of its team's volumes, else the ID of one it may act on (as a
// node looks it up). Another team's is not found, word for word.
func (g *Gateway) volumeOf(ctx context.Context, ref string) (*v1alpha1.Volume, error) {
	p, _ := caller(ctx)
	v, err := g.volumes.Named(ctx, p.Team, ref)
	if errdefs.Is(err, errdefs.KindNotFound) {
		v, err = g.volumes.ByID(ctx, ref)
		if err == nil && !p.Can(tenant.Owner{Team: v.Spec.Team, Key: v.Spec.KeyID}) {
			err = errdefs.NotFound("not the caller's")
		}
	}
	if errdefs.Is(err, errdefs.KindNotFound) {
		return nil, errdefs.NotFound("volume %q not found", ref)
	}
	return v, err
}

func (g *Gateway) oneVolume(w http.ResponseWriter, r *http.Request, ref string) {
	v, err := g.volumeOf(r.Context(), ref)
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	u, err := g.nodeURL(r.Context(), v.Spec.Node, fmt.Sprintf("volume %q", ref), false)
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	if r.Method != http.MethodDelete {
		g.forward(w, r, u)
		return
	}
	// The node's answer is held until the record is gone: once the client
	// has its 204, no gateway finds the volume and its name is free (the
	// 204 used to reach the client first, and a create of the name right
	// after it could find the old record).
	b := newBuffered()
	g.forward(b, r, u)
	if b.status == http.StatusNoContent {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
		defer cancel()
		if err := g.volumes.Delete(ctx, v); err != nil {
			g.cfg.Log.Warn("gateway: dropping a deleted volume's record failed", "volume", v.Spec.Name, "err", err)
		}
	}
	b.replay(w)
}

// listedVolume is one item of a node's GET /volumes.
type listedVolume struct {
	ID   string `json:"volumeID"`
	Name string `json:"name"`
	raw  json.RawMessage
}

// unavailableVolume is a recorded volume whose node did not answer.
type unavailableVolume struct {
	VolumeID  string    `json:"volumeID"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	UsedBy    []string  `json:"usedBy"`
	Node      string    `json:"node"`
	// Unavailable says why the volume cannot be reached.
	Unavailable string `json:"unavailable"`
}

func (g *Gateway) listVolumes(w http.ResponseWriter, r *http.Request) {
	nodes, ok := g.liveNodes(w, r)
	if !ok {
		return
	}
	recs, err := g.volumes.List(r.Context())
	if err != nil {
		writeError(w, errdefs.HTTPStatus(err), "%s", err.Error())
		return
	}
	replies := g.askLive(r, nodes, http.MethodGet, "/volumes", "", nil)
	if rf, ok := refusal(replies); ok {
		passOn(w, rf)
		return
	}
	recorded := map[string]string{} // volume ID → node
	for _, v := range recs {
		if v.Spec.VolumeID != "" {
			recorded[v.Spec.VolumeID] = v.Spec.Node
		}
	}
	var items []listedVolume
	why := map[string]string{} // node → why it did not answer
	for _, n := range nodes {
		why[n.Name] = fmt.Sprintf("node %s is not live", n.Name)
		if !n.Live {
			why[n.Name] = deadReason(n)
		}
	}
	for _, rep := range replies {
		if f := rep.failure(); f != "" {
			why[rep.node] = fmt.Sprintf("node %s did not answer: %s", rep.node, f)
			continue
		}
		delete(why, rep.node)
		var raws []json.RawMessage
		if err := json.Unmarshal(rep.body, &raws); err != nil {
			why[rep.node] = fmt.Sprintf("node %s answered a bad list: %v", rep.node, err)
			continue
		}
		for _, raw := range raws {
			it := listedVolume{raw: raw}
			if json.Unmarshal(raw, &it) == nil && recorded[it.ID] == rep.node {
				items = append(items, it)
			}
		}
	}
	for _, v := range recs {
		reason, down := why[v.Spec.Node]
		if _, known := findNode(nodes, v.Spec.Node); !known {
			reason, down = fmt.Sprintf("node %s has left the cluster", v.Spec.Node), true
		}
		if !down || v.Spec.VolumeID == "" || !visible(r.Context(), tenant.Owner{Team: v.Spec.Team, Key: v.Spec.KeyID}) {
			continue
		}
		raw, err := json.Marshal(unavailableVolume{VolumeID: v.Spec.VolumeID, Name: v.Spec.Name, CreatedAt: v.CreationTimestamp.UTC(),
			UsedBy: []string{}, Node: v.Spec.Node, Unavailable: reason})
		if err != nil {
			writeError(w, http.StatusInternalServerError, "%v", err)
			return
		}
		items = append(items, listedVolume{ID: v.Spec.VolumeID, Name: v.Spec.Name, raw: raw})
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].Name != items[j].Name {
			return items[i].Name < items[j].Name
		}
		return items[i].ID < items[j].ID
	})
	out := make([]json.RawMessage, 0, len(items))
	for _, it := range items {
		out = append(out, it.raw)
	}
	writeJSONOut(w, http.StatusOK, out)
}

// mountsOf are the volume names a create's volumeMounts name.
func mountsOf(body []byte) []string {
	var b struct {
		VolumeMounts []struct {
			Name string `json:"name"`
		} `json:"volumeMounts"`
	}
	_ = json.Unmarshal(body, &b) // a bad body is the node's to refuse
	var out []string
	for _, m := range b.VolumeMounts {
		if m.Name != "" {
			out = append(out, m.Name)
		}
	}
	return out
}

// volumesNode is the node holding the recorded volumes a create mounts
// ("" when it mounts none the cluster records), or an error naming the
// volumes when they are on two nodes.
func (g *Gateway) volumesNode(ctx context.Context, body []byte) (node, what string, err error) {
	for _, name := range mountsOf(body) {
		v, err := g.volumeOf(ctx, name)
		if errdefs.Is(err, errdefs.KindNotFound) {
			continue // the node answers for a volume it does not know
		}
		if err != nil {
			return "", "", err
		}
		if node != "" && v.Spec.Node != node {
			return "", "", errdefs.Conflict("%s is on node %s and volume %q on node %s: a sandbox can only mount volumes of one node", what, node, name, v.Spec.Node)
		}
		node, what = v.Spec.Node, fmt.Sprintf("volume %q", name)
	}
	return node, what, nil
}
