package v1alpha1

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeepCopyShares: a copy shares no pointer, slice or map with its
// original (the hand-written DeepCopy must copy each one).
func TestDeepCopyShares(t *testing.T) {
	end := metav1.NewTime(time.Unix(100, 0))
	start := metav1.NewTime(time.Unix(50, 0))
	sb := &Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"k": "v"}},
		Spec:       SandboxSpec{Team: "t", Lifecycle: SandboxLifecycle{EndAt: &end}},
		Status:     SandboxStatus{StartedAt: &start},
	}
	cp := sb.DeepCopyObject().(*Sandbox)
	cp.Labels["k"] = "changed"
	cp.Spec.Lifecycle.EndAt.Time = time.Unix(1, 0)
	cp.Status.StartedAt.Time = time.Unix(2, 0)
	if sb.Labels["k"] != "v" || !sb.Spec.Lifecycle.EndAt.Equal(&end) || sb.Spec.Lifecycle.EndAt.Unix() != 100 || sb.Status.StartedAt.Unix() != 50 {
		t.Fatalf("the copy shares state with the original: %+v", sb)
	}
	l := &SandboxList{Items: []Sandbox{*sb}}
	lc := l.DeepCopyObject().(*SandboxList)
	lc.Items[0].Spec.Team = "other"
	lc.Items[0].Spec.Lifecycle.EndAt.Time = time.Unix(3, 0)
	if l.Items[0].Spec.Team != "t" || l.Items[0].Spec.Lifecycle.EndAt.Unix() != 100 {
		t.Fatal("the list copy shares items with the original")
	}

	tpl := &Template{Spec: TemplateSpec{Aliases: []string{"a"}}}
	tc := tpl.DeepCopyObject().(*Template)
	tc.Spec.Aliases[0] = "b"
	tl := &TemplateList{Items: []Template{*tpl}}
	tlc := tl.DeepCopyObject().(*TemplateList)
	tlc.Items[0].Spec.Aliases[0] = "c"
	if tpl.Spec.Aliases[0] != "a" || tl.Items[0].Spec.Aliases[0] != "a" {
		t.Fatal("the template copy shares its aliases")
	}
	built := &Template{Spec: TemplateSpec{TemplateBuild: TemplateBuild{Services: []string{"docker"}},
		Tags: []TemplateTag{{Tag: "v2", TemplateBuild: TemplateBuild{Services: []string{"code-interpreter"}}}}}}
	bc := built.DeepCopy()
	bc.Spec.Services[0], bc.Spec.Tags[0].Services[0], bc.Spec.Tags[0].Tag = "x", "y", "z"
	if built.Spec.Services[0] != "docker" || built.Spec.Tags[0].Services[0] != "code-interpreter" || built.Spec.Tags[0].Tag != "v2" {
		t.Fatal("the template copy shares its services or tags")
	}
	vol := &Volume{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"k": "v"}}, Spec: VolumeSpec{Name: "data"}}
	vc := vol.DeepCopyObject().(*Volume)
	vc.Labels["k"] = "changed"
	vl := &VolumeList{Items: []Volume{*vol}}
	vlc := vl.DeepCopyObject().(*VolumeList)
	vlc.Items[0].Spec.Name = "other"
	vlc.Items[0].Labels["k"] = "changed too"
	if vol.Labels["k"] != "v" || vl.Items[0].Spec.Name != "data" {
		t.Fatal("the volume copy shares state with the original")
	}
	ku := &KeyUsage{Spec: KeyUsageSpec{Nodes: map[string]NodeUsage{"a": {Sandboxes: 1}}}}
	kc := ku.DeepCopyObject().(*KeyUsage)
	kc.Spec.Nodes["a"] = NodeUsage{Sandboxes: 2}
	kl := &KeyUsageList{Items: []KeyUsage{*ku}}
	klc := kl.DeepCopyObject().(*KeyUsageList)
	klc.Items[0].Spec.Nodes["b"] = NodeUsage{}
	if ku.Spec.Nodes["a"].Sandboxes != 1 || len(kl.Items[0].Spec.Nodes) != 1 {
		t.Fatal("the key usage copy shares its nodes")
	}
	if (*Sandbox)(nil).DeepCopy() != nil || (*Template)(nil).DeepCopy() != nil || (*Volume)(nil).DeepCopy() != nil {
		t.Fatal("nil copies")
	}
}
