package cluster

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeInfo is one node as its Lease shows it.
type NodeInfo struct {
	Name     string
	Endpoint string
	Holder   string
	// RenewedAt is the Lease's renewTime; Live says whether it is within
	// the Lease's duration of now (the clocks of the node and of the
	// reader are assumed synchronised, as Kubernetes' own leader election
	// assumes).
	RenewedAt time.Time
	Duration  time.Duration
	Live      bool
	// DrainedAt is when `cella node drain` marked the node (zero: not
	// drained); a drained node gets no new sandboxes.
	DrainedAt time.Time
	Capacity  Capacity
	// CapacityErr is set when the capacity annotation did not parse.
	CapacityErr string
}

// Nodes lists the cluster's nodes from their Leases, by name.
func Nodes(ctx context.Context, c client.Client, ns string) ([]NodeInfo, error) {
	var l coordinationv1.LeaseList
	if err := c.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{LabelRole: RoleNode}); err != nil {
		return nil, kindOf(err, "list node leases")
	}
	now := time.Now()
	out := make([]NodeInfo, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, nodeInfo(&l.Items[i], now))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func nodeInfo(l *coordinationv1.Lease, now time.Time) NodeInfo {
	n := NodeInfo{Name: l.Labels[LabelNode], Endpoint: l.Annotations[AnnotationEndpoint], Live: leaseLive(l, now)}
	if n.Name == "" {
		n.Name = strings.TrimPrefix(l.Name, LeasePrefix)
	}
	if l.Spec.HolderIdentity != nil {
		n.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.RenewTime != nil {
		n.RenewedAt = l.Spec.RenewTime.Time
	}
	if l.Spec.LeaseDurationSeconds != nil {
		n.Duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if v, ok := l.Annotations[AnnotationDrain]; ok {
		n.DrainedAt, _ = time.Parse(time.RFC3339, v)
		if n.DrainedAt.IsZero() { // marked by hand with another value: drained all the same
			n.DrainedAt = time.Unix(0, 0)
		}
	}
	if err := json.Unmarshal([]byte(l.Annotations[AnnotationCapacity]), &n.Capacity); err != nil {
		n.CapacityErr = err.Error()
	}
	return n
}

// Drained reports whether the node is marked drained.
func (n NodeInfo) Drained() bool { return !n.DrainedAt.IsZero() }

// State is the node's state in a word: live, drained (live, placing
// nothing), or lapsed (its Lease was not renewed in time).
func (n NodeInfo) State() string {
	switch {
	case !n.Live:
		return "lapsed"
	case n.Drained():
		return "drained"
	}
	return "live"
}

// leaseLive reports whether l was renewed within its duration of now.
func leaseLive(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	return now.Before(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
}
