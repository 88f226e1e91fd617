package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Volume is where one of the cluster's volumes lives: its files are on one
// node, so every request for it and every sandbox that mounts it goes
// there. Its name is derived from the team and the volume's name
// (cluster.VolumeRecordName), so a create is atomic: two gateways cannot
// both place a team's volume "data". A gateway writes it: reserved before
// it forwards the create (VolumeID empty), completed with the ID the node
// answered, deleted after the node deleted the volume.
type Volume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VolumeSpec `json:"spec"`
}

// VolumeSpec is a volume's owner, names and node.
type VolumeSpec struct {
	// Team and KeyID own the volume (tenant.Owner).
	Team  string `json:"team"`
	KeyID string `json:"keyID,omitempty"`
	// Name is the volume's name in its team; VolumeID the node's ID of it
	// ("" while the create is in flight).
	Name     string `json:"name"`
	VolumeID string `json:"volumeID,omitempty"`
	// Node is the node (its Lease) that holds the volume's files.
	Node string `json:"node"`
}

// VolumeList is a list of Volumes.
type VolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Volume `json:"items"`
}

func (in *Volume) DeepCopyInto(out *Volume) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
}

func (in *Volume) DeepCopy() *Volume {
	if in == nil {
		return nil
	}
	out := new(Volume)
	in.DeepCopyInto(out)
	return out
}

func (in *Volume) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *VolumeList) DeepCopyInto(out *VolumeList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Volume, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

func (in *VolumeList) DeepCopy() *VolumeList {
	if in == nil {
		return nil
	}
	out := new(VolumeList)
	in.DeepCopyInto(out)
	return out
}

func (in *VolumeList) DeepCopyObject() runtime.Object { return in.DeepCopy() }
