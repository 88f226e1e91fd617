package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ArchiveKeySecret is the Secret holding the cluster's archive key (data
// key "key", 32 random bytes in base64): every node seals and opens the archive
// store's objects with it (internal/archive), so a sandbox paused on one
// node resumes on any other, and the store never sees a memory image in
// clear.
const ArchiveKeySecret = "cella-archive-key"

// ArchiveKey returns the cluster's archive key, making it if no node has
// yet.
func ArchiveKey(ctx context.Context, c client.Client, ns string) ([]byte, error) {
	s, err := sharedSecret(ctx, c, ns, ArchiveKeySecret, "archive-key", func() (string, error) {
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return "", err
		}
		return base64.StdEncoding.EncodeToString(k), nil
	})
	if err != nil {
		return nil, err
	}
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(k) != 32 {
		return nil, errdefs.InvalidArgument("secret %s/%s: the archive key is not 32 bytes in base64", ns, ArchiveKeySecret)
	}
	return k, nil
}

// EgressCASecret holds the cluster's egress CA (data key "key": the
// certificate's PEM, then its private key's): every node's proxy signs
// with it, so a sandbox that moves between nodes (its trust store in its
// writable layer) trusts the proxy of whichever node runs it.
const EgressCASecret = "cella-egress-ca"

// EgressCA returns the cluster's egress CA as PEM, made by gen (the first
// node's own CA) if no node has yet.
func EgressCA(ctx context.Context, c client.Client, ns string, gen func() (string, error)) (string, error) {
	return sharedSecret(ctx, c, ns, EgressCASecret, "egress-ca", gen)
}

// HeldError is a Claim refused because another live node holds the
// sandbox.
type HeldError struct{ ID, Node string }

func (e *HeldError) Error() string {
	return fmt.Sprintf("sandbox %s is held by node %s, which is live", e.ID, e.Node)
}

// Claim makes node the holder of sandbox id's record before it restores
// the sandbox from the archive: spec.node (and its label) move with a
// resourceVersion-checked update. A sandbox whose holder's Lease is live
// and which is not drained stays that node's (HeldError), whatever its
// phase: the holder resumes
// its own archive, and of two nodes resuming one archive after its holder
// died, the first update wins and the second then finds a live holder.
// No record (not synced yet) is nothing to move.
func (r *Records) Claim(ctx context.Context, id, node string) error {
	for attempt := 0; ; attempt++ {
		sb, err := r.Sandbox(ctx, id)
		if errdefs.Is(err, errdefs.KindNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		from := sb.Spec.Node
		if from == node {
			// A drained node starts nothing, its own archive included: the
			// sandbox resumes elsewhere (two nodes resuming it would both
			// run it).
			if drained, err := r.nodeDrained(ctx, node); err != nil || drained {
				return cmpErr(err, errdefs.Unavailable("node %s is drained: sandbox %s resumes on another node", node, id))
			}
			return nil
		}
		live, err := r.nodeLive(ctx, from)
		if err != nil {
			return err
		}
		if live {
			return &HeldError{ID: id, Node: from}
		}
		sb.Spec.Node = node
		if sb.Labels == nil {
			sb.Labels = map[string]string{}
		}
		sb.Labels[LabelNode] = node
		err = r.c.Update(ctx, sb) // carries the resourceVersion read
		if err == nil {
			return r.movedStatus(ctx, sb, node, from)
		}
		err = kindOf(err, "move sandbox %s to node %s", id, node)
		if !errdefs.Is(err, errdefs.KindConflict) || attempt == 5 {
			return err
		}
	}
}

// movedStatus marks a record just moved to node as Paused (it was Lost,
// or its old node's last word), retried while the status changes under it;
// a record that moved on meanwhile is left to its new holder.
func (r *Records) movedStatus(ctx context.Context, sb *v1alpha1.Sandbox, node, from string) error {
	msg := fmt.Sprintf("moved from node %s at %s", from, time.Now().UTC().Format(time.RFC3339))
	for attempt := 0; ; attempt++ {
		sb.Status.Phase, sb.Status.Message = v1alpha1.SandboxPaused, msg
		err := r.UpdateSandboxStatus(ctx, sb)
		if err == nil || !errdefs.Is(err, errdefs.KindConflict) || attempt == 5 {
			return err
		}
		if sb, err = r.Sandbox(ctx, sb.Name); err != nil {
			return err
		}
		if sb.Spec.Node != node || sb.Status.Phase != v1alpha1.SandboxLost {
			return nil // moved on, or its new holder recorded it already
		}
	}
}

// Holder is the node sandbox id's record names ("" when it has none).
func (r *Records) Holder(ctx context.Context, id string) (string, error) {
	sb, err := r.Sandbox(ctx, id)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return sb.Spec.Node, nil
}

// nodeLive: name's Lease is live and the node is not drained (a drained
// node's archived sandboxes resume elsewhere).
func (r *Records) nodeLive(ctx context.Context, name string) (bool, error) {
	n, ok, err := r.node(ctx, name)
	return ok && n.Live && !n.Drained(), err
}

// nodeDrained: name is marked drained.
func (r *Records) nodeDrained(ctx context.Context, name string) (bool, error) {
	n, ok, err := r.node(ctx, name)
	return ok && n.Drained(), err
}

func (r *Records) node(ctx context.Context, name string) (NodeInfo, bool, error) {
	nodes, err := Nodes(ctx, r.c, r.ns)
	if err != nil {
		return NodeInfo{}, false, err
	}
	for _, n := range nodes {
		if n.Name == name {
			return n, true, nil
		}
	}
	return NodeInfo{}, false, nil
}

// cmpErr is err if set, else fallback.
func cmpErr(err, fallback error) error {
	if err != nil {
		return err
	}
	return fallback
}
