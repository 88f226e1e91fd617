package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/fslock"
)

// A builtin template (base, code-interpreter-v1) resolves to the image of
// this cella's own recipe of it, images/<recipe key>, never through a
// shared mutable name: daemons of different cella versions sharing a cache
// each run on their own recipe's image, side by side, instead of
// rebuilding names/base.json to theirs in turn.
//
// What keeps such an image from the GC, since no name points at it:
//
//	names/.builtin-<name>-<key>.json   the builtin's root: {"image": key}; its
//	                                   mtime is when a cella last used it
//	builtins/holder-<rand>.json        a running daemon's recipe keys, flocked
//	                                   by it for as long as it runs
//
// The GC removes a root — and so, at once, its image, unless a lease
// holds it — only when no live holder names its key and it was last used
// more than BuiltinGrace ago: a daemon that is running keeps its recipes,
// one that stopped keeps them for the grace period (it may start again),
// and a sandbox of any daemon keeps its image through its lease, whatever
// happens to the root. A root's name starts with "." so no template name
// can be one and listings skip it, while a cella predating roots (whose
// GC keeps every names/*.json) keeps the image too.

// DefaultBuiltinGrace is how long the image of a builtin's recipe that no
// running daemon holds is kept after its last use.
const DefaultBuiltinGrace = 14 * 24 * time.Hour

// touchEvery bounds how often a use rewrites a root's mtime.
const touchEvery = time.Minute

func (s *Store) builtins() map[string]Builtin {
	if s.Builtins != nil {
		return s.Builtins
	}
	return Builtins
}

// Builtin returns this store's builtin of name.
func (s *Store) Builtin(name string) (Builtin, bool) {
	b, ok := s.builtins()[name]
	return b, ok
}

func (s *Store) grace() time.Duration {
	if s.BuiltinGrace > 0 {
		return s.BuiltinGrace
	}
	return DefaultBuiltinGrace
}

const builtinRootPrefix = ".builtin-"

func (s *Store) rootPath(name, key string) string {
	return filepath.Join(s.namesDir(), builtinRootPrefix+name+"-"+key+".json")
}

func (s *Store) holdersDir() string { return filepath.Join(s.CacheDir, "builtins") }

// getBuiltin is Get of a builtin name. An image an operator put under the
// name (an import, an OCI image, a build) is theirs and stays; a recipe
// image under it — an older cella's base — is not what this cella's
// recipe builds, so the recipe's own image is looked up by its key.
func (s *Store) getBuiltin(name string, b Builtin) (*Template, error) {
	t, err := s.getNamed(name)
	if err == nil && t.Recipe == nil {
		return t, nil
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	key := b.Recipe.Key()
	if t, err = s.readImage(key); err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	t.Name, t.Services = name, slices.Clone(b.Services)
	s.touchRoot(name, key)
	return t, nil
}

// touchRoot records a use of the builtin's recipe image: its root made if
// missing (an image an older cella built under the name), its mtime now.
// At most once a minute per root: creates call it.
func (s *Store) touchRoot(name, key string) {
	p := s.rootPath(name, key)
	if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) < touchEvery {
		return
	}
	unlock, err := s.lock()
	if err != nil {
		return
	}
	defer unlock()
	if _, err := os.Stat(s.imageDir(key)); err != nil {
		return // collected meanwhile: the next use builds it again
	}
	now := time.Now()
	if os.Chtimes(p, now, now) == nil {
		return
	}
	b, _ := json.Marshal(nameRecord{Image: key})
	_ = writeFileAtomic(p, b, 0o644)
}

// HoldBuiltins records, until release, that this process (a daemon) runs
// sandboxes of its builtins' recipes: no GC of any cella sharing the cache
// removes their images meanwhile, and when released the grace period
// starts from then.
func (s *Store) HoldBuiltins() (release func(), err error) {
	keys := map[string]string{}
	for name, b := range s.builtins() {
		keys[name] = b.Recipe.Key()
	}
	if err := os.MkdirAll(s.holdersDir(), 0o700); err != nil {
		return nil, fmt.Errorf("hold builtin templates: %w", err)
	}
	// Locked before it is renamed into place: a GC never sees the holder
	// file of a live daemon unlocked.
	tmp := filepath.Join(s.holdersDir(), ".new-"+randomHex(8))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("hold builtin templates: %w", err)
	}
	b, _ := json.Marshal(holder{PID: os.Getpid(), Keys: keys, Started: time.Now().UTC()})
	if _, err = f.Write(b); err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	p := filepath.Join(s.holdersDir(), "holder-"+randomHex(8)+".json")
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("hold builtin templates: %w", err)
	}
	touch := func() {
		for name, key := range keys {
			s.touchRootNow(name, key)
		}
	}
	touch()
	return func() {
		touch()
		os.Remove(p)
		f.Close()
	}, nil
}

// touchRootNow sets an existing root's mtime to now.
func (s *Store) touchRootNow(name, key string) {
	now := time.Now()
	_ = os.Chtimes(s.rootPath(name, key), now, now)
}

// holder is a builtins/holder-*.json file.
type holder struct {
	PID     int               `json:"pid"`
	Keys    map[string]string `json:"keys"` // builtin name → recipe key
	Started time.Time         `json:"started"`
}

// heldKeys are the recipe keys live holders name; the files of holders
// that died are removed. Called with the cache lock held.
func (s *Store) heldKeys() map[string]bool {
	held := map[string]bool{}
	ents, _ := os.ReadDir(s.holdersDir())
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "holder-") {
			continue
		}
		p := filepath.Join(s.holdersDir(), e.Name())
		var h holder
		if b, err := os.ReadFile(p); err == nil {
			_ = json.Unmarshal(b, &h)
		}
		release, free, err := fslock.TryExclusive(p)
		switch {
		case err != nil:
			// Unreadable: count it live rather than lose a daemon's images.
			for _, k := range h.Keys {
				held[k] = true
			}
		case free: // its daemon is gone
			os.Remove(p)
			release()
		default:
			for _, k := range h.Keys {
				held[k] = true
			}
		}
	}
	return held
}

// dropStaleRoots removes the roots no live holder needs and no cella used
// within the grace period, so the GC collects their images (unless
// leased). Called with the cache lock held; it returns the roots removed.
func (s *Store) dropStaleRoots() []string {
	held := s.heldKeys()
	ents, _ := os.ReadDir(s.namesDir())
	var dropped []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, builtinRootPrefix) || !strings.HasSuffix(n, ".json") {
			continue
		}
		p := filepath.Join(s.namesDir(), n)
		rec, err := readNameRecord(p)
		st, serr := os.Stat(p)
		if err != nil || serr != nil || held[rec.Image] || time.Since(st.ModTime()) < s.grace() {
			continue
		}
		if os.Remove(p) == nil {
			dropped = append(dropped, rec.Image)
		}
	}
	return dropped
}

// builtinNames are the builtins, sorted.
func (s *Store) builtinNames() []string { return slices.Sorted(maps.Keys(s.builtins())) }
