package cluster

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ArchiveKeySecret is the Secret holding the cluster's archive key (data
// key "key", 32 random bytes): every node seals and opens the archive
// store's objects with it (internal/archive), so a sandbox paused on one
// node resumes on any other, and the store never sees a memory image in
// clear.
const ArchiveKeySecret = "cella-archive-key"

// ArchiveKey returns the cluster's archive key, making it if no node has
// yet.
func ArchiveKey(ctx context.Context, c client.Client, ns string) ([]byte, error) {
	k, err := sharedSecret(ctx, c, ns, ArchiveKeySecret, "archive-key", func() ([]byte, error) {
		k := make([]byte, 32)
		_, err := rand.Read(k)
		return k, err
	})
	if err == nil && len(k) != 32 {
		return nil, errdefs.InvalidArgument("secret %s/%s: the archive key is %d bytes, want 32", ns, ArchiveKeySecret, len(k))
	}
	return k, err
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
// stays that node's (HeldError), whatever its phase: the holder resumes
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
			sb.Status.Phase = v1alpha1.SandboxPaused
			sb.Status.Message = fmt.Sprintf("moved from node %s at %s", from, time.Now().UTC().Format(time.RFC3339))
			if err := r.UpdateSandboxStatus(ctx, sb); err != nil && !errdefs.Is(err, errdefs.KindConflict) {
				return err
			}
			return nil
		}
		err = kindOf(err, "move sandbox %s to node %s", id, node)
		if !errdefs.Is(err, errdefs.KindConflict) || attempt == 5 {
			return err
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

func (r *Records) nodeLive(ctx context.Context, name string) (bool, error) {
	nodes, err := Nodes(ctx, r.c, r.ns)
	if err != nil {
		return false, err
	}
	for _, n := range nodes {
		if n.Name == name {
			return n.Live, nil
		}
	}
	return false, nil
}
