package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Images made by builds (internal/build) stack on another image of any
// kind — a debootstrap rootfs, an OCI image with its finalize layer, or an
// earlier build — and add the layers of the build's steps, each in the
// layer store by diffID:
//
//	images/b-<hash>/image.json   Base: the image below; BuildLayers: the steps' layers
//
// Nothing of the base is copied. The build cache (buildcache/<team>/<key>.json)
// remembers which layer and which context each step made, per team, so a
// rebuild reuses them; the GC keeps the layers it names.

// Defaults are what a build leaves for the sandboxes of its image: the
// context of its last step and its start and ready commands.
type Defaults struct {
	User     string   `json:"user"`
	UID      int      `json:"uid"`
	GID      int      `json:"gid"`
	Workdir  string   `json:"workdir"`
	Env      []string `json:"env"`
	StartCmd string   `json:"startCmd,omitempty"`
	ReadyCmd string   `json:"readyCmd,omitempty"`
}

// maxBaseDepth bounds a chain of builds on builds (a template from a
// template from ...): overlayfs stacks at most 500 layers anyway.
const maxBaseDepth = 64

// derivedLowers fills t.lowers for a built image: its own layers over its
// base's.
func (s *Store) derivedLowers(t *Template) (*Template, error) {
	own, err := s.layerDirs(t.BuildLayers)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", t.Image, err)
	}
	base := t
	for depth := 0; base.Base != ""; depth++ {
		if depth == maxBaseDepth {
			return nil, fmt.Errorf("image %s: more than %d builds stacked", t.Image, maxBaseDepth)
		}
		b, err := os.ReadFile(filepath.Join(s.imageDir(base.Base), "image.json"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("image %s: its base %s: %w", t.Image, base.Base, ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
		var next Template
		if err := json.Unmarshal(b, &next); err != nil {
			return nil, fmt.Errorf("parse image %s: %w", base.Base, err)
		}
		next.Image = base.Base
		if next.Base == "" {
			bt, err := s.readImage(base.Base)
			if err != nil {
				return nil, fmt.Errorf("image %s: its base: %w", t.Image, err)
			}
			for _, l := range append(own, bt.lowers...) {
				if !slices.Contains(t.lowers, l) { // one dir once in a stack, at its top
					t.lowers = append(t.lowers, l)
				}
			}
			return t, nil
		}
		more, err := s.layerDirs(next.BuildLayers)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", t.Image, err)
		}
		own = append(own, more...)
		base = &next
	}
	return t, nil
}

// Image returns the image of key (no name), or an error wrapping
// ErrNotFound.
func (s *Store) Image(key string) (*Template, error) { return s.readImage(key) }

// Derive makes (or finds) the image that stacks layers (diffIDs in the
// layer store, bottom first) on parent's image with defaults d, and leases
// it to holder (a directory that must exist; see Acquire), in one step
// under the cache lock so that no GC can remove it in between. The image
// has no name until Name gives it one.
func (s *Store) Derive(holder string, parent *Template, layers []string, d Defaults) (*Template, error) {
	for _, id := range layers {
		if !s.Layers.Has(id) {
			return nil, fmt.Errorf("derive image: layer %s is not in the layer store", id)
		}
	}
	h := sha256.New()
	b, _ := json.Marshal(struct {
		Base   string   `json:"base"`
		Layers []string `json:"layers"`
		D      Defaults `json:"d"`
	}{parent.Image, layers, d})
	h.Write([]byte("cella-build-v1\x00"))
	h.Write(b)
	key := "b-" + hex.EncodeToString(h.Sum(nil))[:20]

	meta := newTemplate(key)
	meta.Base, meta.BuildLayers = parent.Image, slices.Clone(layers)
	meta.User, meta.UID, meta.GID, meta.Workdir, meta.Env = d.User, d.UID, d.GID, d.Workdir, slices.Clone(d.Env)
	meta.StartCmd, meta.ReadyCmd = d.StartCmd, d.ReadyCmd
	// Recorded for listings and push: what the build stacked on.
	meta.Ref, meta.Digest, meta.Entrypoint, meta.Cmd = parent.Ref, parent.Digest, parent.Entrypoint, parent.Cmd
	meta.Size = parent.Size
	for _, id := range layers {
		if in, err := s.Layers.Info(id); err == nil {
			meta.Size += in.Size
		}
	}
	tmp, err := s.tempImageDir(".build-" + key)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := writeImageMeta(tmp, meta); err != nil {
		return nil, err
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Stat(s.imageDir(key)); errors.Is(err, fs.ErrNotExist) {
		base, err := s.readImage(parent.Image)
		if err != nil {
			return nil, fmt.Errorf("derive image: its base %s: %w", parent.Image, err)
		}
		if err := os.Rename(tmp, s.imageDir(key)); err != nil {
			return nil, fmt.Errorf("install image %s: %w", key, err)
		}
		// The image's own directory leases its base too: what keeps the
		// base from the GC of a cella that predates built images (the GC
		// here follows Base anyway).
		if _, err := s.acquireLocked(s.imageDir(key), base); err != nil {
			os.RemoveAll(s.imageDir(key))
			return nil, err
		}
	}
	t, err := s.readImage(key)
	if err != nil {
		return nil, err
	}
	t.Name, t.Services = parent.Name, parent.Services
	if _, err := s.acquireLocked(holder, t); err != nil {
		return nil, err
	}
	return t, nil
}

// Name points name at image key, with the memory snapshot sandboxes of it
// start from ("" for none) and the services of the template it was built
// on (nil: the services the name had, if any: a builtin name rebuilt by
// hand keeps its own); the image the name pointed at before is
// garbage-collected if nothing uses it now. It returns the named template.
func (s *Store) Name(name, key, snapshot string, services []string) (*Template, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("invalid template name %q", name)
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	if _, err := s.readImage(key); err != nil {
		unlock()
		return nil, err
	}
	p := filepath.Join(s.namesDir(), name+".json")
	prev, _ := readNameRecord(p)
	if len(services) == 0 {
		services = prev.Services
	}
	b, _ := json.Marshal(nameRecord{Image: key, Services: services, Snapshot: snapshot})
	err = writeFileAtomic(p, b, 0o644)
	unlock()
	if err != nil {
		return nil, fmt.Errorf("name template %q: %w", name, err)
	}
	if prev.Image != "" && prev.Image != key {
		if _, err := s.GC(); err != nil {
			slog.Warn("template cache garbage collection", "err", err)
		}
	}
	return s.Get(name)
}

// BuildLock is held (shared) for the whole of a build: the GC sweeps no
// layer and no temp dir meanwhile, so the layers a build made stay until
// an image or the build cache names them.
func (s *Store) BuildLock(ctx context.Context) (release func(), err error) {
	return s.pullLock(ctx)
}

// TempDir makes a directory under the cache's tmp/ (removed by the GC
// once no build or pull runs): a build's lease holders and scratch.
func (s *Store) TempDir(prefix string) (string, error) {
	return os.MkdirTemp(s.tmpDir(), prefix)
}

// CacheEntry is what a build step made, found again by its cache key: the
// layer it added ("" when it changed only the context, as ENV does) and
// the context after it.
type CacheEntry struct {
	Layer   string    `json:"layer,omitempty"`
	User    string    `json:"user"`
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	Workdir string    `json:"workdir"`
	Env     []string  `json:"env"`
	Created time.Time `json:"created"`
}

func (s *Store) cacheDir() string { return filepath.Join(s.CacheDir, "buildcache") }

func (s *Store) cachePath(team, key string) string {
	th := sha256.Sum256([]byte(team))
	kh := sha256.Sum256([]byte(key))
	return filepath.Join(s.cacheDir(), hex.EncodeToString(th[:12]), hex.EncodeToString(kh[:16])+".json")
}

// CacheGet returns team's build cache entry for key, if there is one whose
// layer is still in the layer store.
func (s *Store) CacheGet(team, key string) (CacheEntry, bool) {
	var e CacheEntry
	b, err := os.ReadFile(s.cachePath(team, key))
	if err != nil || json.Unmarshal(b, &e) != nil {
		return e, false
	}
	if e.Layer != "" && !s.Layers.Has(e.Layer) {
		return e, false
	}
	return e, true
}

// CachePut records team's build cache entry for key.
func (s *Store) CachePut(team, key string, e CacheEntry) error {
	p := s.cachePath(team, key)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("build cache: %w", err)
	}
	e.Created = time.Now().UTC().Truncate(time.Second)
	b, _ := json.Marshal(e)
	return writeFileAtomic(p, b, 0o600)
}

// cachedLayers are the layers the build cache names (the GC keeps them).
func (s *Store) cachedLayers() map[string]bool {
	used := map[string]bool{}
	_ = filepath.WalkDir(s.cacheDir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		var e CacheEntry
		if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &e) == nil && e.Layer != "" {
			used[e.Layer] = true
		}
		return nil
	})
	return used
}
