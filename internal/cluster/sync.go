package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Observed is one sandbox as its node sees it.
type Observed struct {
	ID, Team, KeyID, Template string
	Phase                     v1alpha1.SandboxPhase
	StartedAt, EndAt          time.Time
	AutoPause                 bool
	// Archived: paused with its state in the archive store.
	Archived bool
}

// SyncNode makes node's Sandbox records match what the node holds: each
// node is the one writer of its sandboxes' records (it alone knows their
// owner and phase), so it creates the missing, updates the changed and
// deletes the gone — level-triggered, every change resourceVersion-checked,
// so a record someone else touched meanwhile (marked Lost by a gateway) is
// left to the next pass instead of overwritten. A sandbox of another node
// with the same ID is never touched.
func (r *Records) SyncNode(ctx context.Context, node string, observed []Observed) error {
	recs, err := r.Sandboxes(ctx, node)
	if err != nil {
		return err
	}
	have := make(map[string]*v1alpha1.Sandbox, len(recs))
	for i := range recs {
		if recs[i].Spec.Node == node {
			have[recs[i].Name] = &recs[i]
		}
	}
	var errs []error
	seen := make(map[string]bool, len(observed))
	for _, o := range observed {
		seen[o.ID] = true
		want := o.record(node)
		sb, ok := have[o.ID]
		if !ok {
			if err := r.CreateSandbox(ctx, want); err != nil && !errdefs.Is(err, errdefs.KindConflict) {
				errs = append(errs, err)
			}
			continue
		}
		if sb.Status.Phase == want.Status.Phase && sb.Status.Message == want.Status.Message && sb.Status.Archived == want.Status.Archived {
			continue
		}
		sb.Status = want.Status
		if err := r.UpdateSandboxStatus(ctx, sb); err != nil && !errdefs.Is(err, errdefs.KindConflict) {
			errs = append(errs, err)
		}
	}
	for id, sb := range have {
		if seen[id] {
			continue
		}
		if err := r.DeleteSandbox(ctx, sb); err != nil && !errdefs.Is(err, errdefs.KindConflict) && !errdefs.Is(err, errdefs.KindNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (o Observed) record(node string) *v1alpha1.Sandbox {
	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: o.ID},
		Spec: v1alpha1.SandboxSpec{Team: o.Team, KeyID: o.KeyID, Template: o.Template, Node: node,
			Lifecycle: v1alpha1.SandboxLifecycle{AutoPause: o.AutoPause}},
		Status: v1alpha1.SandboxStatus{Phase: o.Phase, Archived: o.Archived},
	}
	if !o.EndAt.IsZero() {
		t := metav1.NewTime(o.EndAt)
		sb.Spec.Lifecycle.EndAt = &t
	}
	if !o.StartedAt.IsZero() {
		t := metav1.NewTime(o.StartedAt)
		sb.Status.StartedAt = &t
	}
	return sb
}
