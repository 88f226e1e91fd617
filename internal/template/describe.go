package template

import "path/filepath"

// What a template was made from, for listings (SourceKind).
const (
	SourceBuiltin     = "builtin"     // a builtin recipe (base, code-interpreter-v1), built on first use
	SourceDebootstrap = "debootstrap" // cella template build --debootstrap
	SourceImage       = "image"       // an OCI image (registry, archive, layout)
	SourceBuild       = "build"       // steps run by the build engine (a Dockerfile, E2B's build API)
	SourceImport      = "import"      // cella template import DIR
)

// SourceKind says what t was made from: one of the Source*
// constants ("" when its image records nothing).
func (s *Store) SourceKind(t *Template) string {
	switch {
	case t.Base != "":
		return SourceBuild
	case t.Ref != "":
		return SourceImage
	case t.Recipe != nil:
		if b, ok := s.Builtin(t.Name); ok && b.Recipe.Key() == t.Image {
			return SourceBuiltin
		}
		return SourceDebootstrap
	case t.Source != "":
		return SourceImport
	}
	return ""
}

// Layer is one layer of a template's stack.
type Layer struct {
	// ID is the layer's diffID in the layer store, or <image key>/rootfs
	// (a one-layer image's root) or <image key>/finalize (an OCI image's
	// user account and home).
	ID   string `json:"id"`
	Kind string `json:"kind"` // "layer", "rootfs" or "finalize"
	Size int64  `json:"size"` // bytes on disk (a layer's: its uncompressed tar)
}

// Stack is t's layers, top first: one per entry of t.Lowers(), so its
// length is the stack a sandbox of t mounts. It names no host path.
func (s *Store) Stack(t *Template) []Layer {
	layersDir := filepath.Join(s.Layers.Dir, "sha256")
	out := make([]Layer, 0, len(t.lowers))
	for _, p := range t.lowers {
		dir, leaf := filepath.Split(filepath.Clean(p))
		dir = filepath.Clean(dir)
		switch {
		case leaf == "fs" && filepath.Dir(dir) == layersDir:
			id := "sha256:" + filepath.Base(dir)
			l := Layer{ID: id, Kind: "layer"}
			if in, err := s.Layers.Info(id); err == nil {
				l.Size = in.Size
			}
			out = append(out, l)
		case leaf == "rootfs" && filepath.Dir(dir) == s.imagesDir():
			key := filepath.Base(dir)
			l := Layer{ID: key + "/rootfs", Kind: "rootfs"}
			if img, err := s.readImage(key); err == nil {
				l.Size = img.Size
			}
			if l.Size == 0 {
				l.Size = dirSize(p)
			}
			out = append(out, l)
		case leaf == "finalize" && filepath.Dir(dir) == s.imagesDir():
			out = append(out, Layer{ID: filepath.Base(dir) + "/finalize", Kind: "finalize", Size: dirSize(p)})
		default: // a lower this cella cannot name: counted, its host path not shown
			out = append(out, Layer{Kind: "layer", Size: dirSize(p)})
		}
	}
	return out
}

// SizeOf is the bytes t's layers hold: its recorded size, else its
// stack's sum.
func (s *Store) SizeOf(t *Template, stack []Layer) int64 {
	if t.Size > 0 {
		return t.Size
	}
	var n int64
	for _, l := range stack {
		n += l.Size
	}
	return n
}
