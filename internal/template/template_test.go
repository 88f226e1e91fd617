package template

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// tinyRoot makes a small busybox-like tree without user "user".
func tinyRoot(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"etc", "bin", "home", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":    "root:x:0:\n",
		"etc/hostname": "tiny\n",
		"bin/hello":    "#!/bin/sh\necho hello\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("hello", filepath.Join(dir, "bin/hi")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestImportGetList(t *testing.T) {
	needRoot(t)
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("tiny"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get before import: %v, want ErrNotFound", err)
	}
	src := tinyRoot(t)
	tpl, err := s.Import("tiny", src)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Name != "tiny" || tpl.User != "user" || tpl.Workdir != "/home/user" || len(tpl.Env) == 0 {
		t.Fatalf("unexpected template %+v", tpl)
	}
	if !strings.HasPrefix(tpl.RootFS, s.CacheDir) {
		t.Fatalf("rootfs %s not in the cache", tpl.RootFS)
	}
	passwd, _ := os.ReadFile(filepath.Join(tpl.RootFS, "etc/passwd"))
	if !strings.Contains(string(passwd), "user:x:1000:1000::/home/user:/bin/bash") {
		t.Fatalf("user missing from passwd:\n%s", passwd)
	}
	group, _ := os.ReadFile(filepath.Join(tpl.RootFS, "etc/group"))
	if !strings.Contains(string(group), "user:x:1000:") {
		t.Fatalf("group missing:\n%s", group)
	}
	st, err := os.Stat(filepath.Join(tpl.RootFS, "home/user"))
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 1000 || sys.Gid != 1000 {
		t.Fatalf("home owned by %d:%d", sys.Uid, sys.Gid)
	}
	if l, err := os.Readlink(filepath.Join(tpl.RootFS, "bin/hi")); err != nil || l != "hello" {
		t.Fatalf("symlink not preserved: %q %v", l, err)
	}
	// The source is untouched.
	if b, _ := os.ReadFile(filepath.Join(src, "etc/passwd")); strings.Contains(string(b), "user:") {
		t.Fatal("import changed the source directory")
	}
	got, err := s.Get("tiny")
	if err != nil || got.RootFS != tpl.RootFS {
		t.Fatalf("Get: %+v %v", got, err)
	}
	// A second import under another name gets its own image.
	tpl2, err := s.Import("tiny2", src)
	if err != nil {
		t.Fatal(err)
	}
	if tpl2.RootFS == tpl.RootFS {
		t.Fatal("two imports share an image")
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].Name != "tiny" || list[1].Name != "tiny2" {
		t.Fatalf("List: %v %v", list, err)
	}
	// A reopened store sees the same templates.
	s2, _ := NewStore(s.CacheDir)
	if _, err := s2.Get("tiny2"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("tiny2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("tiny2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after Delete: %v", err)
	}
	// No temp dirs left behind.
	ents, _ := os.ReadDir(filepath.Join(s.CacheDir, "images"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("leftover %s", e.Name())
		}
	}
}

func TestEnsureUserIdempotent(t *testing.T) {
	needRoot(t)
	root := tinyRoot(t)
	for range 2 {
		if err := EnsureUser(root); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if n := strings.Count(string(b), "\nuser:"); n != 1 {
		t.Fatalf("user appears %d times:\n%s", n, b)
	}
}

func TestRecipe(t *testing.T) {
	a := Recipe{Suite: "bookworm", Packages: []string{"git", "curl"}}
	b := Recipe{Suite: "bookworm", Packages: []string{"curl", "git", "git"}, Mirror: "http://example.org/debian"}
	if a.Key() != b.Key() {
		t.Fatal("key depends on package order or mirror")
	}
	if a.Key() == (Recipe{Suite: "trixie", Packages: a.Packages}).Key() {
		t.Fatal("key ignores the suite")
	}
	for _, bad := range []Recipe{
		{Suite: "--foo"},
		{Suite: "bookworm", Packages: []string{"-o=Dpkg::x"}},
		{Suite: "bookworm", Packages: []string{"a b"}},
		{Suite: "bookworm", Mirror: "--keyring=/x"},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
	if err := BaseRecipe.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Setenv(MirrorEnv, "http://mirror.test/debian")
	if a.mirror() != "http://mirror.test/debian" {
		t.Fatal("mirror env ignored")
	}
}

// TestBuild runs debootstrap and apt-get for real (~1-3 min, ~100+ MB
// download). Set CELLA_TEST_DEBOOTSTRAP=1 to run it; set
// CELLA_TEST_TEMPLATE_CACHE to build into a persistent cache (e.g.
// /var/cache/cella to produce the real "base"), otherwise a temp dir. With
// CELLA_TEST_BASE=1 it builds the full base recipe instead of a small one.
func TestBuild(t *testing.T) {
	needRoot(t)
	if os.Getenv("CELLA_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("set CELLA_TEST_DEBOOTSTRAP=1 to run debootstrap (downloads ~100 MB)")
	}
	dir := os.Getenv("CELLA_TEST_TEMPLATE_CACHE")
	if dir == "" {
		dir = t.TempDir()
	}
	s, err := NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	name, recipe := "small", Recipe{Suite: "bookworm", Packages: []string{"python3-minimal"}}
	if os.Getenv("CELLA_TEST_BASE") == "1" {
		name, recipe = BaseName, BaseRecipe
	}
	var progress strings.Builder
	start := time.Now()
	tpl, err := s.Build(ctx, name, recipe, &testWriter{t: t, b: &progress})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s in %s at %s", name, time.Since(start), tpl.RootFS)
	if !strings.Contains(progress.String(), "debootstrap") && !strings.Contains(progress.String(), "cached") {
		t.Fatal("no progress lines")
	}
	// The image works: run its python as user 1000 in a chroot.
	out, err := exec.Command("chroot", "--userspec=1000:1000", tpl.RootFS, "/bin/sh", "-c",
		"id -un && python3 -c 'print(6*7)' && touch /home/user/x && rm /home/user/x").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "user\n42") {
		t.Fatalf("image does not work: %v\n%s", err, out)
	}
	// A second Build of the same recipe under another name is instant.
	start = time.Now()
	tpl2, err := s.Build(ctx, name+"-again", recipe, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second || tpl2.RootFS != tpl.RootFS {
		t.Fatalf("cached build took %s, rootfs %s vs %s", d, tpl2.RootFS, tpl.RootFS)
	}
	_ = s.Delete(name + "-again")
}

type testWriter struct {
	t *testing.T
	b *strings.Builder
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.b.Write(p)
	if s := strings.TrimSpace(string(p)); strings.HasPrefix(s, "template ") {
		w.t.Log(s)
	}
	return len(p), nil
}
