// Package template manages sandbox templates: a stack of read-only layers
// plus the metadata a sandbox needs to start on it (default user, working
// directory, environment). A template built with debootstrap or imported
// from a directory is one layer (its rootfs); a template from an OCI image
// is the image's layers, unpacked once each in the shared layer store
// (internal/layerstore), plus a small finalize layer of its own.
//
// Layout of the cache directory (default /var/cache/cella):
//
//	images/<key>/rootfs/     a one-layer image's root filesystem, never written after it is built
//	images/<key>/finalize/   an OCI image's finalize layer (user account, home)
//	images/<key>/image.json  the image's metadata (Template without Name)
//	names/<name>.json        {"image": "<key>"}: which image a name points at
//	layers/                  the layer store: OCI image layers by diffID
//	leases/<hash>.json       which image a sandbox or snapshot directory uses (lease.go)
//	tmp/                     what a pull reads an oci-archive into
//	.lock                    flock held while the cache is being changed
//	.pull.lock               flock held shared by every pull and build in progress
//
// Built images are keyed by a hash of their recipe (suite + packages), so a
// second Build of the same recipe, under any name, is instant. Imported
// images get a fresh key each time. An image is built in a temporary
// directory under images/ and renamed into place, so a crash never leaves a
// half-built image under a real key. Images are never rewritten in place:
// running sandboxes use them as their overlay lower layer, and changing a
// lower layer under a mounted overlay is undefined behaviour.
package template

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/fslock"
	"github.com/cella-sandbox/cella/internal/image"
	"github.com/cella-sandbox/cella/internal/layerstore"
)

// ErrNotFound is returned when a template name is unknown.
var ErrNotFound = errors.New("template not found")

// ErrInUse is returned by Delete for a template sandboxes still use.
var ErrInUse = errors.New("template in use")

// Defaults for templates and the store.
const (
	DefaultCacheDir = "/var/cache/cella"
	DefaultMirror   = "http://deb.debian.org/debian"
	// MirrorEnv overrides the Debian mirror for every Build whose recipe
	// does not name one (tests and air-gapped hosts use it).
	MirrorEnv = "CELLA_DEBIAN_MIRROR"

	BaseName = "base"

	DefaultUser    = "user"
	DefaultUID     = 1000
	DefaultGID     = 1000
	DefaultWorkdir = "/home/user"
	DefaultShell   = "/bin/bash"
)

// DefaultEnv is the environment every template starts with.
var DefaultEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LANG=C.UTF-8",
}

// BaseRecipe is the recipe of the "base" template: what E2B's base image
// has and the SDKs' own tests use (`python` as a command, passwordless
// `sudo` for the user, git, curl).
var BaseRecipe = Recipe{
	Suite: "bookworm",
	Packages: []string{
		"bash", "ca-certificates", "coreutils", "curl", "git", "nodejs", "npm",
		"procps", "python-is-python3", "python3", "python3-pip", "python3-venv", "sudo",
	},
}

// CodeInterpreterName is the template E2B's code-interpreter SDK asks for.
const CodeInterpreterName = "code-interpreter-v1"

// ServiceCodeInterpreter is the service name that makes the agent run the
// code-interpreter server (port 49999) in sandboxes of a template: the
// agent's contract names it.
const ServiceCodeInterpreter = agentapi.ServiceCodeInterpreter

// CodeInterpreterRecipe is base plus what the code interpreter's contexts
// run on: IPython (the Python context is IPython's shell), Debian's
// scientific Python stack (pandas DataFrames and matplotlib figures work
// out of the box), R with the packages IRkernel evaluates and displays with
// (the r context), and esbuild (the typescript context strips types with
// it before the Node driver runs the cell).
var CodeInterpreterRecipe = Recipe{
	Suite: BaseRecipe.Suite,
	Packages: append(slices.Clone(BaseRecipe.Packages),
		"esbuild", "python3-ipython", "python3-matplotlib", "python3-numpy", "python3-pandas",
		"python3-scipy", "r-base-core", "r-cran-irkernel"),
}

// Builtin is a template cella knows how to build on first use.
type Builtin struct {
	Recipe Recipe
	// Services are started by the agent in every sandbox of the template.
	Services []string
	// MemoryMB and DiskMB, when set, are what a sandbox of the template
	// gets when its create names none, instead of the daemon's defaults
	// (the desktop and a Docker engine need more than 512 MiB).
	MemoryMB, DiskMB int64
}

// Builtins are the templates a daemon builds when a sandbox first asks for
// them: E2B's default template, its code-interpreter template and its
// desktop template (desktop.go).
var Builtins = map[string]Builtin{
	BaseName:            {Recipe: BaseRecipe},
	CodeInterpreterName: {Recipe: CodeInterpreterRecipe, Services: []string{ServiceCodeInterpreter}},
	DesktopName:         {Recipe: DesktopRecipe, MemoryMB: DesktopMemoryMB},
	DockerName:          {Recipe: DockerRecipe, Services: []string{ServiceDocker}, MemoryMB: DockerMemoryMB, DiskMB: DockerDiskMB},
}

// BuiltinMemoryMB is the default memory limit of sandboxes of the builtin
// name, 0 for names without one of their own.
func BuiltinMemoryMB(name string) int64 { return Builtins[name].MemoryMB }

// IsBuiltin reports whether name is built on first use (EnsureNamed).
func IsBuiltin(name string) bool {
	_, ok := Builtins[name]
	return ok
}

// Recipe says how to build a template from Debian packages.
type Recipe struct {
	Suite    string   `json:"suite"`              // e.g. "bookworm"
	Packages []string `json:"packages,omitempty"` // installed with apt-get on top of minbase
	// Mirror is the Debian mirror; empty means $CELLA_DEBIAN_MIRROR or
	// DefaultMirror. It is not part of the cache key: every mirror serves
	// the same packages.
	Mirror string `json:"mirror,omitempty"`
	// Files are made in the image once the packages are installed (the
	// layout an SDK expects beyond what the packages give).
	Files []RecipeFile `json:"files,omitempty"`
	// Setup is a shell script run in the image's chroot after the packages
	// are installed, the files made and the user made (what a builtin needs
	// beyond files: DockerRecipe's). Builtin recipes only: never read from
	// JSON, so no request can run a script on the host. Part of the key.
	Setup string `json:"-"`
}

// RecipeFile is one file a recipe adds to its image: a symlink to Link, a
// copy of the image's own file CopyOf, or Content; its parent directories
// are created. Paths are absolute paths inside the image.
type RecipeFile struct {
	Path    string      `json:"path"`
	Link    string      `json:"link,omitempty"`
	CopyOf  string      `json:"copyOf,omitempty"`
	Content string      `json:"content,omitempty"`
	Mode    fs.FileMode `json:"mode,omitempty"` // of a copy or Content; 0 = 0644
}

var (
	suiteRE   = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~-]+)?$`)
	nameRE    = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`)
)

// Validate rejects recipes that could inject arguments into debootstrap or
// apt-get.
func (r Recipe) Validate() error {
	if !suiteRE.MatchString(r.Suite) {
		return fmt.Errorf("invalid suite %q", r.Suite)
	}
	for _, p := range r.Packages {
		if !packageRE.MatchString(p) {
			return fmt.Errorf("invalid package name %q", p)
		}
	}
	for _, f := range r.Files {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("invalid recipe file path %q: want a clean absolute path", f.Path)
		}
		if f.CopyOf != "" && (!filepath.IsAbs(f.CopyOf) || filepath.Clean(f.CopyOf) != f.CopyOf) {
			return fmt.Errorf("invalid recipe file %s: copyOf %q is not a clean absolute path", f.Path, f.CopyOf)
		}
		if (f.Link != "") && (f.CopyOf != "" || f.Content != "") || (f.CopyOf != "" && f.Content != "") {
			return fmt.Errorf("invalid recipe file %s: give one of link, copyOf and content", f.Path)
		}
	}
	if r.Mirror != "" && !strings.HasPrefix(r.Mirror, "http://") && !strings.HasPrefix(r.Mirror, "https://") && !strings.HasPrefix(r.Mirror, "file://") {
		return fmt.Errorf("invalid mirror %q: want an http, https or file URL", r.Mirror)
	}
	return nil
}

// Key is the cache key of the image the recipe builds.
func (r Recipe) Key() string {
	pkgs := slices.Clone(r.Packages)
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	h := sha256.New()
	// v2: images tuned by fastLoginShell.
	fmt.Fprintf(h, "cella-template-v2\x00%s\x00%s", r.Suite, strings.Join(pkgs, "\x00"))
	if len(r.Files) > 0 { // recipes without files keep the keys they had
		b, _ := json.Marshal(r.Files)
		fmt.Fprintf(h, "\x00files\x00%s", b)
	}
	if r.Setup != "" { // recipes without one keep the keys they had
		fmt.Fprintf(h, "\x00setup\x00%s", r.Setup)
	}
	return "r-" + hex.EncodeToString(h.Sum(nil))[:20]
}

func (r Recipe) mirror() string {
	if r.Mirror != "" {
		return r.Mirror
	}
	if m := os.Getenv(MirrorEnv); m != "" {
		return m
	}
	return DefaultMirror
}

// Template is a stack of layers plus what a sandbox needs to start on it.
type Template struct {
	Name  string `json:"name"`
	Image string `json:"image"` // cache key of the image
	// RootFS is a one-layer image's root filesystem (absolute path; use it
	// as an overlay lower dir only); empty for an OCI image. Lowers lists
	// every template's layers.
	RootFS  string    `json:"rootfs"`
	User    string    `json:"user"`
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	Workdir string    `json:"workdir"`
	Env     []string  `json:"env"`
	Recipe  *Recipe   `json:"recipe,omitempty"` // nil for imported images
	Source  string    `json:"source,omitempty"` // the directory an imported image came from
	Created time.Time `json:"created"`
	// Services are what the agent runs besides envd in sandboxes of this
	// template (ServiceCodeInterpreter). They belong to the name, not to
	// the image: one image may back several names.
	Services []string `json:"services,omitempty"`

	// An image pulled from an OCI image (layered.go):
	// Ref is the reference it resolved to (by digest), Digest its manifest
	// digest, Layers its layers' diffIDs bottom first (OCI order), all in
	// the layer store; Finalize says whether images/<key>/finalize is the
	// top layer. Entrypoint and Cmd are the image's, kept but not run:
	// sandboxes start the agent.
	Ref        string   `json:"ref,omitempty"`
	Digest     string   `json:"digest,omitempty"`
	Layers     []string `json:"layers,omitempty"`
	Finalize   bool     `json:"finalize,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// Size is the bytes its layers hold on disk (0: not recorded).
	Size int64 `json:"size,omitempty"`

	// An image made by a build (derive.go): Base is the image key it
	// stacks on (whatever its kind), BuildLayers the layers the build's
	// steps added, bottom first, in the layer store. StartCmd and ReadyCmd
	// are the build's start and ready commands.
	Base        string   `json:"base,omitempty"`
	BuildLayers []string `json:"buildLayers,omitempty"`
	StartCmd    string   `json:"startCmd,omitempty"`
	ReadyCmd    string   `json:"readyCmd,omitempty"`
	// Snapshot (of the name, not the image) is the memory snapshot, in the
	// building daemon's data dir, that sandboxes of the template start
	// from: its start command already running.
	Snapshot string `json:"snapshot,omitempty"`

	lowers []string
}

// Lowers is the template's layer stack for an overlay, top first: the
// finalize layer, then the image's layers from the top down; or the one
// rootfs.
func (t *Template) Lowers() []string { return slices.Clone(t.lowers) }

// Describe says where the template came from, for listings.
func (t *Template) Describe() string {
	switch {
	case t.Base != "" && t.Ref != "":
		return fmt.Sprintf("build on %s +%d layers", t.Ref, len(t.BuildLayers))
	case t.Base != "":
		return fmt.Sprintf("build +%d layers", len(t.BuildLayers))
	case t.Ref != "":
		return t.Ref
	case t.Recipe != nil:
		return fmt.Sprintf("debootstrap %s +%d packages", t.Recipe.Suite, len(t.Recipe.Packages))
	case t.Source != "":
		return "import " + t.Source
	}
	return "-"
}

// Store is a directory of templates.
type Store struct {
	CacheDir string
	// Layers is the layer store under CacheDir/layers.
	Layers *layerstore.Store
	// Registry says how registries are reached (mirrors, plain HTTP).
	Registry image.Hosts

	mu sync.Mutex // serializes changes within this process; flock across processes
}

// NewStore returns a store rooted at cacheDir (DefaultCacheDir if empty),
// creating the directory.
func NewStore(cacheDir string) (*Store, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	abs, err := filepath.Abs(cacheDir)
	if err != nil {
		return nil, fmt.Errorf("template cache dir %q: %w", cacheDir, err)
	}
	s := &Store{CacheDir: abs}
	for _, d := range []string{s.imagesDir(), s.namesDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create template cache: %w", err)
		}
	}
	// Leases name sandbox directories; tmp/ holds what pulls read.
	for _, d := range []string{s.leasesDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create template cache: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil { // made by an earlier version
			return nil, fmt.Errorf("create template cache: %w", err)
		}
	}
	if s.Layers, err = layerstore.Open(filepath.Join(abs, "layers"), 0); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) imagesDir() string { return filepath.Join(s.CacheDir, "images") }
func (s *Store) namesDir() string  { return filepath.Join(s.CacheDir, "names") }
func (s *Store) leasesDir() string { return filepath.Join(s.CacheDir, "leases") }
func (s *Store) tmpDir() string    { return filepath.Join(s.CacheDir, "tmp") }
func (s *Store) imageDir(key string) string {
	return filepath.Join(s.imagesDir(), key)
}

type nameRecord struct {
	Image    string   `json:"image"`
	Services []string `json:"services,omitempty"`
	Snapshot string   `json:"snapshot,omitempty"`
}

// Get returns the template called name, or an error wrapping ErrNotFound.
func (s *Store) Get(name string) (*Template, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("template %q: %w", name, ErrNotFound)
	}
	b, err := os.ReadFile(filepath.Join(s.namesDir(), name+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("template %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read template %q: %w", name, err)
	}
	var rec nameRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("parse template %q: %w", name, err)
	}
	t, err := s.readImage(rec.Image)
	if err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	t.Name = name
	t.Services = rec.Services
	t.Snapshot = rec.Snapshot
	if t.Services == nil {
		// A builtin name built by hand (cella template build
		// code-interpreter-v1 ...) still gets its services.
		t.Services = Builtins[name].Services
	}
	return t, nil
}

func (s *Store) readImage(key string) (*Template, error) {
	dir := s.imageDir(key)
	b, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("image %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read image %s: %w", key, err)
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("parse image %s: %w", key, err)
	}
	// The cache dir may have moved since the image was written.
	t.Image = key
	if t.Base != "" {
		return s.derivedLowers(&t)
	}
	if len(t.Layers) > 0 {
		t.RootFS = ""
		if t.Finalize {
			t.lowers = append(t.lowers, filepath.Join(dir, "finalize"))
		}
		lowers, err := s.layerDirs(t.Layers)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", key, err)
		}
		t.lowers = append(t.lowers, lowers...)
		return &t, nil
	}
	t.RootFS = filepath.Join(dir, "rootfs")
	if _, err := os.Stat(t.RootFS); err != nil {
		return nil, fmt.Errorf("image %s: %w", key, ErrNotFound)
	}
	t.lowers = []string{t.RootFS}
	return &t, nil
}

// layerDirs turns diffIDs (bottom first) into overlay lower dirs (top
// first). A layer an image holds twice (identical empty layers are common)
// is stacked once, at its top position: applying the same layer again
// lower down changes nothing the top one does not redo, and overlayfs
// refuses a directory twice in one stack.
func (s *Store) layerDirs(diffIDs []string) ([]string, error) {
	var out []string
	for _, id := range slices.Backward(diffIDs) {
		p, err := s.Layers.Path(id)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// List returns every named template, sorted by name.
func (s *Store) List() ([]*Template, error) {
	ents, err := os.ReadDir(s.namesDir())
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []*Template
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		t, err := s.Get(name)
		if errors.Is(err, ErrNotFound) {
			continue // name points at a removed image
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// Delete removes a name, unless a sandbox (of any daemon on this machine)
// started from it still runs or is paused (ErrInUse). The image and its
// layers are garbage-collected once nothing uses them (lease.go).
func (s *Store) Delete(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("template %q: %w", name, ErrNotFound)
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	p := filepath.Join(s.namesDir(), name+".json")
	rec, err := readNameRecord(p)
	if err == nil {
		var users []string
		if users, err = s.sandboxesUsing(name, rec.Image); err == nil && len(users) > 0 {
			err = fmt.Errorf("template %q is used by %d sandbox(es) (%s): kill them first: %w", name, len(users), strings.Join(users, ", "), ErrInUse)
		}
	}
	if err == nil {
		err = os.Remove(p)
	}
	unlock()
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if _, err := s.GC(); err != nil {
		slog.Warn("template cache garbage collection", "err", err)
	}
	return nil
}

func readNameRecord(p string) (nameRecord, error) {
	var rec nameRecord
	b, err := os.ReadFile(p)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("parse %s: %w", p, err)
	}
	return rec, nil
}

// EnsureBase returns the "base" template, building it first if missing.
func (s *Store) EnsureBase(ctx context.Context, progress io.Writer) (*Template, error) {
	return s.EnsureNamed(ctx, BaseName, progress)
}

// EnsureNamed returns the builtin template name, building it from its
// recipe first if missing (an image of the same recipe is reused).
func (s *Store) EnsureNamed(ctx context.Context, name string, progress io.Writer) (*Template, error) {
	b, ok := Builtins[name]
	if !ok {
		return nil, fmt.Errorf("template %q is not a builtin (builtins: %s): %w", name, strings.Join(slices.Sorted(maps.Keys(Builtins)), ", "), ErrNotFound)
	}
	if t, err := s.Get(name); err == nil {
		// A name still built from an older recipe of the builtin is rebuilt
		// (cella's base gained packages); an imported image under a builtin
		// name is the operator's choice and stays.
		if t.Recipe == nil || t.Image == b.Recipe.Key() {
			return t, nil
		}
		fmt.Fprintf(progress, "template %s: image %s is from an older recipe; building %s\n", name, t.Image, b.Recipe.Key())
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if _, err := s.Build(ctx, name, b.Recipe, progress); err != nil {
		return nil, err
	}
	if len(b.Services) > 0 {
		if err := s.setServices(name, b.Services); err != nil {
			return nil, fmt.Errorf("template %q: %w", name, err)
		}
	}
	return s.Get(name)
}

// setServices records the services of a name.
func (s *Store) setServices(name string, services []string) error {
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	p := filepath.Join(s.namesDir(), name+".json")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("read name record: %w", err)
	}
	var rec nameRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("parse name record: %w", err)
	}
	rec.Services = slices.Clone(services)
	b, _ = json.Marshal(rec)
	return writeFileAtomic(p, b, 0o644)
}

// lock takes the cache's cross-process lock.
func (s *Store) lock() (unlock func(), err error) {
	s.mu.Lock()
	f, err := os.OpenFile(filepath.Join(s.CacheDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("open cache lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		s.mu.Unlock()
		return nil, fmt.Errorf("lock template cache: %w", err)
	}
	return func() { f.Close(); s.mu.Unlock() }, nil
}

func (s *Store) setName(name, key string) error {
	b, _ := json.Marshal(nameRecord{Image: key})
	return writeFileAtomic(filepath.Join(s.namesDir(), name+".json"), b, 0o644)
}

// Build builds the template name from recipe, or, if an image of the same
// recipe is cached, just points name at it. Progress lines (including the
// output of debootstrap and apt-get) go to progress, which may be nil.
func (s *Store) Build(ctx context.Context, name string, r Recipe, progress io.Writer) (*Template, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("invalid template name %q", name)
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("build template %q: %w", name, err)
	}
	if progress == nil {
		progress = io.Discard
	}
	key := r.Key()
	if _, err := s.readImage(key); err == nil {
		fmt.Fprintf(progress, "template %s: image %s is cached\n", name, key)
		if err := s.install(name, key, ""); err != nil {
			return nil, fmt.Errorf("name template %q: %w", name, err)
		}
		return s.Get(name)
	}
	// Built without the cache lock (creates take it to lease their image),
	// under the pull lock (the GC leaves temp dirs alone) and a lock per
	// recipe (one build of a recipe at a time on the machine).
	release, err := s.pullLock(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	unlockKey, err := fslock.Exclusive(ctx, filepath.Join(s.imagesDir(), ".build-"+key+".lock"))
	if err != nil {
		return nil, err
	}
	defer unlockKey()
	tmp := ""
	if _, err := s.readImage(key); err != nil { // not built meanwhile
		if tmp, err = s.buildImage(ctx, name, key, r, progress); err != nil {
			return nil, fmt.Errorf("build template %q: %w", name, err)
		}
		defer os.RemoveAll(tmp)
	}
	if err := s.install(name, key, tmp); err != nil {
		return nil, fmt.Errorf("name template %q: %w", name, err)
	}
	return s.Get(name)
}

// install points name at image key, first moving the image built in tmp
// into place unless tmp is "" or the image exists; both under the cache
// lock, so the GC never sees the image without its name. The image the
// name pointed at before is garbage-collected if nothing uses it now.
func (s *Store) install(name, key, tmp string) error {
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	if _, statErr := os.Stat(s.imageDir(key)); tmp != "" && errors.Is(statErr, fs.ErrNotExist) {
		if err := os.Rename(tmp, s.imageDir(key)); err != nil {
			unlock()
			return fmt.Errorf("install image %s: %w", key, err)
		}
	} else if _, err := s.readImage(key); err != nil {
		unlock()
		return err
	}
	prev, _ := readNameRecord(filepath.Join(s.namesDir(), name+".json"))
	err = s.setName(name, key)
	unlock()
	if err == nil && prev.Image != "" && prev.Image != key {
		if _, err := s.GC(); err != nil {
			slog.Warn("template cache garbage collection", "err", err)
		}
	}
	return err
}

// tempImageDir makes the directory an image is made in (images/.KIND-KEY-*,
// which the GC removes after a crash), renamed into place by install.
func (s *Store) tempImageDir(prefix string) (string, error) {
	tmp, err := os.MkdirTemp(s.imagesDir(), prefix+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	return tmp, nil
}

// buildImage runs debootstrap into a temp dir under images/ and returns it.
func (s *Store) buildImage(ctx context.Context, name, key string, r Recipe, progress io.Writer) (string, error) {
	start := time.Now()
	tmp, err := s.tempImageDir(".build-" + key)
	if err != nil {
		return "", err
	}
	ok := false
	defer func() {
		if !ok { // never leave a half-built tree behind, whatever happens
			os.RemoveAll(tmp)
		}
	}()
	root := filepath.Join(tmp, "rootfs")

	step := func(format string, args ...any) {
		fmt.Fprintf(progress, "template %s: "+format+" (%s)\n", append(append([]any{name}, args...), time.Since(start).Round(time.Second))...)
	}
	mirror := r.mirror()
	step("debootstrap --variant=minbase %s from %s", r.Suite, mirror)
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", fmt.Errorf("debootstrap is not installed (apt-get install debootstrap): %w", err)
	}
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", r.Suite, root, mirror)
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("debootstrap %s: %w (see debootstrap's output; the log is %s)", r.Suite, err, filepath.Join(root, "debootstrap", "debootstrap.log"))
	}

	// Keep maintainer scripts from starting services in the chroot.
	policy := filepath.Join(root, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return "", err
	}
	if err := copyResolvConf(root); err != nil {
		return "", err
	}
	if len(r.Packages) > 0 {
		step("apt-get install %s", strings.Join(r.Packages, " "))
		script := "apt-get update && apt-get install -y --no-install-recommends \"$@\""
		if err := runInChroot(ctx, root, progress, append([]string{"/bin/sh", "-c", script, "sh"}, r.Packages...)...); err != nil {
			return "", fmt.Errorf("install packages: %w", err)
		}
	}
	if len(r.Files) > 0 {
		step("add %d files", len(r.Files))
		if err := addRecipeFiles(root, r.Files); err != nil {
			return "", err
		}
	}
	step("create user %s (uid %d)", DefaultUser, DefaultUID)
	if err := EnsureUser(root); err != nil {
		return "", err
	}
	if err := grantSudo(root); err != nil {
		return "", err
	}
	if r.Setup != "" {
		step("setup script")
		if err := runInChroot(ctx, root, progress, "/bin/sh", "-ec", r.Setup); err != nil {
			return "", fmt.Errorf("setup script: %w", err)
		}
	}
	step("clean apt caches")
	if err := runInChroot(ctx, root, progress, "apt-get", "clean"); err != nil {
		return "", fmt.Errorf("apt-get clean: %w", err)
	}
	if err := cleanImage(root); err != nil {
		return "", err
	}
	os.Remove(policy)

	meta := newTemplate(key)
	meta.Recipe = &r
	meta.Size = dirSize(root)
	if err := writeImageMeta(tmp, meta); err != nil {
		return "", err
	}
	step("done: image %s, %d MiB", key, meta.Size>>20)
	ok = true
	return tmp, nil
}

// addRecipeFiles makes files in the image at root, every path resolved
// inside it (os.Root): the packages' symlinks cannot lead a file out.
func addRecipeFiles(root string, files []RecipeFile) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("recipe files: %w", err)
	}
	defer r.Close()
	for _, f := range files {
		rel := strings.TrimPrefix(f.Path, "/")
		if err := r.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
			return fmt.Errorf("recipe file %s: %w", f.Path, err)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		switch {
		case f.Link != "":
			err = r.Symlink(f.Link, rel)
		case f.CopyOf != "":
			var b []byte
			if b, err = r.ReadFile(strings.TrimPrefix(f.CopyOf, "/")); err == nil {
				err = r.WriteFile(rel, b, mode)
			}
		default:
			err = r.WriteFile(rel, []byte(f.Content), mode)
		}
		if err == nil && f.Link == "" {
			err = r.Chmod(rel, mode) // WriteFile's mode is masked by the umask
		}
		if err != nil {
			return fmt.Errorf("recipe file %s: %w", f.Path, err)
		}
	}
	return nil
}

// Import adopts dir as template name: dir is copied (reflinked where the
// filesystem can) into the cache, and user "user" is created in the copy if
// it is missing. dir itself is not changed.
func (s *Store) Import(name, dir string) (*Template, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("invalid template name %q", name)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("import template %q: %w", name, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("import template %q: %s is not a directory", name, dir)
	}
	abs, _ := filepath.Abs(dir)
	release, err := s.pullLock(context.Background())
	if err != nil {
		return nil, err
	}
	defer release()

	key := "i-" + randomHex(10)
	tmp, err := s.tempImageDir(".import-" + key)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "rootfs")
	// cp -a keeps owners, modes, xattrs, hard links, devices and sparse
	// files, which a hand-written copy would have to reimplement.
	out, err := exec.Command("cp", "-a", "--reflink=auto", "--", abs, root).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("import template %q: cp -a %s: %w: %s", name, abs, err, bytes.TrimSpace(out))
	}
	if err := EnsureUser(root); err != nil {
		return nil, fmt.Errorf("import template %q: %w", name, err)
	}
	meta := newTemplate(key)
	meta.Source = abs
	meta.Size = dirSize(root)
	if err := writeImageMeta(tmp, meta); err != nil {
		return nil, err
	}
	if err := s.install(name, key, tmp); err != nil {
		return nil, fmt.Errorf("import template %q: %w", name, err)
	}
	slog.Info("template imported", "name", name, "image", key, "source", abs)
	return s.Get(name)
}

func newTemplate(key string) *Template {
	return &Template{
		Image:   key,
		User:    DefaultUser,
		UID:     DefaultUID,
		GID:     DefaultGID,
		Workdir: DefaultWorkdir,
		Env:     slices.Clone(DefaultEnv),
		Created: time.Now().UTC().Truncate(time.Second),
	}
}

func writeImageMeta(dir string, t *Template) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "image.json"), append(b, '\n'), 0o644)
}

// runInChroot runs argv chrooted into root, with /proc and /dev mounted in
// a private mount namespace of its own, so the mounts vanish with the
// process even if the daemon dies (apt's maintainer scripts need both).
func runInChroot(ctx context.Context, root string, out io.Writer, argv ...string) error {
	script := `set -e
mount -t proc proc "$1/proc"
mount --bind /dev "$1/dev"
root=$1; shift
exec chroot "$root" "$@"`
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", script, "sh", root}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"DEBIAN_FRONTEND=noninteractive",
		"LANG=C.UTF-8",
		"HOME=/root",
	}
	cmd.Stdout, cmd.Stderr = out, out
	return cmd.Run()
}

func copyResolvConf(root string) error {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return nil // no resolver on the host; the mirror may be an IP or file://
	}
	p := filepath.Join(root, "etc/resolv.conf")
	os.Remove(p) // may be a dangling symlink
	return os.WriteFile(p, b, 0o644)
}

// cleanImage removes what a template should not carry: package lists
// (re-fetched by apt-get update), logs and the build host's resolver.
func cleanImage(root string) error {
	for _, glob := range []string{
		"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/debconf/*-old",
		"var/log/*.log", "var/log/apt/*", "tmp/*", "root/.cache",
		// A sandbox is the environment: `pip install` should just work in
		// it, as in E2B's images, instead of refusing under PEP 668.
		"usr/lib/python3*/EXTERNALLY-MANAGED",
	} {
		matches, _ := filepath.Glob(filepath.Join(root, glob))
		for _, m := range matches {
			if filepath.Base(m) == "lock" || filepath.Base(m) == "partial" {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return fmt.Errorf("clean image: %w", err)
			}
		}
	}
	if err := fastLoginShell(root); err != nil {
		return err
	}
	// Each sandbox gets its own resolver config (or none: no network).
	return os.WriteFile(filepath.Join(root, "etc/resolv.conf"), nil, 0o644)
}

// fastLoginShell makes Debian's /etc/profile ask bash for the user ID
// instead of running id(1): every E2B command is `bash -l -c`, and under
// gVisor the fork+exec of that one $(id -u) was half of an exec's time.
// Shells without $EUID (dash) still run id.
func fastLoginShell(root string) error {
	p := filepath.Join(root, "etc/profile")
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tune /etc/profile: %w", err)
	}
	tuned := strings.ReplaceAll(string(b), `"$(id -u)"`, `"${EUID:-$(id -u)}"`)
	if tuned == string(b) {
		return nil
	}
	return os.WriteFile(p, []byte(tuned), 0o644)
}

// EnsureUser makes sure root has user "user" (uid/gid 1000, home
// /home/user owned by it, shell /bin/bash), editing /etc/passwd, /etc/group
// and /etc/shadow directly so that it works for images without useradd
// (busybox) and never runs code from the image on the host.
func EnsureUser(root string) error {
	etc := filepath.Join(root, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return fmt.Errorf("ensure user: %w", err)
	}
	pw := fmt.Sprintf("%s:x:%d:%d::%s:%s", DefaultUser, DefaultUID, DefaultGID, DefaultWorkdir, DefaultShell)
	if err := ensureLine(filepath.Join(etc, "passwd"), DefaultUser, pw, 0o644, true); err != nil {
		return err
	}
	gr := fmt.Sprintf("%s:x:%d:", DefaultUser, DefaultGID)
	if err := ensureLine(filepath.Join(etc, "group"), DefaultUser, gr, 0o644, true); err != nil {
		return err
	}
	days := time.Now().Unix() / 86400
	sh := fmt.Sprintf("%s:*:%d:0:99999:7:::", DefaultUser, days)
	if err := ensureLine(filepath.Join(etc, "shadow"), DefaultUser, sh, 0o640, false); err != nil {
		return err
	}
	home := filepath.Join(root, DefaultWorkdir)
	if _, err := os.Lstat(home); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(home, 0o750); err != nil {
			return fmt.Errorf("create home: %w", err)
		}
		copySkel(filepath.Join(root, "etc/skel"), home)
	} else if err != nil {
		return err
	}
	// Own the whole home tree: imported dirs may carry foreign ids.
	return filepath.WalkDir(home, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, DefaultUID, DefaultGID)
	})
}

// sudoersFile gives the user passwordless sudo, as in E2B's images.
const sudoersFile = "etc/sudoers.d/user"

// grantSudo writes sudoersFile when the image has sudo. sudo elevates only
// inside the sandbox, and not at all under the namespaces runtime, whose
// Landlock sets no_new_privs.
func grantSudo(root string) error {
	if _, err := os.Stat(filepath.Join(root, "etc/sudoers.d")); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("grant sudo: %w", err)
	}
	line := DefaultUser + " ALL=(ALL:ALL) NOPASSWD: ALL\n"
	if err := os.WriteFile(filepath.Join(root, sudoersFile), []byte(line), 0o440); err != nil {
		return fmt.Errorf("grant sudo: %w", err)
	}
	return nil
}

// ensureLine appends line to the colon-separated database file unless an
// entry for name exists. create says whether to create a missing file.
func ensureLine(path, name, line string, mode fs.FileMode, create bool) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if !create {
			return nil
		}
	} else if err != nil {
		return fmt.Errorf("ensure user: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name+":") {
			return nil
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	b = append(b, line+"\n"...)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("ensure user: %w", err)
	}
	return nil
}

func copySkel(skel, home string) {
	ents, err := os.ReadDir(skel)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(skel, e.Name()))
		if err == nil {
			_ = os.WriteFile(filepath.Join(home, e.Name()), b, 0o644)
		}
	}
}

func writeFileAtomic(path string, b []byte, mode fs.FileMode) error {
	tmp := path + ".tmp-" + randomHex(4)
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
