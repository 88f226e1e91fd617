package gateway

import (
	"net/http"
	"slices"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Pinned creates. Most creates may go to any node (place.go), but two kinds
// can only run where their data is:
//   - a create whose volumeMounts name a volume of the cluster goes to the
//     volume's node (its Volume record, volumes.go);
//   - a create from a snapshot (templateID = a snapshot's ID or name) goes
//     to the node holding the snapshot, found by asking the live nodes
//     (snapshots.go) when no node has a template of that name.
//
// When that node cannot take it (not live, gone, drained), the create is
// refused naming the volume or snapshot and the node: placed elsewhere it
// would fail, or worse, start without the data.

// placeCreate picks the node for a create of template tpl: its data's
// node, else the best one (pick). ok false: no node at all.
func (g *Gateway) placeCreate(r *http.Request, nodes []cluster.NodeInfo, tpl string) (cluster.NodeInfo, *pendingCreate, bool, error) {
	name, what, err := g.pinOf(r, nodes, tpl)
	if err != nil {
		return cluster.NodeInfo{}, nil, false, err
	}
	if name == "" {
		n, pc, ok := g.pick(nodes, tpl)
		return n, pc, ok, nil
	}
	n, found := findNode(nodes, name)
	if err := unusable(n, found, name, what, false); err != nil {
		return n, nil, false, err
	}
	if n.Drained() {
		return n, nil, false, errdefs.Unavailable("%s is on node %s, which is drained: a sandbox using it can only run there (cella node undrain %s)", what, name, name)
	}
	g.mu.Lock()
	pc := &pendingCreate{}
	g.pending[name] = append(g.pending[name], pc)
	g.mu.Unlock()
	return n, pc, true, nil
}

// pinOf is the node a create must go to ("" when any will do) and what is
// there (for errors).
func (g *Gateway) pinOf(r *http.Request, nodes []cluster.NodeInfo, tpl string) (node, what string, err error) {
	body, err := takeBody(r) // place.go
	if err != nil {
		return "", "", err
	}
	node, what, err = g.volumesNode(r.Context(), body)
	if err != nil {
		return "", "", err
	}
	for _, n := range nodes {
		if slices.Contains(n.Capacity.Templates, tpl) {
			return node, what, nil // a template, not a snapshot
		}
	}
	snap, err := g.findSnapshot(r, nodes, tpl)
	if err != nil || snap.node == "" {
		return node, what, err
	}
	if node != "" && snap.node != node {
		return "", "", errdefs.Conflict("%s is on node %s and snapshot %q on node %s: a sandbox can only be made where both are", what, node, tpl, snap.node)
	}
	return snap.node, "snapshot " + quote(tpl), nil
}
