package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The cluster's volumes: a volume's files are on one node, and its Volume
// record says which (v1alpha1.Volume). The record's name is a hash of the
// team and the volume's name, so reserving it is the cluster-wide check
// that the name is free: two gateways creating a team's "data" at once
// get one record, the other a conflict.

// LabelVolumeID is a Volume record's volume ID (lookups by ID).
const LabelVolumeID = "cella.dev/volume-id"

// staleReservation is how long a reservation without an ID (a create in
// flight) holds its name: a gateway that died mid-create does not keep the
// name taken for ever. A volume create formats and mounts a disk image:
// seconds, far below this.
const staleReservation = 5 * time.Minute

// VolumeRecordName is the record name of team's volume name.
func VolumeRecordName(team, name string) string {
	h := sha256.Sum256([]byte(team + "\x00" + name))
	return "v" + hex.EncodeToString(h[:20])
}

// VolumeRecords are the Volume records of one namespace.
type VolumeRecords struct {
	c  client.Client
	ns string
}

// NewVolumeRecords keeps Volume records in namespace ns.
func NewVolumeRecords(c client.Client, ns string) *VolumeRecords {
	return &VolumeRecords{c: c, ns: ns}
}

// Reserve records that team's volume name is being made on node; the name
// taken (by a volume, or a create in flight) is errdefs.KindConflict. A
// reservation older than staleReservation that never got its ID is taken
// over.
func (r *VolumeRecords) Reserve(ctx context.Context, spec v1alpha1.VolumeSpec) (*v1alpha1.Volume, error) {
	spec.VolumeID = ""
	v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: VolumeRecordName(spec.Team, spec.Name),
		Labels: map[string]string{LabelNode: spec.Node}}, Spec: spec}
	err := kindOf(r.c.Create(ctx, v), "reserve volume %s", spec.Name)
	if !errdefs.Is(err, errdefs.KindConflict) {
		return v, err
	}
	old, gerr := r.get(ctx, v.Name)
	if gerr != nil || old.Spec.VolumeID != "" || time.Since(old.CreationTimestamp.Time) < staleReservation {
		return nil, errdefs.Conflict("volume %q already exists", spec.Name)
	}
	if err := r.Delete(ctx, old); err != nil {
		return nil, errdefs.Conflict("volume %q already exists", spec.Name)
	}
	v.ResourceVersion = ""
	if err := kindOf(r.c.Create(ctx, v), "reserve volume %s", spec.Name); err != nil {
		if errdefs.Is(err, errdefs.KindConflict) {
			return nil, errdefs.Conflict("volume %q already exists", spec.Name)
		}
		return nil, err
	}
	return v, nil
}

// Complete sets the ID the node gave the reserved volume v (checked
// against v's resourceVersion).
func (r *VolumeRecords) Complete(ctx context.Context, v *v1alpha1.Volume, id string) error {
	v.Spec.VolumeID = id
	v.Labels[LabelVolumeID] = id
	return kindOf(r.c.Update(ctx, v), "record volume %s", v.Spec.Name)
}

func (r *VolumeRecords) get(ctx context.Context, name string) (*v1alpha1.Volume, error) {
	v := &v1alpha1.Volume{}
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: r.ns, Name: name}, v); err != nil {
		return nil, kindOf(err, "volume record %s", name)
	}
	return v, nil
}

// Named is team's volume called name (a reservation in flight is not
// found).
func (r *VolumeRecords) Named(ctx context.Context, team, name string) (*v1alpha1.Volume, error) {
	v, err := r.get(ctx, VolumeRecordName(team, name))
	if err == nil && v.Spec.VolumeID == "" {
		err = errdefs.NotFound("volume %q not found", name)
	}
	return v, err
}

// ByID is the volume with this ID.
func (r *VolumeRecords) ByID(ctx context.Context, id string) (*v1alpha1.Volume, error) {
	if len(validation.IsValidLabelValue(id)) > 0 || id == "" {
		return nil, errdefs.NotFound("volume %q not found", id) // no volume ID is that
	}
	var l v1alpha1.VolumeList
	if err := r.c.List(ctx, &l, client.InNamespace(r.ns), client.MatchingLabels{LabelVolumeID: id}); err != nil {
		return nil, kindOf(err, "look up volume %s", id)
	}
	for i := range l.Items {
		if l.Items[i].Spec.VolumeID == id {
			return &l.Items[i], nil
		}
	}
	return nil, errdefs.NotFound("volume %q not found", id)
}

// List is every recorded volume (in-flight reservations included).
func (r *VolumeRecords) List(ctx context.Context) ([]v1alpha1.Volume, error) {
	var l v1alpha1.VolumeList
	if err := r.c.List(ctx, &l, client.InNamespace(r.ns)); err != nil {
		return nil, kindOf(err, "list volume records")
	}
	return l.Items, nil
}

// Delete removes v's record if it is still as read.
func (r *VolumeRecords) Delete(ctx context.Context, v *v1alpha1.Volume) error {
	rv, uid := v.ResourceVersion, v.UID
	if err := r.c.Delete(ctx, v, client.Preconditions{ResourceVersion: &rv, UID: &uid}); err != nil {
		return kindOf(err, "delete volume record %s", v.Spec.Name)
	}
	return nil
}
