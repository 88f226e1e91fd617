package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cella-sandbox/cella/internal/image/registrytest"
	"github.com/cella-sandbox/cella/internal/layerstore"
	"github.com/cella-sandbox/cella/internal/rootfs"
)

type F = registrytest.File

// threeLayers is a small image: a base, a layer that deletes and replaces
// things (whiteout, opaque dir), and a small top layer.
func threeLayers(t *testing.T, cfg v1.Config, passwd string) v1.Image {
	base := registrytest.TarOf(t,
		F{Name: "etc", Dir: true}, F{Name: "etc/passwd", Body: passwd}, F{Name: "etc/group", Body: "root:x:0:\n"},
		F{Name: "etc/skel", Dir: true}, F{Name: "etc/skel/.profile", Body: "# skel\n"},
		F{Name: "bin", Dir: true}, F{Name: "bin/sh", Body: "#!fake\n", Mode: 0o755},
		F{Name: "opt", Dir: true}, F{Name: "opt/old", Body: "old"}, F{Name: "var", Dir: true}, F{Name: "var/gone", Body: "x"},
		F{Name: "tmp", Dir: true, Mode: 0o1777},
	)
	mid := registrytest.TarOf(t, F{Name: "var/.wh.gone"}, F{Name: "opt/.wh..wh..opq"}, F{Name: "opt/new", Body: "new"})
	top := registrytest.TarOf(t, F{Name: "app", Dir: true}, F{Name: "app/main", Body: "print(1)"})
	return registrytest.Image(t, cfg,
		registrytest.Layer(t, base, registrytest.Gzip),
		registrytest.Layer(t, mid, registrytest.Zstd),
		registrytest.Layer(t, top, registrytest.Uncompressed))
}

func newTestStore(t *testing.T) *Store {
	t.Helper()
	needRoot(t)
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// merged mounts the template's layers read-only and returns the mount.
func merged(t *testing.T, tpl *Template) string {
	t.Helper()
	dir := t.TempDir()
	l, err := rootfs.MountStack(tpl.Lowers(), dir, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Unmount() })
	return l.Root
}

func readFile(t *testing.T, p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// checkStoreClean: no half-made image, name, layer or temp dir.
func checkStoreClean(t *testing.T, s *Store, wantNames ...string) {
	t.Helper()
	ents, _ := os.ReadDir(s.imagesDir())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") && e.IsDir() {
			t.Errorf("leftover %s in images/", e.Name())
		}
	}
	if tmps, _ := os.ReadDir(s.tmpDir()); len(tmps) != 0 {
		t.Errorf("leftover in tmp/: %v", tmps)
	}
	lt, _ := os.ReadDir(filepath.Join(s.Layers.Dir, "tmp"))
	for _, e := range lt {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("leftover layer temp dir %s", e.Name())
		}
	}
	list, _ := s.List()
	var names []string
	for _, tp := range list {
		names = append(names, tp.Name)
	}
	if !slices.Equal(names, wantNames) {
		t.Errorf("names %v, want %v", names, wantNames)
	}
}

func TestPullFromRegistry(t *testing.T) {
	reg := registrytest.Start(t)
	cfg := v1.Config{Env: []string{"PATH=/app/bin:/usr/bin:/bin", "APP=1"}, WorkingDir: "/app", Entrypoint: []string{"/app/main"}, Cmd: []string{"--serve"}}
	img := threeLayers(t, cfg, "root:x:0:0:root:/root:/bin/sh\n")
	digest := reg.Push(t, "team/app:1", img)
	s := newTestStore(t)
	var events []PullEvent
	ctx := context.Background()
	tpl, err := s.Pull(ctx, "app", reg.Ref("team/app:1"), PullOptions{Progress: func(e PullEvent) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Digest != digest.String() || len(tpl.Layers) != 3 || !tpl.Finalize || len(tpl.Lowers()) != 4 || tpl.RootFS != "" {
		t.Fatalf("template %+v", tpl)
	}
	if tpl.User != "user" || tpl.UID != 1000 || tpl.Workdir != "/app" || !slices.Equal(tpl.Entrypoint, cfg.Entrypoint) {
		t.Fatalf("defaults %+v", tpl)
	}
	if !slices.Contains(tpl.Env, "PATH=/app/bin:/usr/bin:/bin") || !slices.Contains(tpl.Env, "APP=1") || !slices.Contains(tpl.Env, "LANG=C.UTF-8") {
		t.Fatalf("env %v", tpl.Env)
	}
	var layerDone, cached int
	for _, e := range events {
		if e.Done {
			layerDone++
		}
		if e.Cached {
			cached++
		}
	}
	if layerDone != 3 || cached != 0 {
		t.Fatalf("events %+v", events)
	}
	root := merged(t, tpl)
	if pw := readFile(t, filepath.Join(root, "etc/passwd")); !strings.Contains(pw, "root:x:0:0") || !strings.Contains(pw, "user:x:1000:1000::/home/user:/bin/sh\n") {
		t.Fatalf("passwd %q", pw)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, "home/user"), &st); err != nil || st.Uid != 1000 {
		t.Fatalf("home: %v uid %d", err, st.Uid)
	}
	if readFile(t, filepath.Join(root, "home/user/.profile")) != "# skel\n" {
		t.Fatal("skel not copied")
	}
	if _, err := os.Stat(filepath.Join(root, "var/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("whiteout not applied")
	}
	if _, err := os.Stat(filepath.Join(root, "opt/old")); !errors.Is(err, os.ErrNotExist) || readFile(t, filepath.Join(root, "opt/new")) != "new" {
		t.Fatal("opaque dir not applied")
	}
	if readFile(t, filepath.Join(root, "app/main")) != "print(1)" {
		t.Fatal("top layer missing")
	}

	// The same image under another name: every layer cached, one image.
	events = nil
	tpl2, err := s.Pull(ctx, "app2", reg.Ref("team/app@"+digest.String()), PullOptions{Progress: func(e PullEvent) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	cached = 0
	for _, e := range events {
		if e.Cached {
			cached++
		}
	}
	if tpl2.Image != tpl.Image || cached != 3 {
		t.Fatalf("second pull: image %s vs %s, %d cached", tpl2.Image, tpl.Image, cached)
	}
	checkStoreClean(t, s, "app", "app2")
}

// An image that has its own account gets no finalize changes for it, and
// an image's User becomes the default user.
func TestPullUsers(t *testing.T) {
	reg := registrytest.Start(t)
	s := newTestStore(t)
	ctx := context.Background()
	withUser := threeLayers(t, v1.Config{}, "root:x:0:0::/root:/bin/sh\nuser:x:1001:1001::/home/u:/bin/sh\n")
	reg.Push(t, "u/has:1", withUser)
	tpl, err := s.Pull(ctx, "has", reg.Ref("u/has:1"), PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.User != "user" || tpl.UID != 1001 || tpl.Workdir != "/home/u" || tpl.Finalize {
		t.Fatalf("template %+v", tpl)
	}
	app := threeLayers(t, v1.Config{User: "1002:1002"}, "root:x:0:0::/root:/bin/sh\napp:x:1002:1002::/srv:/bin/sh\n")
	reg.Push(t, "u/app:1", app)
	if tpl, err = s.Pull(ctx, "appuser", reg.Ref("u/app:1"), PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if tpl.User != "app" || tpl.UID != 1002 || tpl.Workdir != "/srv" {
		t.Fatalf("template %+v", tpl)
	}
}

func TestPullArchives(t *testing.T) {
	s := newTestStore(t)
	img := threeLayers(t, v1.Config{}, "root:x:0:0::/root:/bin/sh\n")
	dir := t.TempDir()
	da := filepath.Join(dir, "saved.tar")
	tag, _ := name.NewTag("team/app:1")
	if err := tarball.WriteToFile(da, tag, img); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tpl, err := s.Pull(ctx, "fromdocker", "docker-archive:"+da, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if readFile(t, filepath.Join(merged(t, tpl), "app/main")) != "print(1)" {
		t.Fatal("docker-archive layers missing")
	}
	checkStoreClean(t, s, "fromdocker")
}

// Bad inputs fail with a clear error, and leave no name, image, layer
// (of the bad one) or temp dir behind.
func TestPullBadInputs(t *testing.T) {
	reg := registrytest.Start(t)
	auth := registrytest.Start(t, registrytest.WithAuth("u", "p"))
	s := newTestStore(t)
	ctx := context.Background()
	good := threeLayers(t, v1.Config{}, "root:x:0:0::/root:/bin/sh\n")
	reg.Push(t, "ok/img:1", good)

	evil := registrytest.Image(t, v1.Config{}, registrytest.Layer(t, registrytest.TarOf(t, F{Name: "../escape", Body: "x"}), registrytest.Gzip))
	reg.Push(t, "evil/dotdot:1", evil)
	escape := registrytest.Image(t, v1.Config{}, registrytest.Layer(t, registrytest.TarOf(t,
		F{Name: "a", Link: "/etc"}, F{Name: "a/passwd", Body: "root::0:0::/:/bin/sh\n"}), registrytest.Gzip))
	reg.Push(t, "evil/symlink:1", escape)

	// A config whose diffID does not match its layer.
	cf, _ := good.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[1] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	lying, err := mutate.ConfigFile(good, cf)
	if err != nil {
		t.Fatal(err)
	}
	reg.Push(t, "evil/diffid:1", lying)

	// Blobs damaged in the registry's own storage: truncated, and the same
	// length with other bytes (a wrong digest).
	big := registrytest.Image(t, v1.Config{}, registrytest.Layer(t, registrytest.TarOf(t, F{Name: "big", Body: strings.Repeat("abcdefgh", 4096)}), registrytest.Uncompressed))
	reg.Push(t, "bad/trunc:1", big)
	corrupt := registrytest.Image(t, v1.Config{}, registrytest.Layer(t, registrytest.TarOf(t, F{Name: "big", Body: strings.Repeat("zyxwvuts", 4096)}), registrytest.Uncompressed))
	reg.Push(t, "bad/corrupt:1", corrupt)
	damage := func(img v1.Image, how func(p string)) {
		ls, _ := img.Layers()
		d, _ := ls[0].Digest()
		how(filepath.Join(reg.Dir, "data/docker/registry/v2/blobs/sha256", d.Hex[:2], d.Hex, "data"))
	}
	damage(big, func(p string) {
		if err := os.Truncate(p, 5000); err != nil {
			t.Fatal(err)
		}
	})
	damage(corrupt, func(p string) {
		b, _ := os.ReadFile(p)
		b[len(b)/2] ^= 0xff
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	})

	cases := []struct{ name, ref, words string }{
		{"dotdot", reg.Ref("evil/dotdot:1"), "'..' in name"},
		{"symlink escape", reg.Ref("evil/symlink:1"), "leads out of the layer"},
		{"wrong diffID", reg.Ref("evil/diffid:1"), "not the diffID"},
		{"truncated blob", reg.Ref("bad/trunc:1"), "layer 1/1"},
		{"wrong digest", reg.Ref("bad/corrupt:1"), "layer 1/1"},
		{"401", auth.Ref("private/img:1"), "refused access"},
		{"404", reg.Ref("ok/missing:1"), "has no image"},
		{"not a file", "docker-archive:/nonexistent.tar", "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Pull(ctx, "bad", c.ref, PullOptions{})
			if err == nil || !strings.Contains(err.Error(), c.words) {
				t.Fatalf("err = %v, want one mentioning %q", err, c.words)
			}
			t.Log(err)
			checkStoreClean(t, s)
		})
	}
	// Only the good layers of the lying image may be in the store; the
	// damaged ones are not.
	for _, img := range []v1.Image{big, corrupt, evil, escape} {
		cf, _ := img.ConfigFile()
		if s.Layers.Has(cf.RootFS.DiffIDs[0].String()) {
			t.Fatal("a bad layer is in the store")
		}
	}
	// The GC removes the layers no image uses (the lying image's first).
	if _, err := s.GC(); err != nil {
		t.Fatal(err)
	}
	if ids, _ := s.Layers.List(); len(ids) != 0 {
		t.Fatalf("layers left: %v", ids)
	}
	if _, err := os.Stat("/escape"); err == nil {
		t.Fatal("a layer wrote /escape")
	}
}

func TestMaxLayerSize(t *testing.T) {
	reg := registrytest.Start(t)
	s := newTestStore(t)
	s.Layers.MaxLayerSize = 64 << 10
	big := registrytest.Image(t, v1.Config{}, registrytest.Layer(t, registrytest.TarOf(t, F{Name: "zeros", Body: string(make([]byte, 1<<20))}), registrytest.Gzip))
	reg.Push(t, "big/img:1", big)
	_, err := s.Pull(context.Background(), "big", reg.Ref("big/img:1"), PullOptions{})
	if !errors.Is(err, layerstore.ErrTooLarge) || !strings.Contains(err.Error(), "--max-layer-size") {
		t.Fatalf("err = %v", err)
	}
	checkStoreClean(t, s)
}

// Leases keep an image and its layers while a sandbox (any daemon's) uses
// them; a name in use cannot be deleted; the GC removes what nothing uses.
func TestLeasesAndGC(t *testing.T) {
	reg := registrytest.Start(t)
	s := newTestStore(t)
	ctx := context.Background()
	one := threeLayers(t, v1.Config{}, "root:x:0:0::/root:/bin/sh\n")
	two := registrytest.Image(t, v1.Config{}, append(layersOf(t, one)[:2], registrytest.Layer(t, registrytest.TarOf(t, F{Name: "v2", Body: "2"}), registrytest.Gzip))...)
	reg.Push(t, "app:1", one)
	reg.Push(t, "app:2", two)
	tpl1, err := s.Pull(ctx, "app", reg.Ref("app:1"), PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sandbox := filepath.Join(t.TempDir(), "sandboxes", "sb1")
	if err := os.MkdirAll(sandbox, 0o700); err != nil {
		t.Fatal(err)
	}
	lowers, err := s.Acquire(sandbox, tpl1)
	if err != nil || !slices.Equal(lowers, tpl1.Lowers()) {
		t.Fatalf("acquire: %v %v", lowers, err)
	}
	if err := s.Delete("app"); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "sb1") {
		t.Fatalf("delete in use: %v", err)
	}
	// The name moves to a new image; the sandbox's image stays.
	tpl2, err := s.Pull(ctx, "app", reg.Ref("app:2"), PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tpl2.Image == tpl1.Image {
		t.Fatal("same image")
	}
	for _, l := range tpl1.Lowers() {
		if _, err := os.Stat(l); err != nil {
			t.Fatalf("a leased layer was removed: %v", err)
		}
	}
	if got, err := s.Leased(sandbox); err != nil || got.Image != tpl1.Image || got.Name != "app" {
		t.Fatalf("leased: %+v %v", got, err)
	}
	// The sandbox goes (its dir removed, as kill or reconciliation do):
	// the old image and the layer only it used are collected.
	if err := os.RemoveAll(sandbox); err != nil {
		t.Fatal(err)
	}
	res, err := s.GC()
	if err != nil || !slices.Equal(res.Images, []string{tpl1.Image}) || len(res.Layers) != 1 || res.Layers[0] != tpl1.Layers[2] {
		t.Fatalf("gc: %+v %v", res, err)
	}
	if err := s.Delete("app"); err != nil {
		t.Fatal(err)
	}
	if ids, _ := s.Layers.List(); len(ids) != 0 {
		t.Fatalf("layers after delete: %v", ids)
	}
	if ents, _ := os.ReadDir(s.imagesDir()); len(ents) != 0 {
		for _, e := range ents {
			if e.IsDir() {
				t.Fatalf("images after delete: %v", ents)
			}
		}
	}
	checkStoreClean(t, s)
}

// An image that holds one layer twice stacks it once.
func TestPullDuplicateLayer(t *testing.T) {
	s := newTestStore(t)
	empty := registrytest.Layer(t, registrytest.TarOf(t), registrytest.Gzip)
	img := registrytest.Image(t, v1.Config{}, append(layersOf(t, threeLayers(t, v1.Config{}, "root:x:0:0::/root:/bin/sh\n")), empty, empty)...)
	p := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, p, img)
	tpl, err := s.Pull(context.Background(), "dup", "oci:"+p, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tpl.Layers) != 5 || len(tpl.Lowers()) != 5 {
		t.Fatalf("layers %d, lowers %d", len(tpl.Layers), len(tpl.Lowers()))
	}
	if readFile(t, filepath.Join(merged(t, tpl), "app/main")) != "print(1)" {
		t.Fatal("merged view wrong")
	}
}

func layersOf(t *testing.T, img v1.Image) []v1.Layer {
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// A template pushed to a registry and pulled back elsewhere is the same
// root (its finalize layer travels as a layer, so it needs no new one).
func TestPushRoundTrip(t *testing.T) {
	reg := registrytest.Start(t, registrytest.WithAuth("me", "pw"))
	s := newTestStore(t)
	ctx := context.Background()
	img := threeLayers(t, v1.Config{WorkingDir: "/app"}, "root:x:0:0::/root:/bin/sh\n")
	dir := t.TempDir()
	da := filepath.Join(dir, "saved.tar")
	if err := tarball.WriteToFile(da, mustTag(t, "x/y:1"), img); err != nil {
		t.Fatal(err)
	}
	tpl, err := s.Pull(ctx, "src", "docker-archive:"+da, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := s.Push(ctx, "src", reg.Ref("travel/src:1"), PullOptions{Auth: reg.Auth()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := newTestStore(t)
	back, err := other.Pull(ctx, "back", ref, PullOptions{Auth: reg.Auth()})
	if err != nil {
		t.Fatal(err)
	}
	if back.Finalize || len(back.Layers) != 4 || back.Workdir != "/app" || back.User != "user" {
		t.Fatalf("pulled back %+v", back)
	}
	a, b := merged(t, tpl), merged(t, back)
	for _, p := range []string{"etc/passwd", "app/main", "opt/new", "home/user/.profile"} {
		if readFile(t, filepath.Join(a, p)) != readFile(t, filepath.Join(b, p)) || readFile(t, filepath.Join(b, p)) == "" {
			t.Fatalf("%s differs after the round trip", p)
		}
	}
	if _, err := os.Stat(filepath.Join(b, "var/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("whiteout lost in the round trip")
	}

	// A build's start and ready commands, user, workdir and env travel in
	// the image's config (a cluster node that pulls it runs them).
	holder := filepath.Join(t.TempDir(), "holder")
	if err := os.Mkdir(holder, 0o700); err != nil {
		t.Fatal(err)
	}
	d := Defaults{User: "user", UID: 1000, GID: 1000, Workdir: "/srv", Env: append(slices.Clone(tpl.Env), "WORD=hello"),
		StartCmd: "python3 -m http.server 8000", ReadyCmd: "curl -sf http://127.0.0.1:8000/"}
	derived, err := s.Derive(holder, tpl, nil, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Name("built", derived.Image, "", nil); err != nil {
		t.Fatal(err)
	}
	ref, err = s.Push(ctx, "built", reg.Ref("travel/built:1"), PullOptions{Auth: reg.Auth()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := other.Pull(ctx, "built-back", ref, PullOptions{Auth: reg.Auth()})
	if err != nil {
		t.Fatal(err)
	}
	if pulled.StartCmd != d.StartCmd || pulled.ReadyCmd != d.ReadyCmd || pulled.User != "user" || pulled.Workdir != "/srv" ||
		!slices.Contains(pulled.Env, "WORD=hello") {
		t.Fatalf("the build pulled back: start %q, ready %q, user %q, workdir %q, env %v; want %+v",
			pulled.StartCmd, pulled.ReadyCmd, pulled.User, pulled.Workdir, pulled.Env, d)
	}
	if plain, err := other.Get("back"); err != nil || plain.StartCmd != "" || plain.ReadyCmd != "" {
		t.Fatalf("an image without them pulled back with %+v (%v)", plain, err)
	}
}

func writeLayout(t *testing.T, dir string, img v1.Image) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
}

func mustTag(t *testing.T, s string) name.Tag {
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// The GC leaves layers and temp dirs alone while a pull or build runs
// anywhere (their layers exist before their image record), and removes a
// crashed pull's leftovers once none does.
func TestGCWaitsForPulls(t *testing.T) {
	s := newTestStore(t)
	p := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, p, threeLayers(t, v1.Config{}, "root:x:0:0::/root:/bin/sh\n"))
	ctx := context.Background()
	if _, err := s.Pull(ctx, "a", "oci:"+p, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	crashed := []string{filepath.Join(s.imagesDir(), ".pull-o-x-1"), filepath.Join(s.Layers.Dir, "tmp", "ab-1"), filepath.Join(s.tmpDir(), "oci-archive-1")}
	for _, d := range crashed {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	release, err := s.pullLock(ctx) // a pull in progress, in another process as far as flock knows
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if ids, _ := s.Layers.List(); len(ids) != 3 {
		t.Fatalf("layers swept during a pull: %v", ids)
	}
	for _, d := range crashed {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("temp dir %s removed during a pull", d)
		}
	}
	release()
	res, err := s.GC()
	if err != nil || res.LayersSkipped || len(res.Layers) != 3 {
		t.Fatalf("gc: %+v %v", res, err)
	}
	for _, d := range crashed {
		if _, err := os.Stat(d); err == nil {
			t.Fatalf("crashed temp dir %s kept", d)
		}
	}
	checkStoreClean(t, s)
}
