package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What each API key with a concurrency quota holds on each node: one
// KeyUsage record per key, one entry per node, each written by its node
// only and every write resourceVersion-checked. A node checks the other
// live nodes' entries and writes its own in one update, so two nodes
// claiming a key's last slot at once cannot both pass: the second update
// conflicts, is read again, and sees the first. An entry counts while its
// node's Lease is live; one of a node without a Lease (it stopped) is
// dropped by the next writer.

// KeyUsageName is the KeyUsage record name of key id.
func KeyUsageName(keyID string) string {
	h := sha256.Sum256([]byte(keyID))
	return "k" + hex.EncodeToString(h[:20])
}

// KeyUsages are the KeyUsage records of one namespace as node writes them.
type KeyUsages struct {
	c        client.Client
	ns, node string
}

// NewKeyUsages keeps node's entries of the KeyUsage records in ns.
func NewKeyUsages(c client.Client, ns, node string) *KeyUsages {
	return &KeyUsages{c: c, ns: ns, node: node}
}

// holdAttempts bounds the read-check-write rounds of one Hold: each lost
// round is another node's write of the same key, which takes a create's
// time, so only a burst of creates on many nodes needs more than a few.
const holdAttempts = 50

// Hold writes held as what key holds on this node. With check, first:
// check gets what the key holds on the other live nodes, and its error is
// returned with nothing written.
func (k *KeyUsages) Hold(ctx context.Context, keyID string, held quota.Usage, check func(others quota.Usage) error) error {
	for range holdAttempts {
		nodes, err := Nodes(ctx, k.c, k.ns)
		if err != nil {
			return err
		}
		leased, live := map[string]bool{}, map[string]bool{}
		for _, n := range nodes {
			leased[n.Name] = true
			live[n.Name] = n.Live
		}
		ku := &v1alpha1.KeyUsage{}
		err = k.c.Get(ctx, types.NamespacedName{Namespace: k.ns, Name: KeyUsageName(keyID)}, ku)
		exists := err == nil
		if err := kindOf(err, "usage of API key %s", keyID); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			return err
		}
		var others quota.Usage
		for node, u := range ku.Spec.Nodes {
			if node != k.node && live[node] {
				others = others.Plus(fromNodeUsage(u))
			}
		}
		if check != nil {
			if err := check(others); err != nil {
				return err
			}
		}
		if !exists {
			ku = &v1alpha1.KeyUsage{ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: KeyUsageName(keyID)}, Spec: v1alpha1.KeyUsageSpec{KeyID: keyID}}
		}
		for node := range ku.Spec.Nodes {
			if !leased[node] {
				delete(ku.Spec.Nodes, node) // stopped: its sandboxes ended with it
			}
		}
		if ku.Spec.Nodes == nil {
			ku.Spec.Nodes = map[string]v1alpha1.NodeUsage{}
		}
		ku.Spec.Nodes[k.node] = toNodeUsage(held)
		if exists {
			err = kindOf(k.c.Update(ctx, ku), "record the usage of API key %s", keyID)
		} else {
			err = kindOf(k.c.Create(ctx, ku), "record the usage of API key %s", keyID)
		}
		if !errdefs.Is(err, errdefs.KindConflict) {
			return err
		}
	}
	return errdefs.Unavailable("usage of API key %s: %d writes in a row lost to other nodes'", keyID, holdAttempts)
}

// Held is what this node's entries say it holds, by key ID.
func (k *KeyUsages) Held(ctx context.Context) (map[string]quota.Usage, error) {
	var l v1alpha1.KeyUsageList
	if err := k.c.List(ctx, &l, client.InNamespace(k.ns)); err != nil {
		return nil, kindOf(err, "list key usage")
	}
	held := map[string]quota.Usage{}
	for _, ku := range l.Items {
		if u, ok := ku.Spec.Nodes[k.node]; ok {
			held[ku.Spec.KeyID] = fromNodeUsage(u)
		}
	}
	return held, nil
}

// Others is what key holds on the other live nodes together.
func (k *KeyUsages) Others(ctx context.Context, keyID string) (quota.Usage, error) {
	nodes, err := Nodes(ctx, k.c, k.ns)
	if err != nil {
		return quota.Usage{}, err
	}
	ku := &v1alpha1.KeyUsage{}
	err = kindOf(k.c.Get(ctx, types.NamespacedName{Namespace: k.ns, Name: KeyUsageName(keyID)}, ku), "usage of API key %s", keyID)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return quota.Usage{}, nil
	}
	if err != nil {
		return quota.Usage{}, err
	}
	var total quota.Usage
	for _, n := range nodes {
		if u, ok := ku.Spec.Nodes[n.Name]; ok && n.Live && n.Name != k.node {
			total = total.Plus(fromNodeUsage(u))
		}
	}
	return total, nil
}

func toNodeUsage(u quota.Usage) v1alpha1.NodeUsage {
	return v1alpha1.NodeUsage{Sandboxes: u.Sandboxes, MilliCPUs: int64(math.Round(u.CPUs * 1000)), MemoryMB: u.MemoryMB}
}

func fromNodeUsage(u v1alpha1.NodeUsage) quota.Usage {
	return quota.Usage{Sandboxes: u.Sandboxes, CPUs: float64(u.MilliCPUs) / 1000, MemoryMB: u.MemoryMB}
}
