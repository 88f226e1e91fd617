package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TemplateAlias reserves one template alias for one team cluster-wide.
// Its name is derived from the alias (cluster.AliasRecordName), so taking
// an alias is one Create that fails for all but one writer: two teams
// asking for the same new alias on two nodes at once cannot both get it.
// The node that builds the template creates it before the Template record
// and deletes it with the record.
type TemplateAlias struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec TemplateAliasSpec `json:"spec"`
}

// TemplateAliasSpec is who holds an alias, for which template.
type TemplateAliasSpec struct {
	Alias    string `json:"alias"`
	Team     string `json:"team"`
	Template string `json:"template"`
}

// TemplateAliasList is a list of TemplateAliases.
type TemplateAliasList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TemplateAlias `json:"items"`
}

// KeyUsage is what one API key holds on each node of the cluster: its
// running sandboxes and the creates in flight, with their vCPUs and
// memory. Each node writes its own entry (resourceVersion-checked) before
// it starts a create of the key, after checking the other live nodes'
// entries leave room; entries of nodes whose Lease lapsed do not count.
type KeyUsage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec KeyUsageSpec `json:"spec"`
}

// KeyUsageSpec is a key's usage by node.
type KeyUsageSpec struct {
	KeyID string `json:"keyID"`
	// Nodes maps a node name to what the key holds there.
	Nodes map[string]NodeUsage `json:"nodes,omitempty"`
}

// NodeUsage is what a key holds on one node. vCPUs are kept in
// thousandths (a sandbox may have a fraction of one).
type NodeUsage struct {
	Sandboxes int   `json:"sandboxes"`
	MilliCPUs int64 `json:"milliCPUs"`
	MemoryMB  int64 `json:"memoryMB"`
}

// KeyUsageList is a list of KeyUsages.
type KeyUsageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KeyUsage `json:"items"`
}

func (in *TemplateAlias) DeepCopyInto(out *TemplateAlias) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
}

func (in *TemplateAlias) DeepCopy() *TemplateAlias {
	if in == nil {
		return nil
	}
	out := new(TemplateAlias)
	in.DeepCopyInto(out)
	return out
}

func (in *TemplateAlias) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *TemplateAliasList) DeepCopyInto(out *TemplateAliasList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]TemplateAlias, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

func (in *TemplateAliasList) DeepCopy() *TemplateAliasList {
	if in == nil {
		return nil
	}
	out := new(TemplateAliasList)
	in.DeepCopyInto(out)
	return out
}

func (in *TemplateAliasList) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *KeyUsage) DeepCopyInto(out *KeyUsage) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if in.Spec.Nodes != nil {
		out.Spec.Nodes = make(map[string]NodeUsage, len(in.Spec.Nodes))
		for k, v := range in.Spec.Nodes {
			out.Spec.Nodes[k] = v
		}
	}
}

func (in *KeyUsage) DeepCopy() *KeyUsage {
	if in == nil {
		return nil
	}
	out := new(KeyUsage)
	in.DeepCopyInto(out)
	return out
}

func (in *KeyUsage) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *KeyUsageList) DeepCopyInto(out *KeyUsageList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]KeyUsage, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

func (in *KeyUsageList) DeepCopy() *KeyUsageList {
	if in == nil {
		return nil
	}
	out := new(KeyUsageList)
	in.DeepCopyInto(out)
	return out
}

func (in *KeyUsageList) DeepCopyObject() runtime.Object { return in.DeepCopy() }
