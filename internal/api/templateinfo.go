package api

import (
	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/template"
)

// templateStore are cella's fields of a GET /templates item: where the
// template's image is in the template store and what it holds.
type templateStore struct {
	StoreName  string                  `json:"storeName,omitempty"`
	Source     *apiwire.TemplateSource `json:"source,omitempty"`
	SizeBytes  int64                   `json:"sizeBytes,omitempty"`
	LayerCount int                     `json:"layerCount,omitempty"`
	Layers     []apiwire.TemplateLayer `json:"layers,omitempty"`
}

// describeTemplate fills the store fields of the template the store has
// under storeName; a name without an image (a build not ready yet, an
// image removed meanwhile) gets only its name.
func (s *Server) describeTemplate(storeName string, t *template.Template) templateStore {
	out := templateStore{StoreName: storeName}
	if t == nil {
		var err error
		if t, err = s.cfg.Templates.Get(storeName); err != nil {
			return out
		}
	}
	src := apiwire.TemplateSource{Kind: apiwire.TemplateSourceKind(s.cfg.Templates.SourceKind(t)), Description: t.Describe(),
		ImageRef: t.Ref, Digest: t.Digest}
	if src.Kind == apiwire.TemplateSourceImport {
		// Describe names the host directory it was imported from: not for
		// every key to read.
		src.Description = "import of a directory on the host"
	}
	if t.Recipe != nil && t.Base == "" {
		src.Packages = t.Recipe.Packages
	}
	out.Source = &src
	stack := s.cfg.Templates.Stack(t)
	out.SizeBytes = s.cfg.Templates.SizeOf(t, stack)
	out.LayerCount = len(stack)
	out.Layers = make([]apiwire.TemplateLayer, 0, len(stack))
	for _, l := range stack {
		out.Layers = append(out.Layers, apiwire.TemplateLayer{ID: l.ID, Kind: apiwire.TemplateLayerKind(l.Kind), SizeBytes: l.Size})
	}
	return out
}
