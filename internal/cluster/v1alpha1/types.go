// Package v1alpha1 is cella's Kubernetes API group cella.dev/v1alpha1: the
// cluster-level records (Sandbox, Template) kept in the API server, beside
// each node's own SQLite. The CRDs that serve these types are
// deploy/kubernetes/crds/*.yaml; TestCRDRoundTrip holds the two to each
// other against a real API server (a field the schema lacks is pruned and
// the round trip fails).
//
// DeepCopy is written by hand (deepcopy.go): four small types did not
// justify a pinned controller-gen build on this machine's shared CPU.
package v1alpha1

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version of cella's resources.
const (
	Group   = "cella.dev"
	Version = "v1alpha1"
)

// GroupVersion is cella.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// AddToScheme registers the types with a scheme (the client's).
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Sandbox{}, &SandboxList{}, &Template{}, &TemplateList{})
	s.AddKnownTypes(GroupVersion, &Volume{}, &VolumeList{})                                             // volume.go
	s.AddKnownTypes(GroupVersion, &TemplateAlias{}, &TemplateAliasList{}, &KeyUsage{}, &KeyUsageList{}) // reservations.go
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// SandboxPhase is where a sandbox is in its life, cluster-wide.
type SandboxPhase string

const (
	SandboxRunning SandboxPhase = "Running"
	SandboxPaused  SandboxPhase = "Paused"
	// SandboxLost is a sandbox whose node stopped renewing its Lease: it
	// gets no traffic and its Message says why.
	SandboxLost SandboxPhase = "Lost"
)

// Sandbox is one sandbox of the cluster. Its name is the sandbox ID (a DNS
// label: 20 characters of [a-z0-9]).
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxSpec   `json:"spec"`
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxSpec is what a sandbox was created as and where it lives.
type SandboxSpec struct {
	// Team and KeyID own the sandbox (tenant.Owner).
	Team  string `json:"team"`
	KeyID string `json:"keyID,omitempty"`
	// Template is the template ID or name the sandbox was made from.
	Template string `json:"template"`
	// Node is the name of the node (its Lease) that runs the sandbox.
	Node string `json:"node"`
	// Lifecycle is the sandbox's timeout and policies.
	Lifecycle SandboxLifecycle `json:"lifecycle,omitempty"`
}

// SandboxLifecycle is E2B's timeout and autoPause plus cella's idle
// policies, as the create asked for them.
type SandboxLifecycle struct {
	EndAt       *metav1.Time `json:"endAt,omitempty"`
	AutoPause   bool         `json:"autoPause,omitempty"`
	AutoStop    string       `json:"autoStop,omitempty"`
	AutoArchive string       `json:"autoArchive,omitempty"`
	AutoDelete  string       `json:"autoDelete,omitempty"`
}

// SandboxStatus is what was last observed of the sandbox.
type SandboxStatus struct {
	Phase SandboxPhase `json:"phase,omitempty"`
	// Message says why the phase is what it is (a Lost sandbox's node and
	// when its Lease lapsed).
	Message   string       `json:"message,omitempty"`
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// Archived: the paused sandbox's state is in the cluster's archive
	// store, so any node can resume it (a gateway sends the resume of an
	// archived sandbox whose node is gone to another).
	Archived bool `json:"archived,omitempty"`
}

// SandboxList is a list of Sandboxes.
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

// Template is a template every node can pull: an OCI image reference and
// the digest it was pushed as. Its name is the template ID (E2B's).
type Template struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec TemplateSpec `json:"spec"`
}

// TemplateSpec is where a template's image is.
type TemplateSpec struct {
	// Team owns the template; Aliases are its names (E2B's aliases).
	Team    string   `json:"team,omitempty"`
	Aliases []string `json:"aliases,omitempty"`
	// Public: every team may create from it (E2B's publish).
	Public bool `json:"public,omitempty"`
	// TemplateBuild is the template's current build: the one its
	// default tag names (empty until its first build is pushed).
	TemplateBuild `json:",inline"`
	// Tags are its other tags (E2B's alias:tag), each with the build it
	// names; a build's entry is its own, so a tag keeps its build after
	// a rebuild moved the default tag on.
	Tags []TemplateTag `json:"tags,omitempty"`
	// Node is the node that builds the template (an API build's calls go
	// there while it is live: its files cache, logs and build state are
	// that node's).
	Node string `json:"node,omitempty"`
}

// TemplateBuild is one pushed build of a template: what a node that lacks
// it pulls and imports, so that a sandbox of it is the same on every node.
type TemplateBuild struct {
	// Reference is the OCI image reference (registry/repository:tag) the
	// build was pushed to.
	Reference string `json:"reference,omitempty"`
	// Digest is the manifest digest (sha256:...) nodes pull and check.
	// The image's config carries the build's user, workdir, env and its
	// start and ready commands (internal/template Push).
	Digest string `json:"digest,omitempty"`
	// Build is the build ID Reference holds (E2B's buildID), and
	// CPUCount and MemoryMB the sizes it was requested with (a sandbox of
	// it gets them unless its create asks for its own).
	Build    string `json:"build,omitempty"`
	CPUCount int    `json:"cpuCount,omitempty"`
	MemoryMB int    `json:"memoryMB,omitempty"`
	// Services are what the agent runs in its sandboxes besides envd
	// (the code interpreter, the docker engine of a template built on
	// those builtins): the template store keeps them by name, not in the
	// image.
	Services []string `json:"services,omitempty"`
}

// TemplateTag is a tag of a template other than "default" and the build
// it names.
type TemplateTag struct {
	Tag           string `json:"tag"`
	TemplateBuild `json:",inline"`
}

// Tag is the build tag names ("default" or "": the current build).
func (s *TemplateSpec) Tag(tag string) (TemplateBuild, bool) {
	if tag == "" || tag == DefaultTag {
		return s.TemplateBuild, s.Digest != ""
	}
	for _, t := range s.Tags {
		if t.Tag == tag {
			return t.TemplateBuild, true
		}
	}
	return TemplateBuild{}, false
}

// SetTag points tag at b ("default": b becomes the current build).
func (s *TemplateSpec) SetTag(tag string, b TemplateBuild) {
	if tag == DefaultTag {
		s.TemplateBuild = b
		return
	}
	s.RemoveTag(tag)
	s.Tags = append(s.Tags, TemplateTag{Tag: tag, TemplateBuild: b})
}

// RemoveTag drops tag (never the default one: a template always has a
// current build once built).
func (s *TemplateSpec) RemoveTag(tag string) {
	s.Tags = slices.DeleteFunc(s.Tags, func(t TemplateTag) bool { return t.Tag == tag })
}

// DefaultTag is E2B's tag of a build requested without one.
const DefaultTag = "default"

// TemplateList is a list of Templates.
type TemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Template `json:"items"`
}
