package image

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cella-sandbox/cella/internal/image/registrytest"
)

func testImage(t *testing.T) v1.Image {
	return registrytest.Image(t, v1.Config{Env: []string{"A=1"}, WorkingDir: "/srv"},
		registrytest.Layer(t, registrytest.TarOf(t, registrytest.File{Name: "a", Body: "gzip"}), registrytest.Gzip),
		registrytest.Layer(t, registrytest.TarOf(t, registrytest.File{Name: "b", Body: "zstd"}), registrytest.Zstd),
		registrytest.Layer(t, registrytest.TarOf(t, registrytest.File{Name: "c", Body: "plain"}), registrytest.Uncompressed),
	)
}

func diffIDs(t *testing.T, img v1.Image) string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(cf.RootFS.DiffIDs)
}

func TestOpenRegistry(t *testing.T) {
	reg := registrytest.Start(t)
	want := reg.Push(t, "team/img:tag", testImage(t))
	ctx := context.Background()
	for _, ref := range []string{reg.Ref("team/img:tag"), reg.Ref("team/img@" + want.String()), "docker://" + reg.Ref("team/img:tag")} {
		img, err := Open(ctx, ref, Options{})
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if img.ManifestDigest != want || img.Ref != reg.Ref("team/img@"+want.String()) || img.Via != "" {
			t.Fatalf("%s: digest %s ref %s via %q", ref, img.ManifestDigest, img.Ref, img.Via)
		}
		cf, _ := img.ConfigFile()
		if cf.Config.WorkingDir != "/srv" || len(cf.RootFS.DiffIDs) != 3 {
			t.Fatalf("config %+v", cf)
		}
	}
	// 404: a clear error.
	_, err := Open(ctx, reg.Ref("team/nope:tag"), Options{})
	if err == nil || !strings.Contains(err.Error(), "has no image") {
		t.Fatalf("missing image: %v", err)
	}
	t.Log(err)
}

func TestRegistryAuth(t *testing.T) {
	reg := registrytest.Start(t, registrytest.WithAuth("alice", "s3cret"))
	want := reg.Push(t, "private/img:1", testImage(t))
	ctx := context.Background()
	ref := reg.Ref("private/img:1")
	// No credentials: 401, and the error says how to give them.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	_, err := Open(ctx, ref, Options{})
	if err == nil || !strings.Contains(err.Error(), "--registry-auth") || !strings.Contains(err.Error(), "401") {
		t.Fatalf("no credentials: %v", err)
	}
	t.Log(err)
	// Wrong ones: refused too.
	bad := authn.FromConfig(authn.AuthConfig{Username: "alice", Password: "wrong"})
	if _, err := Open(ctx, ref, Options{Auth: bad}); err == nil || !strings.Contains(err.Error(), "refused access") {
		t.Fatalf("wrong credentials: %v", err)
	}
	// --registry-auth / an API request's credentials.
	img, err := Open(ctx, ref, Options{Auth: reg.Auth()})
	if err != nil || img.ManifestDigest != want {
		t.Fatalf("with credentials: %v", err)
	}
	// ~/.docker/config.json.
	cfgDir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, reg.Addr, auth), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", cfgDir)
	if img, err := Open(ctx, ref, Options{}); err != nil || img.ManifestDigest != want {
		t.Fatalf("with docker config: %v", err)
	}
}

// fromImage('python:3.12-slim') resolves through a docker.io mirror, and a
// registry's own mirror is tried before it.
func TestMirrors(t *testing.T) {
	mirror := registrytest.Start(t)
	want := mirror.Push(t, "library/python:3.12-slim", testImage(t))
	var h Hosts
	if err := h.AddMirror("docker.io=http://" + mirror.Addr); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ref := range []string{"python:3.12-slim", "docker.io/library/python:3.12-slim", "index.docker.io/library/python:3.12-slim"} {
		img, err := Open(ctx, ref, Options{Hosts: h})
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if img.ManifestDigest != want || img.Via != "http://"+mirror.Addr {
			t.Fatalf("%s: digest %s via %q", ref, img.ManifestDigest, img.Via)
		}
	}
	// A mirror that lacks the image: the error names it (docker.io itself
	// is not reachable from here either).
	_, err := Open(ctx, "python:3.13", Options{Hosts: h})
	if err == nil || !strings.Contains(err.Error(), "mirror http://"+mirror.Addr) {
		t.Fatalf("missing in mirror: %v", err)
	}
	// A private registry name mirrored to the local one.
	var h2 Hosts
	if err := h2.AddMirror("registry.example:5000=http://" + mirror.Addr); err != nil {
		t.Fatal(err)
	}
	mirror.Push(t, "team/img:tag", testImage(t))
	if img, err := Open(ctx, "registry.example:5000/team/img:tag", Options{Hosts: h2}); err != nil || img.ManifestDigest != want {
		t.Fatalf("private mirror: %v", err)
	}
	for _, bad := range []string{"docker.io", "docker.io=", "docker.io=ftp://x", "docker.io=http://x/v2/prefix"} {
		if err := (&Hosts{}).AddMirror(bad); err == nil {
			t.Errorf("mirror %q accepted", bad)
		}
	}
}

// A server that is not a registry gets a clear error, quickly.
func TestGarbageRegistry(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "\x00\xffnot json {{{")
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	_, err := Open(context.Background(), host+"/img:tag", Options{Hosts: Hosts{Insecure: []string{host}}})
	if err == nil || !strings.Contains(err.Error(), "registry "+host) {
		t.Fatalf("garbage: %v", err)
	}
	t.Log(err)
}

func TestArchivesAndLayout(t *testing.T) {
	img := testImage(t)
	want := diffIDs(t, img)
	dir := t.TempDir()
	ctx := context.Background()

	// docker-archive: what `docker save` writes.
	da := filepath.Join(dir, "docker.tar")
	tag, _ := name.NewTag("team/img:tag")
	if err := tarball.WriteToFile(da, tag, img); err != nil {
		t.Fatal(err)
	}
	// oci: an OCI layout, and oci-archive: that layout as a tar.
	lp := filepath.Join(dir, "layout")
	p, err := layout.Write(lp, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	oa := filepath.Join(dir, "oci.tar")
	tarDir(t, lp, oa)

	tmp := t.TempDir()
	for _, src := range []string{DockerArchivePrefix + da, OCILayoutPrefix + lp, OCIArchivePrefix + oa} {
		got, err := Open(ctx, src, Options{TempDir: tmp})
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if d := diffIDs(t, got); d != want {
			t.Fatalf("%s: diffIDs %s, want %s", src, d, want)
		}
		ls, _ := got.Layers()
		for _, l := range ls {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, rc)
			rc.Close()
		}
		got.Close()
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Fatalf("oci-archive left %v", ents)
	}
	for _, bad := range []string{DockerArchivePrefix + filepath.Join(dir, "nope.tar"), OCILayoutPrefix + dir, "UPPER/case:tag"} {
		if _, err := Open(ctx, bad, Options{TempDir: tmp}); err == nil {
			t.Errorf("%s opened", bad)
		} else {
			t.Log(err)
		}
	}
	// An oci-archive with a symlink in it is refused.
	evil := filepath.Join(dir, "evil.tar")
	f, _ := os.Create(evil)
	tw := tar.NewWriter(f)
	tw.WriteHeader(&tar.Header{Name: "blobs", Typeflag: tar.TypeSymlink, Linkname: "/etc"})
	tw.Close()
	f.Close()
	if _, err := Open(ctx, OCIArchivePrefix+evil, Options{TempDir: tmp}); err == nil || !strings.Contains(err.Error(), "only files and directories") {
		t.Fatalf("evil oci-archive: %v", err)
	}
}

func TestPlatform(t *testing.T) {
	img := testImage(t)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "arm64"
	arm, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	reg := registrytest.Start(t)
	reg.Push(t, "arm/img:1", arm)
	_, err = Open(context.Background(), reg.Ref("arm/img:1"), Options{})
	if err == nil || !strings.Contains(err.Error(), "linux/arm64") {
		t.Fatalf("arm64 image: %v", err)
	}
	// A multi-platform index: the host's platform is picked.
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	ref, _ := name.ParseReference(reg.Ref("multi/img:1"))
	if err := remoteWriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	got, err := Open(context.Background(), reg.Ref("multi/img:1"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if got.ManifestDigest != want {
		t.Fatalf("picked %s, want the amd64 image %s", got.ManifestDigest, want)
	}
}

func TestPush(t *testing.T) {
	reg := registrytest.Start(t, registrytest.WithAuth("bob", "pw"))
	img := testImage(t)
	updates := make(chan v1.Update, 64)
	var last v1.Update
	done := make(chan struct{})
	go func() {
		for u := range updates {
			last = u
		}
		close(done)
	}()
	ref, err := Push(context.Background(), reg.Ref("pushed/img:1"), img, Options{Auth: reg.Auth()}, updates)
	if err != nil {
		t.Fatal(err)
	}
	<-done
	if last.Total == 0 || last.Complete != last.Total {
		t.Fatalf("progress %+v", last)
	}
	got, err := Open(context.Background(), ref, Options{Auth: reg.Auth()})
	if err != nil || diffIDs(t, got) != diffIDs(t, img) {
		t.Fatalf("pull back: %v", err)
	}
	if _, err := Push(context.Background(), reg.Ref("pushed/img:2"), img, Options{}, nil); err == nil || !strings.Contains(err.Error(), "--registry-auth") {
		t.Fatalf("push without credentials: %v", err)
	}
}

// tarDir writes dir's files as a tar at dst (an oci-archive).
func tarDir(t *testing.T, dir, dst string) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, _ := d.Info()
		hdr, _ := tar.FileInfoHeader(fi, "")
		hdr.Name = rel
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Close()
}

func remoteWriteIndex(ref name.Reference, idx v1.ImageIndex) error {
	return remote.WriteIndex(ref, idx)
}
