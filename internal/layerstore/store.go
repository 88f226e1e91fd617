// Package layerstore keeps image layers unpacked on disk, once each, keyed
// by their diffID (the sha256 of the uncompressed layer tar), in the form
// overlayfs reads as a lower layer: the way containerd's overlay snapshotter
// keeps them. Templates are stacks of these directories; nothing is
// flattened or copied per template or per sandbox.
//
// Layout (dir is <cache>/layers, mode 0700: the layers hold the images'
// setuid files, which no host user but root may reach):
//
//	sha256/<hex>/fs/          the layer's files; an overlay lower dir
//	sha256/<hex>/layer.json   Info: what was unpacked, skipped, how big
//	tmp/<hex>-<random>/       a layer being unpacked (never a real entry)
//	tmp/<hex>.lock            flock held while <hex> is being unpacked
//
// A layer is unpacked into tmp/ and renamed into sha256/ only once its
// whole content has been read and its digests checked, so a layer that is
// present is always complete: a crash, a truncated blob or a wrong digest
// leaves only a temp dir, which Sweep removes.
//
// Unpacking follows the OCI image layer spec (whiteouts `.wh.NAME` become
// overlay whiteouts, `.wh..wh..opq` the opaque xattr) and treats the tar as
// hostile: see Unpack.
package layerstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// DefaultMaxLayerSize is the largest layer Unpack accepts by default,
// counted uncompressed (tar headers included).
const DefaultMaxLayerSize = 8 << 30

// ErrNotFound is returned for a layer that is not in the store.
var ErrNotFound = errors.New("layer not in the store")

// Store is a directory of unpacked layers.
type Store struct {
	Dir string
	// MaxLayerSize bounds each layer's uncompressed size (and its
	// compressed size); 0 means DefaultMaxLayerSize.
	MaxLayerSize int64
}

// Info describes an unpacked layer (layer.json).
type Info struct {
	DiffID string `json:"diffID"`
	// Digest and MediaType are those of the blob it was unpacked from.
	Digest    string `json:"digest,omitempty"`
	MediaType string `json:"mediaType,omitempty"`
	// Size is the uncompressed tar's size; Compressed the blob's.
	Size       int64 `json:"size"`
	Compressed int64 `json:"compressed,omitempty"`
	Entries    int   `json:"entries"`
	// SkippedDevices counts character and block devices the layer held:
	// they are not created (see Unpack).
	SkippedDevices int       `json:"skippedDevices,omitempty"`
	Created        time.Time `json:"created"`
}

var hexRE = regexp.MustCompile(`^[a-f0-9]{64}$`)

// Open returns the store in dir, creating it (mode 0700).
func Open(dir string, maxLayerSize int64) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("layer store %q: %w", dir, err)
	}
	s := &Store{Dir: abs, MaxLayerSize: maxLayerSize}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("create layer store: %w", err)
	}
	// MkdirAll keeps an existing dir's mode: make sure it is closed.
	if err := os.Chmod(abs, 0o700); err != nil {
		return nil, fmt.Errorf("layer store: %w", err)
	}
	for _, d := range []string{s.layersDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create layer store: %w", err)
		}
	}
	return s, nil
}

func (s *Store) maxSize() int64 {
	if s.MaxLayerSize > 0 {
		return s.MaxLayerSize
	}
	return DefaultMaxLayerSize
}

func (s *Store) layersDir() string { return filepath.Join(s.Dir, "sha256") }
func (s *Store) tmpDir() string    { return filepath.Join(s.Dir, "tmp") }

// hexOf checks a diffID ("sha256:<64 hex>") and returns its hex part.
func hexOf(diffID string) (string, error) {
	h, ok := strings.CutPrefix(diffID, "sha256:")
	if !ok || !hexRE.MatchString(h) {
		return "", fmt.Errorf("invalid layer diffID %q: want sha256:<64 hex digits>", diffID)
	}
	return h, nil
}

func (s *Store) entryDir(hex string) string { return filepath.Join(s.layersDir(), hex) }

// Path is the directory to use as an overlay lower dir for diffID. It does
// not check that the layer is present (Has does).
func (s *Store) Path(diffID string) (string, error) {
	h, err := hexOf(diffID)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.entryDir(h), "fs"), nil
}

// Has reports whether diffID is unpacked in the store.
func (s *Store) Has(diffID string) bool {
	_, err := s.Info(diffID)
	return err == nil
}

// Info returns what the store knows of diffID, or an error wrapping
// ErrNotFound.
func (s *Store) Info(diffID string) (Info, error) {
	h, err := hexOf(diffID)
	if err != nil {
		return Info{}, err
	}
	b, err := os.ReadFile(filepath.Join(s.entryDir(h), "layer.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("layer %s: %w", diffID, ErrNotFound)
	}
	if err != nil {
		return Info{}, fmt.Errorf("layer %s: %w", diffID, err)
	}
	var in Info
	if err := json.Unmarshal(b, &in); err != nil {
		return Info{}, fmt.Errorf("layer %s: parse layer.json: %w", diffID, err)
	}
	return in, nil
}

// List returns the diffIDs of every layer in the store.
func (s *Store) List() ([]string, error) {
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	var out []string
	for _, e := range ents {
		if hexRE.MatchString(e.Name()) {
			out = append(out, "sha256:"+e.Name())
		}
	}
	return out, nil
}

// Sweep removes every layer for which keep returns false, and every temp
// dir. The caller must know that no unpack is in progress anywhere (the
// template store holds its pull lock exclusively) and that no template or
// sandbox uses the layers it does not keep. It returns the diffIDs removed.
func (s *Store) Sweep(keep func(diffID string) bool) ([]string, error) {
	var errs []error
	trash := func(p string) {
		// Rename first (atomic), so a crash mid-removal leaves a temp dir,
		// never a half-deleted layer under its real name.
		t := filepath.Join(s.tmpDir(), "trash-"+filepath.Base(p)+"-"+randomHex(4))
		if err := os.Rename(p, t); err != nil {
			errs = append(errs, err)
			return
		}
		if err := os.RemoveAll(t); err != nil {
			errs = append(errs, err)
		}
	}
	ids, err := s.List()
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, id := range ids {
		if keep(id) {
			continue
		}
		h, _ := hexOf(id)
		trash(s.entryDir(h))
		removed = append(removed, id)
	}
	tmps, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return removed, errors.Join(append(errs, err)...)
	}
	for _, e := range tmps {
		if err := os.RemoveAll(filepath.Join(s.tmpDir(), e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}
