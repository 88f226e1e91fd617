package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/cella-sandbox/cella/internal/image"
	"github.com/cella-sandbox/cella/internal/layerstore"
)

// PullOptions are a pull's credentials, platform and progress.
type PullOptions struct {
	// Auth is used for the image's registry (--registry-auth, or the
	// credentials of an API request); nil means ~/.docker/config.json.
	Auth     authn.Authenticator
	Keychain authn.Keychain
	Platform v1.Platform
	// Progress receives the pull's events (ProgressPrinter prints them).
	Progress func(PullEvent)
	// LeaseTo, when set, leaves the image unnamed and leased to this
	// directory instead (Acquire): what a build pulls its base into. The
	// name is then only used in messages.
	LeaseTo string
}

// PullEvent is one step of a pull: a message, or a layer's progress.
type PullEvent struct {
	Message string `json:"message,omitempty"`
	// Layer (1-based) of Layers, its diffID, the bytes of its blob read
	// so far and its size (-1: unknown); Cached when it was in the store
	// already, Done when it is.
	Layer  int    `json:"layer,omitempty"`
	Layers int    `json:"layers,omitempty"`
	DiffID string `json:"diffID,omitempty"`
	Read   int64  `json:"read,omitempty"`
	Total  int64  `json:"total,omitempty"`
	Cached bool   `json:"cached,omitempty"`
	Done   bool   `json:"done,omitempty"`
}

// Pull makes template name from the OCI image src (a registry reference,
// docker-archive:PATH, oci-archive:PATH or oci:DIR; see image.Open): each
// layer is unpacked into the layer store unless it is there already, and a
// finalize layer gives the template E2B's conventions (a `user` account,
// uid 1000, with a home, unless the image has one). The image's Env,
// WorkingDir and User become the template's defaults; its Entrypoint and
// Cmd are recorded, not run; the start and ready commands of a template
// cella pushed (LabelStartCmd) are its own again.
func (s *Store) Pull(ctx context.Context, name, src string, o PullOptions) (*Template, error) {
	if !nameRE.MatchString(name) && o.LeaseTo == "" {
		return nil, fmt.Errorf("invalid template name %q", name)
	}
	emit := o.Progress
	if emit == nil {
		emit = func(PullEvent) {}
	}
	start := time.Now()
	release, err := s.pullLock(ctx)
	if err != nil {
		return nil, err
	}
	t, err := s.pull(ctx, name, src, o, emit)
	release()
	if err != nil {
		return nil, fmt.Errorf("template %s from %s: %w", name, src, err)
	}
	// The name's previous image, or layers of a failed pull, may be
	// unused now.
	if _, err := s.GC(); err != nil {
		emit(PullEvent{Message: "garbage collection: " + err.Error()})
	}
	emit(PullEvent{Message: fmt.Sprintf("template %s ready: %s, %d layers, %s, in %s", name, t.Digest, len(t.Lowers()), humanBytes(t.Size), time.Since(start).Round(time.Millisecond))})
	return t, nil
}

func (s *Store) pull(ctx context.Context, name, src string, o PullOptions, emit func(PullEvent)) (*Template, error) {
	img, err := image.Open(ctx, src, image.Options{Hosts: s.Registry, Auth: o.Auth, Keychain: o.Keychain, Platform: o.Platform,
		TempDir: s.tmpDir(), MaxBlobSize: s.Layers.MaxLayerSize})
	if err != nil {
		return nil, err
	}
	defer img.Close()
	via := ""
	if img.Via != "" {
		via = " via mirror " + img.Via
	}
	emit(PullEvent{Message: fmt.Sprintf("resolved %s to %s%s", src, img.Ref, via)})
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read image config: %w", err)
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	diffIDs := cf.RootFS.DiffIDs
	if len(diffIDs) != len(layers) {
		return nil, fmt.Errorf("the image config lists %d layers, its manifest %d", len(diffIDs), len(layers))
	}
	if len(layers)+1 > maxImageLayers {
		return nil, fmt.Errorf("the image has %d layers; a template stacks at most %d (snapshots need room above it)", len(layers), maxImageLayers-1)
	}
	// Docker archives may hold uncompressed layers, which
	// go-containerregistry would gzip to serve "compressed": read them
	// as they are (their diffID is still checked).
	plain := strings.HasPrefix(src, image.DockerArchivePrefix)
	var size int64
	for i, l := range layers {
		id := diffIDs[i].String()
		ev := PullEvent{Layer: i + 1, Layers: len(layers), DiffID: id}
		if in, err := s.Layers.Info(id); err == nil {
			ev.Cached, ev.Done, ev.Read, ev.Total = true, true, in.Compressed, in.Compressed
			emit(ev)
			size += in.Size
			continue
		}
		in, err := s.unpackLayer(ctx, l, id, plain, ev, emit)
		if err != nil {
			return nil, fmt.Errorf("layer %d/%d: %w", i+1, len(layers), err)
		}
		size += in.Size
	}

	key := imageKey(cfgName.String())
	if _, err := s.readImage(key); err == nil {
		emit(PullEvent{Message: "image " + key + " is cached"})
		return s.installPulled(name, key, "", o.LeaseTo)
	}
	tmp, err := s.tempImageDir(".pull-" + key)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	meta := newTemplate(key)
	meta.Ref, meta.Digest, meta.Source = img.Ref, img.ManifestDigest.String(), src
	meta.Entrypoint, meta.Cmd = cf.Config.Entrypoint, cf.Config.Cmd
	meta.StartCmd, meta.ReadyCmd = cf.Config.Labels[LabelStartCmd], cf.Config.Labels[LabelReadyCmd]
	for _, d := range diffIDs {
		meta.Layers = append(meta.Layers, d.String())
	}
	meta.Env = mergeEnv(DefaultEnv, cf.Config.Env)
	lowers, err := s.layerDirs(meta.Layers)
	if err != nil {
		return nil, err
	}
	fin, err := finalize(lowers, filepath.Join(tmp, "finalize"), s.tmpDir(), cf.Config.User)
	if err != nil {
		return nil, fmt.Errorf("finalize: %w", err)
	}
	for _, n := range fin.notes {
		emit(PullEvent{Message: "finalize: " + n})
	}
	meta.User, meta.UID, meta.GID = fin.user, fin.uid, fin.gid
	meta.Workdir = cf.Config.WorkingDir
	if meta.Workdir == "" {
		meta.Workdir = fin.home
	}
	meta.Finalize = fin.changed
	if !fin.changed {
		os.RemoveAll(filepath.Join(tmp, "finalize"))
	} else {
		size += dirSize(filepath.Join(tmp, "finalize"))
	}
	meta.Size = size
	if err := writeImageMeta(tmp, meta); err != nil {
		return nil, err
	}
	return s.installPulled(name, key, tmp, o.LeaseTo)
}

// installPulled names the pulled image, or leases it to leaseTo.
func (s *Store) installPulled(name, key, tmp, leaseTo string) (*Template, error) {
	if leaseTo == "" {
		if err := s.install(name, key, tmp); err != nil {
			return nil, err
		}
		return s.Get(name)
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Stat(s.imageDir(key)); tmp != "" && errors.Is(err, fs.ErrNotExist) {
		if err := os.Rename(tmp, s.imageDir(key)); err != nil {
			return nil, fmt.Errorf("install image %s: %w", key, err)
		}
	}
	t, err := s.readImage(key)
	if err != nil {
		return nil, err
	}
	if _, err := s.acquireLocked(leaseTo, t); err != nil {
		return nil, err
	}
	return t, nil
}

// Labels of a pushed template's image config: its build's start and
// ready commands (Push writes them, Pull reads them back). Like the
// image's Cmd they run only inside its sandboxes, and only where cella
// runs a start command: a build from the template, and a cluster node's
// capture of a build it pulled.
const (
	LabelStartCmd = "org.cella.template.start-cmd"
	LabelReadyCmd = "org.cella.template.ready-cmd"
)

// maxImageLayers leaves room in overlayfs's 500 for snapshot layers.
const maxImageLayers = 400

func (s *Store) unpackLayer(ctx context.Context, l v1.Layer, id string, plain bool, ev PullEvent, emit func(PullEvent)) (layerstore.Info, error) {
	var (
		blob layerstore.Blob
		rc   io.ReadCloser
		err  error
	)
	if plain {
		rc, err = l.Uncompressed()
		blob = layerstore.Blob{Size: -1, MediaType: string(types.OCIUncompressedLayer)}
	} else {
		d, derr := l.Digest()
		sz, serr := l.Size()
		mt, _ := l.MediaType()
		if err = errors.Join(derr, serr); err == nil {
			rc, err = l.Compressed()
		}
		blob = layerstore.Blob{Digest: d.String(), Size: sz, MediaType: string(mt)}
	}
	if err != nil {
		return layerstore.Info{}, fmt.Errorf("fetch layer %s: %w", id, err)
	}
	defer rc.Close()
	blob.R = rc
	ev.Total = blob.Size
	emit(ev)
	var last time.Time
	in, cached, err := s.Layers.Unpack(ctx, id, blob, func(n int64) {
		// A few updates a second at most, whatever the read size.
		if now := time.Now(); now.Sub(last) >= 250*time.Millisecond {
			last = now
			ev.Read = n
			emit(ev)
		}
	})
	if err != nil {
		return in, err
	}
	ev.Read, ev.Done, ev.Cached = in.Compressed, true, cached
	if ev.Total < 0 {
		ev.Total = in.Compressed
	}
	emit(ev)
	return in, nil
}

// imageKey is the cache key of an image pulled from an OCI image: its
// config digest names its layers and settings (the finalize layer depends
// on nothing else).
func imageKey(configDigest string) string {
	h := sha256.Sum256([]byte("cella-oci-v1\x00" + configDigest))
	return "o-" + hex.EncodeToString(h[:])[:20]
}

// mergeEnv is base with over's variables set on it (over wins).
func mergeEnv(base, over []string) []string {
	out := slices.Clone(base)
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		i := slices.IndexFunc(out, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		if i >= 0 {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}

// Push exports template name as an OCI image to the registry reference
// ref: one layer per template layer (bottom first, the finalize layer
// included, so the image needs no finalize where it is pulled again), its
// defaults as the image config. It returns the pushed reference by digest.
func (s *Store) Push(ctx context.Context, name, ref string, o PullOptions, progress chan<- v1.Update) (string, error) {
	t, err := s.Get(name)
	if err != nil {
		return "", err
	}
	var layers []v1.Layer
	for _, dir := range slices.Backward(t.Lowers()) {
		opener := func() (io.ReadCloser, error) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(layerstore.WriteTar(pw, dir)) }()
			return pr, nil
		}
		l, err := tarball.LayerFromOpener(opener, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return "", fmt.Errorf("push template %s: layer %s: %w", name, dir, err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return "", fmt.Errorf("push template %s: %w", name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	cf.Config.Env, cf.Config.WorkingDir, cf.Config.User = t.Env, t.Workdir, t.User
	cf.Config.Entrypoint, cf.Config.Cmd = t.Entrypoint, t.Cmd
	cf.Config.Labels = map[string]string{"org.cella.template": name}
	// The build's start and ready commands are the image's (a build on it
	// inherits them; a cluster node that pulls it captures them running).
	if t.StartCmd != "" {
		cf.Config.Labels[LabelStartCmd] = t.StartCmd
	}
	if t.ReadyCmd != "" {
		cf.Config.Labels[LabelReadyCmd] = t.ReadyCmd
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return image.Push(ctx, ref, img, image.Options{Hosts: s.Registry, Auth: o.Auth, Keychain: o.Keychain}, progress)
}

// ProgressPrinter prints pull events as lines: messages as they come, a
// layer when it starts, when it is done (or cached), and in between every
// few seconds.
func ProgressPrinter(w io.Writer) func(PullEvent) {
	last := map[string]time.Time{}
	return func(e PullEvent) {
		if e.DiffID == "" {
			fmt.Fprintln(w, e.Message)
			return
		}
		short := strings.TrimPrefix(e.DiffID, "sha256:")[:12]
		head := fmt.Sprintf("layer %d/%d %s:", e.Layer, e.Layers, short)
		switch {
		case e.Cached && e.Done:
			fmt.Fprintf(w, "%s cached (%s)\n", head, humanBytes(e.Total))
		case e.Done:
			fmt.Fprintf(w, "%s done %s\n", head, humanBytes(e.Read))
		case e.Read == 0:
			last[e.DiffID] = time.Now()
			fmt.Fprintf(w, "%s pulling %s\n", head, humanBytes(e.Total))
		case time.Since(last[e.DiffID]) >= 2*time.Second:
			last[e.DiffID] = time.Now()
			fmt.Fprintf(w, "%s %s / %s\n", head, humanBytes(e.Read), humanBytes(e.Total))
		}
	}
}

func humanBytes(n int64) string {
	switch {
	case n < 0:
		return "? bytes"
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
