package v1alpha1

import "k8s.io/apimachinery/pkg/runtime"

// The DeepCopy functions controller-gen would generate, written out: every
// pointer, slice and map of a type is copied, never shared
// (TestDeepCopyShares checks each one).

func (in *SandboxLifecycle) DeepCopyInto(out *SandboxLifecycle) {
	*out = *in
	if in.EndAt != nil {
		out.EndAt = in.EndAt.DeepCopy()
	}
}

func (in *SandboxSpec) DeepCopyInto(out *SandboxSpec) {
	*out = *in
	in.Lifecycle.DeepCopyInto(&out.Lifecycle)
}

func (in *SandboxStatus) DeepCopyInto(out *SandboxStatus) {
	*out = *in
	if in.StartedAt != nil {
		out.StartedAt = in.StartedAt.DeepCopy()
	}
}

func (in *Sandbox) DeepCopyInto(out *Sandbox) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

func (in *Sandbox) DeepCopy() *Sandbox {
	if in == nil {
		return nil
	}
	out := new(Sandbox)
	in.DeepCopyInto(out)
	return out
}

func (in *Sandbox) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *SandboxList) DeepCopyInto(out *SandboxList) {
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Sandbox, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

func (in *SandboxList) DeepCopy() *SandboxList {
	if in == nil {
		return nil
	}
	out := new(SandboxList)
	in.DeepCopyInto(out)
	return out
}

func (in *SandboxList) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *TemplateSpec) DeepCopyInto(out *TemplateSpec) {
	*out = *in
	if in.Aliases != nil {
		out.Aliases = append([]string(nil), in.Aliases...)
	}
	in.TemplateBuild.DeepCopyInto(&out.TemplateBuild)
	if in.Tags != nil {
		out.Tags = make([]TemplateTag, len(in.Tags))
		for i := range in.Tags {
			out.Tags[i] = in.Tags[i]
			in.Tags[i].TemplateBuild.DeepCopyInto(&out.Tags[i].TemplateBuild)
		}
	}
}

func (in *TemplateBuild) DeepCopyInto(out *TemplateBuild) {
	*out = *in
	if in.Services != nil {
		out.Services = append([]string(nil), in.Services...)
	}
}

func (in *Template) DeepCopyInto(out *Template) {
	*out = *in
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
}

func (in *Template) DeepCopy() *Template {
	if in == nil {
		return nil
	}
	out := new(Template)
	in.DeepCopyInto(out)
	return out
}

func (in *Template) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *TemplateList) DeepCopyInto(out *TemplateList) {
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Template, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

func (in *TemplateList) DeepCopy() *TemplateList {
	if in == nil {
		return nil
	}
	out := new(TemplateList)
	in.DeepCopyInto(out)
	return out
}

func (in *TemplateList) DeepCopyObject() runtime.Object { return in.DeepCopy() }
