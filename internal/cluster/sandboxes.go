package cluster

import (
	"context"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Records are the cluster's Sandbox and Template resources in one
// namespace. Every update carries the resourceVersion the caller read, so
// two writers never overwrite each other: the second gets a
// errdefs.KindConflict and reads again.
type Records struct {
	c  client.Client
	ns string
}

// NewRecords keeps records in namespace ns of the API server c talks to.
func NewRecords(c client.Client, ns string) *Records {
	return &Records{c: c, ns: ns}
}

// CreateSandbox records a new sandbox (its Name is the sandbox ID); a
// sandbox with that ID already recorded is a conflict. sb gets the stored
// object's metadata (resourceVersion included).
func (r *Records) CreateSandbox(ctx context.Context, sb *v1alpha1.Sandbox) error {
	sb.Namespace = r.ns
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	sb.Labels[LabelNode] = sb.Spec.Node
	status := sb.Status
	if err := r.c.Create(ctx, sb); err != nil {
		return kindOf(err, "record sandbox %s", sb.Name)
	}
	// The status subresource ignores status on create: written separately,
	// against the resourceVersion create returned.
	if status != (v1alpha1.SandboxStatus{}) {
		sb.Status = status
		return r.UpdateSandboxStatus(ctx, sb)
	}
	return nil
}

// Sandbox reads the record of sandbox id.
func (r *Records) Sandbox(ctx context.Context, id string) (*v1alpha1.Sandbox, error) {
	sb := &v1alpha1.Sandbox{}
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: r.ns, Name: id}, sb); err != nil {
		return nil, kindOf(err, "sandbox %s", id)
	}
	return sb, nil
}

// UpdateSandboxStatus writes sb.Status if the record is still at
// sb.ResourceVersion (else a conflict).
func (r *Records) UpdateSandboxStatus(ctx context.Context, sb *v1alpha1.Sandbox) error {
	if sb.ResourceVersion == "" {
		return errdefs.InvalidArgument("update sandbox %s: no resourceVersion (read it first)", sb.Name)
	}
	if err := r.c.Status().Update(ctx, sb); err != nil {
		return kindOf(err, "update sandbox %s", sb.Name)
	}
	return nil
}

// DeleteSandbox removes the record of sb if it is still at
// sb.ResourceVersion (a record someone changed since is a conflict).
func (r *Records) DeleteSandbox(ctx context.Context, sb *v1alpha1.Sandbox) error {
	rv, uid := sb.ResourceVersion, sb.UID
	if err := r.c.Delete(ctx, sb, client.Preconditions{ResourceVersion: &rv, UID: &uid}); err != nil {
		return kindOf(err, "delete sandbox %s", sb.Name)
	}
	return nil
}

// Sandboxes lists the recorded sandboxes; node != "" only that node's.
func (r *Records) Sandboxes(ctx context.Context, node string) ([]v1alpha1.Sandbox, error) {
	var l v1alpha1.SandboxList
	opts := []client.ListOption{client.InNamespace(r.ns)}
	if node != "" {
		opts = append(opts, client.MatchingLabels{LabelNode: node})
	}
	if err := r.c.List(ctx, &l, opts...); err != nil {
		return nil, kindOf(err, "list sandboxes")
	}
	return l.Items, nil
}

// MarkLost sets every Running or Paused sandbox of node to Lost with
// reason, each with a resourceVersion-checked update (one changed meanwhile
// is read again and re-decided). It returns the IDs it marked.
func (r *Records) MarkLost(ctx context.Context, node, reason string) ([]string, error) {
	list, err := r.Sandboxes(ctx, node)
	if err != nil {
		return nil, err
	}
	var lost []string
	for i := range list {
		sb := &list[i]
		for attempt := 0; ; attempt++ {
			if sb.Status.Phase == v1alpha1.SandboxLost || sb.Spec.Node != node {
				break
			}
			sb.Status.Phase = v1alpha1.SandboxLost
			sb.Status.Message = reason
			err := r.UpdateSandboxStatus(ctx, sb)
			if err == nil {
				lost = append(lost, sb.Name)
				break
			}
			if !errdefs.Is(err, errdefs.KindConflict) || attempt == 5 {
				return lost, err
			}
			if sb, err = r.Sandbox(ctx, sb.Name); err != nil {
				if errdefs.Is(err, errdefs.KindNotFound) {
					break
				}
				return lost, err
			}
		}
	}
	return lost, nil
}

// PutTemplate records or updates a template (an update is
// resourceVersion-checked against what t carries).
func (r *Records) PutTemplate(ctx context.Context, t *v1alpha1.Template) error {
	t.Namespace = r.ns
	if t.ResourceVersion == "" {
		if err := r.c.Create(ctx, t); err != nil {
			return kindOf(err, "record template %s", t.Name)
		}
		return nil
	}
	if err := r.c.Update(ctx, t); err != nil {
		return kindOf(err, "update template %s", t.Name)
	}
	return nil
}

// Template reads the record of template id.
func (r *Records) Template(ctx context.Context, id string) (*v1alpha1.Template, error) {
	t := &v1alpha1.Template{}
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: r.ns, Name: id}, t); err != nil {
		return nil, kindOf(err, "template %s", id)
	}
	return t, nil
}

// LabelNode on a Sandbox names its node, so a node's sandboxes are one
// label-selected list (spec.node is the field of record; CreateSandbox
// sets the label from it).
const LabelNode = "cella.dev/node"
