package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/fslock"
)

// The cache is shared by every daemon (and CLI) on the machine, so what is
// in use is known from the cache dir itself, not from any one process:
//
//   - A sandbox or snapshot holds a lease on the image it runs on:
//     leases/<hash of its directory>.json names the image and the holder's
//     directory (<data>/sandboxes/<id>, <data>/snapshots/<id>). A lease is
//     live while that directory exists: it is made (Acquire) after the
//     directory and before the overlay is mounted, and the directory goes
//     when the sandbox is killed or a daemon's reconciliation finds it has
//     no record — so a crashed daemon's leases stay live exactly as long as
//     its sandboxes' state does (paused and archived ones included), and
//     then expire by themselves.
//   - An image is removed only when no name points at it, no lease on it is
//     live and no mount on the host names its directory (sandboxes of cella
//     versions without leases, under gVisor).
//   - A layer is removed only when no remaining image lists it and no
//     mount names it, and only while no pull or build runs anywhere (they
//     hold .pull.lock shared; the GC takes it exclusively or skips layers):
//     a pull unpacks layers before its image record exists.
//   - A name is removed (Delete) only when no live lease of a sandbox made
//     from that name is on its image.
//
// Every step that reads or writes names, images or leases holds .lock.

// lease is one leases/*.json file.
type lease struct {
	Holder  string    `json:"holder"` // absolute directory of the sandbox or snapshot
	Image   string    `json:"image"`
	Name    string    `json:"name"` // the template name it was made from
	Created time.Time `json:"created"`
	// Services of the name at the time (they belong to the name).
	Services []string `json:"services,omitempty"`
}

func (s *Store) leasePath(holder string) string {
	h := sha256.Sum256([]byte(holder))
	return filepath.Join(s.leasesDir(), hex.EncodeToString(h[:16])+".json")
}

// Acquire records that holder — the directory of a sandbox or snapshot,
// which must exist — uses t's image, and returns t's layers (top first),
// checked to be present. Until holder is removed, the image and its layers
// stay, whatever happens to t's name.
func (s *Store) Acquire(holder string, t *Template) ([]string, error) {
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return s.acquireLocked(holder, t)
}

// acquireLocked is Acquire with the cache lock held.
func (s *Store) acquireLocked(holder string, t *Template) ([]string, error) {
	holder, err := filepath.Abs(holder)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(holder); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("lease template %s: holder %s is not a directory: %v", t.Name, holder, err)
	}
	// Under the lock: the image may have been collected since t was read.
	cur, err := s.readImage(t.Image)
	if err != nil {
		return nil, fmt.Errorf("template %s: its image was removed (%w); build it again", t.Name, err)
	}
	lowers := cur.Lowers()
	for _, l := range lowers {
		if _, err := os.Stat(l); err != nil {
			return nil, fmt.Errorf("template %s: layer %s is missing: %w", t.Name, l, err)
		}
	}
	b, _ := json.Marshal(lease{Holder: holder, Image: t.Image, Name: t.Name, Services: t.Services, Created: time.Now().UTC()})
	if err := writeFileAtomic(s.leasePath(holder), b, 0o600); err != nil {
		return nil, fmt.Errorf("lease template %s: %w", t.Name, err)
	}
	return lowers, nil
}

// Leased returns the template holder leased: the image it runs on, under
// the name it was made from, even if that name now points elsewhere. It
// wraps ErrNotFound when holder has no lease (made by an older cella).
func (s *Store) Leased(holder string) (*Template, error) {
	holder, err := filepath.Abs(holder)
	if err != nil {
		return nil, err
	}
	var l lease
	b, err := os.ReadFile(s.leasePath(holder))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("lease of %s: %w", holder, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("lease of %s: %w", holder, err)
	}
	t, err := s.readImage(l.Image)
	if err != nil {
		return nil, err
	}
	t.Name, t.Services = l.Name, l.Services
	return t, nil
}

// Release drops holder's lease (its sandbox or snapshot is gone) and, if
// no name points at its image any more, collects what nothing uses.
func (s *Store) Release(holder string) error {
	holder, err := filepath.Abs(holder)
	if err != nil {
		return err
	}
	p := s.leasePath(holder)
	var l lease
	if b, err := os.ReadFile(p); err == nil {
		_ = json.Unmarshal(b, &l)
	}
	err = os.Remove(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if rec, err := readNameRecord(filepath.Join(s.namesDir(), l.Name+".json")); err == nil && rec.Image == l.Image {
		return nil // still named: nothing to collect
	}
	_, err = s.GC()
	return err
}

// readLeases returns the live leases and removes the expired ones; the
// cache lock is held.
func (s *Store) readLeases() ([]lease, error) {
	ents, err := os.ReadDir(s.leasesDir())
	if err != nil {
		return nil, err
	}
	var live []lease
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(s.leasesDir(), e.Name())
		var l lease
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &l)
		}
		if err != nil {
			continue // a torn write cannot happen (atomic); ignore junk
		}
		if _, err := os.Stat(l.Holder); errors.Is(err, fs.ErrNotExist) {
			_ = os.Remove(p)
			continue
		}
		live = append(live, l)
	}
	return live, nil
}

// sandboxesUsing lists the live sandbox leases made from name on image
// (snapshots keep their image alive but do not block a Delete).
func (s *Store) sandboxesUsing(name, image string) ([]string, error) {
	leases, err := s.readLeases()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range leases {
		if l.Name == name && l.Image == image && filepath.Base(filepath.Dir(l.Holder)) == "sandboxes" {
			out = append(out, filepath.Base(l.Holder))
		}
	}
	slices.Sort(out)
	return out, nil
}

// GCResult says what a GC removed.
type GCResult struct {
	Images []string
	Layers []string
	// LayersSkipped is set when a pull or build was running, so layers were
	// left for a later GC.
	LayersSkipped bool
}

// GC removes images no name, lease or mount uses, and layers no image or
// mount uses (see the rules at the top of this file).
func (s *Store) GC() (GCResult, error) {
	var res GCResult
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	// A path in any mount's options (an overlay's lowerdir): image dirs
	// are followed by /rootfs or /finalize, layer dirs end in /fs.
	mounted := func(p string) bool { return strings.Contains(string(mounts), p) }

	unlock, err := s.lock()
	if err != nil {
		return res, err
	}
	keep := map[string]bool{}
	leases, err := s.readLeases()
	if err == nil {
		for _, l := range leases {
			keep[l.Image] = true
		}
		var names []os.DirEntry
		if names, err = os.ReadDir(s.namesDir()); err == nil {
			for _, e := range names {
				if rec, err := readNameRecord(filepath.Join(s.namesDir(), e.Name())); err == nil && strings.HasSuffix(e.Name(), ".json") {
					keep[rec.Image] = true
				}
			}
		}
	}
	// A kept built image keeps the images it stacks on.
	for key := range keep {
		for depth := 0; key != "" && depth < maxBaseDepth; depth++ {
			var t Template
			b, rerr := os.ReadFile(filepath.Join(s.imageDir(key), "image.json"))
			if rerr != nil || json.Unmarshal(b, &t) != nil {
				break
			}
			if t.Base != "" {
				keep[t.Base] = true
			}
			key = t.Base
		}
	}
	var trash []string
	if err == nil {
		var imgs []os.DirEntry
		imgs, err = os.ReadDir(s.imagesDir())
		for _, e := range imgs {
			key := e.Name()
			if !e.IsDir() || strings.HasPrefix(key, ".") || keep[key] || mounted(s.imageDir(key)+"/") {
				continue
			}
			t := filepath.Join(s.imagesDir(), ".trash-"+key+"-"+randomHex(4))
			if rerr := os.Rename(s.imageDir(key), t); rerr != nil {
				err = errors.Join(err, rerr)
				continue
			}
			trash = append(trash, t)
			res.Images = append(res.Images, key)
		}
	}
	unlock()
	if err != nil {
		return res, fmt.Errorf("template cache gc: %w", err)
	}

	// Layers, and temp dirs of pulls and builds, only while none runs.
	release, ok, lerr := fslock.TryExclusive(filepath.Join(s.CacheDir, ".pull.lock"))
	if lerr != nil {
		return res, lerr
	}
	if !ok {
		res.LayersSkipped = true
	} else {
		defer release()
		used := s.cachedLayers() // derive.go
		imgs, _ := os.ReadDir(s.imagesDir())
		for _, e := range imgs {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			var t Template
			if b, err := os.ReadFile(filepath.Join(s.imageDir(e.Name()), "image.json")); err == nil && json.Unmarshal(b, &t) == nil {
				for _, id := range append(t.Layers, t.BuildLayers...) {
					used[id] = true
				}
			}
		}
		res.Layers, err = s.Layers.Sweep(func(id string) bool {
			p, _ := s.Layers.Path(id)
			return used[id] || mounted(p)
		})
		// Under the cache lock too: a cella without the pull lock builds
		// and imports while holding it.
		if unlock, lerr := s.lock(); lerr == nil {
			imgs, _ = os.ReadDir(s.imagesDir())
			for _, e := range imgs {
				if n := e.Name(); e.IsDir() && (strings.HasPrefix(n, ".build-") || strings.HasPrefix(n, ".import-") || strings.HasPrefix(n, ".pull-")) {
					t := filepath.Join(s.imagesDir(), ".trash-"+strings.TrimPrefix(n, ".")+"-"+randomHex(4))
					if os.Rename(filepath.Join(s.imagesDir(), n), t) == nil {
						trash = append(trash, t)
					}
				}
			}
			unlock()
		}
		tmps, _ := os.ReadDir(s.tmpDir())
		for _, e := range tmps {
			trash = append(trash, filepath.Join(s.tmpDir(), e.Name()))
		}
	}
	for _, t := range trash {
		err = errors.Join(err, os.RemoveAll(t))
	}
	imgs, _ := os.ReadDir(s.imagesDir())
	for _, e := range imgs { // the trash of a GC that crashed
		if strings.HasPrefix(e.Name(), ".trash-") {
			err = errors.Join(err, os.RemoveAll(filepath.Join(s.imagesDir(), e.Name())))
		}
	}
	return res, err
}

// pullLock holds .pull.lock shared for a pull or build: the GC does not
// sweep layers or temp dirs meanwhile.
func (s *Store) pullLock(ctx context.Context) (func(), error) {
	return fslock.Shared(ctx, filepath.Join(s.CacheDir, ".pull.lock"))
}
