// Package image finds OCI and Docker images where they are kept — a
// registry (through mirrors, plain HTTP where configured, with
// credentials), a `docker save` tarball, an OCI archive or an OCI layout —
// and pushes images to registries. The registry protocol, manifests,
// platforms and layer media types are go-containerregistry's; this package
// only chooses where to look and what to tell the user when it fails. It
// knows nothing of how layers are unpacked (internal/layerstore) or what a
// template is (internal/template).
package image

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Source prefixes (skopeo's transport names).
const (
	DockerArchivePrefix = "docker-archive:"
	OCIArchivePrefix    = "oci-archive:"
	OCILayoutPrefix     = "oci:"
	registryPrefix      = "docker://"
)

// dockerHub is how users name Docker Hub; go-containerregistry calls it
// index.docker.io.
const dockerHub = "docker.io"

// Hosts says how registries are reached, the way containerd's hosts.toml
// does: for a registry, its mirrors are tried in order before the registry
// itself; an http:// mirror, or a registry listed as insecure, is spoken to
// over plain HTTP.
type Hosts struct {
	// Mirrors maps a registry host ("docker.io", "registry.example:5000")
	// to endpoint URLs ("http://127.0.0.1:5000").
	Mirrors map[string][]string
	// Insecure registry hosts are reached over plain HTTP (and HTTPS
	// without certificate checks).
	Insecure []string
}

// AddMirror parses "REGISTRY=URL" (cella serve --registry-mirror) into h.
func (h *Hosts) AddMirror(spec string) error {
	reg, endpoint, ok := strings.Cut(spec, "=")
	if !ok || reg == "" || endpoint == "" {
		return fmt.Errorf("registry mirror %q: want REGISTRY=URL, e.g. docker.io=http://127.0.0.1:5000", spec)
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.User != nil {
		return fmt.Errorf("registry mirror %q: the mirror must be an http:// or https:// URL of a registry's root, e.g. http://127.0.0.1:5000", spec)
	}
	if h.Mirrors == nil {
		h.Mirrors = map[string][]string{}
	}
	h.Mirrors[reg] = append(h.Mirrors[reg], u.Scheme+"://"+u.Host)
	return nil
}

func (h Hosts) insecure(host string) bool {
	return slices.Contains(h.Insecure, host) || (host == name.DefaultRegistry && slices.Contains(h.Insecure, dockerHub))
}

func (h Hosts) mirrors(host string) []string {
	m := h.Mirrors[host]
	if host == name.DefaultRegistry {
		m = append(slices.Clone(m), h.Mirrors[dockerHub]...)
	}
	return m
}

// Options are how to reach an image.
type Options struct {
	Hosts Hosts
	// Auth, when set, is used for the image's own registry (for example
	// from --registry-auth or an API request); otherwise credentials come
	// from Keychain.
	Auth authn.Authenticator
	// Keychain finds credentials per registry; nil means the Docker config
	// (~/.docker/config.json, $DOCKER_CONFIG) and credential helpers.
	Keychain authn.Keychain
	// Platform to pick from a multi-platform image; zero means linux and
	// this host's architecture.
	Platform v1.Platform
	// TempDir holds what an oci-archive is extracted to while it is read.
	TempDir string
	// MaxBlobSize bounds each file an oci-archive may hold.
	MaxBlobSize int64
}

func (o Options) platform() v1.Platform {
	if o.Platform.OS == "" {
		return v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}
	}
	return o.Platform
}

func (o Options) keychain() authn.Keychain {
	if o.Keychain != nil {
		return o.Keychain
	}
	return authn.DefaultKeychain
}

// Image is an image found by Open.
type Image struct {
	v1.Image
	// Source is what the user asked for, Ref the reference it resolved to
	// (a registry image by digest, through the mirror that served it), and
	// ManifestDigest its manifest's digest.
	Source         string
	Ref            string
	ManifestDigest v1.Hash
	// Via names the mirror that served a registry image ("" = the
	// registry itself).
	Via string

	cleanup func()
}

// Close releases what Open made on disk (an extracted oci-archive).
func (i *Image) Close() {
	if i.cleanup != nil {
		i.cleanup()
	}
}

// Open finds the image src names: a registry reference
// (registry.example:5000/team/img:tag, img@sha256:..., docker://...),
// docker-archive:PATH, oci-archive:PATH or oci:DIR.
func Open(ctx context.Context, src string, o Options) (*Image, error) {
	var (
		img *Image
		err error
	)
	switch {
	case strings.HasPrefix(src, DockerArchivePrefix):
		img, err = openDockerArchive(strings.TrimPrefix(src, DockerArchivePrefix))
	case strings.HasPrefix(src, OCIArchivePrefix):
		img, err = openOCIArchive(strings.TrimPrefix(src, OCIArchivePrefix), o)
	case strings.HasPrefix(src, OCILayoutPrefix):
		img, err = openLayout(strings.TrimPrefix(src, OCILayoutPrefix), o.platform())
	default:
		img, err = openRemote(ctx, strings.TrimPrefix(src, registryPrefix), o)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", src, err)
	}
	img.Source = src
	if err := checkPlatform(img, o.platform()); err != nil {
		img.Close()
		return nil, fmt.Errorf("image %s: %w", src, err)
	}
	return img, nil
}

func checkPlatform(img *Image, want v1.Platform) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("read image config: %w", err)
	}
	if cf.OS != "" && cf.OS != want.OS {
		return fmt.Errorf("the image is for %s/%s; sandboxes run %s/%s", cf.OS, cf.Architecture, want.OS, want.Architecture)
	}
	if cf.Architecture != "" && cf.Architecture != want.Architecture {
		return fmt.Errorf("the image is for %s/%s; this host runs %s/%s", cf.OS, cf.Architecture, want.OS, want.Architecture)
	}
	return nil
}

func openDockerArchive(path string) (*Image, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		return nil, fmt.Errorf("read docker-archive (a `docker save` tarball of one image): %w", err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("read docker-archive: %w", err)
	}
	return &Image{Image: img, Ref: DockerArchivePrefix + path, ManifestDigest: d}, nil
}

func openLayout(dir string, p v1.Platform) (*Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read OCI layout: %w", err)
	}
	img, err := imageOfIndex(idx, p)
	if err != nil {
		return nil, err
	}
	d, err := img.Digest()
	if err != nil {
		return nil, err
	}
	return &Image{Image: img, Ref: OCILayoutPrefix + dir, ManifestDigest: d}, nil
}

// imageOfIndex picks the one image of an index (an OCI layout's
// index.json, or a multi-platform image) for platform p.
func imageOfIndex(idx v1.ImageIndex, p v1.Platform) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	descs := im.Manifests
	if len(descs) > 1 {
		if descs, err = partial.FindManifests(idx, match.Platforms(p)); err != nil {
			return nil, err
		}
	}
	switch {
	case len(descs) == 0:
		return nil, fmt.Errorf("no image for %s/%s in the index", p.OS, p.Architecture)
	case len(descs) > 1:
		return nil, fmt.Errorf("%d images for %s/%s in the index; keep one", len(descs), p.OS, p.Architecture)
	}
	d := descs[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		return imageOfIndex(child, p)
	}
	if !d.MediaType.IsImage() {
		return nil, fmt.Errorf("index entry %s is a %s, not an image", d.Digest, d.MediaType)
	}
	return idx.Image(d.Digest)
}

// openRemote resolves ref through its registry's mirrors, then the
// registry itself, and returns the image for the platform.
func openRemote(ctx context.Context, s string, o Options) (*Image, error) {
	ref, err := parseRef(s, o.Hosts)
	if err != nil {
		return nil, err
	}
	host := ref.Context().RegistryStr()
	var errs []error
	for _, m := range o.Hosts.mirrors(host) {
		mref, err := viaMirror(ref, m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// A mirror gets the keychain's credentials for the mirror, never
		// the ones given for the registry.
		img, err := fetch(mref, remoteOptions(ctx, o, nil), o.platform())
		if err == nil {
			img.Via = m
			return img, nil
		}
		errs = append(errs, fmt.Errorf("mirror %s: %w", m, err))
	}
	img, err := fetch(ref, remoteOptions(ctx, o, o.Auth), o.platform())
	if err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	return img, nil
}

// parseRef parses a registry reference, marking hosts configured insecure.
func parseRef(s string, h Hosts) (name.Reference, error) {
	ref, err := name.ParseReference(s)
	if err != nil {
		return nil, fmt.Errorf("not an image reference (want registry/repo:tag, repo@sha256:..., %sPATH, %sPATH or %sDIR): %w", DockerArchivePrefix, OCIArchivePrefix, OCILayoutPrefix, err)
	}
	if h.insecure(ref.Context().RegistryStr()) {
		ref, err = name.ParseReference(s, name.Insecure)
		if err != nil {
			return nil, err
		}
	}
	return ref, nil
}

// viaMirror is ref with its registry replaced by the mirror's host.
func viaMirror(ref name.Reference, mirror string) (name.Reference, error) {
	u, err := url.Parse(mirror)
	if err != nil {
		return nil, err
	}
	var opts []name.Option
	if u.Scheme == "http" {
		opts = append(opts, name.Insecure)
	}
	repo := u.Host + "/" + ref.Context().RepositoryStr()
	sep := ":"
	if _, ok := ref.(name.Digest); ok {
		sep = "@"
	}
	return name.ParseReference(repo+sep+ref.Identifier(), opts...)
}

func remoteOptions(ctx context.Context, o Options, auth authn.Authenticator) []remote.Option {
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(o.platform()),
		remote.WithUserAgent("cella"),
		// A registry that answers nonsense is not retried for long.
		remote.WithRetryBackoff(remote.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 2}),
	}
	if auth != nil {
		return append(opts, remote.WithAuth(auth))
	}
	return append(opts, remote.WithAuthFromKeychain(o.keychain()))
}

func fetch(ref name.Reference, opts []remote.Option, p v1.Platform) (*Image, error) {
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		return nil, explainRemote(ref, err)
	}
	var img v1.Image
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, explainRemote(ref, err)
		}
		if img, err = imageOfIndex(idx, p); err != nil {
			return nil, err
		}
	} else if img, err = desc.Image(); err != nil {
		return nil, explainRemote(ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, explainRemote(ref, err)
	}
	// Read the config now, so that a server that is no registry fails here,
	// named as one.
	if _, err := img.ConfigFile(); err != nil {
		return nil, explainRemote(ref, fmt.Errorf("read image config: %w", err))
	}
	return &Image{Image: img, Ref: ref.Context().Digest(d.String()).String(), ManifestDigest: d}, nil
}

// explainRemote turns a registry's refusal into a sentence that says what
// to do.
func explainRemote(ref name.Reference, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("registry %s refused access to %s (HTTP %d): give credentials with --registry-auth USER[:PASSWORD] or in ~/.docker/config.json: %w",
				ref.Context().RegistryStr(), ref.Context().RepositoryStr(), te.StatusCode, err)
		case http.StatusNotFound:
			return fmt.Errorf("registry %s has no image %s (HTTP 404): %w", ref.Context().RegistryStr(), ref, err)
		}
		return fmt.Errorf("registry %s answered HTTP %d for %s: %w", ref.Context().RegistryStr(), te.StatusCode, ref, err)
	}
	host := ref.Context().RegistryStr()
	if msg := err.Error(); strings.Contains(msg, "HTTPS client") || strings.Contains(msg, "x509") || strings.Contains(msg, "tls:") {
		return fmt.Errorf("registry %s: %w (a plain-HTTP or self-signed registry needs --insecure-registry %s)", host, err, host)
	}
	return fmt.Errorf("registry %s: %w (is it a registry?)", host, err)
}
