package template

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCodeInterpreterRecipe(t *testing.T) {
	for _, p := range BaseRecipe.Packages {
		if !slices.Contains(CodeInterpreterRecipe.Packages, p) {
			t.Errorf("code-interpreter recipe lacks base package %s", p)
		}
	}
	if CodeInterpreterRecipe.Key() == BaseRecipe.Key() {
		t.Fatal("code-interpreter recipe has base's cache key")
	}
	if err := CodeInterpreterRecipe.Validate(); err != nil {
		t.Fatal(err)
	}
	if !IsBuiltin(BaseName) || !IsBuiltin(CodeInterpreterName) || IsBuiltin("nope") {
		t.Fatal("IsBuiltin")
	}
}

// A builtin name gets its services whether EnsureNamed or a hand-made
// import/build named it; other names get none.
func TestBuiltinServices(t *testing.T) {
	needRoot(t)
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnsureNamed(context.Background(), "not-builtin", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("EnsureNamed of a non-builtin: %v", err)
	}
	src := tinyRoot(t)
	ci, err := s.Import(CodeInterpreterName, src)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ci.Services, []string{ServiceCodeInterpreter}) {
		t.Fatalf("services of %s = %v", CodeInterpreterName, ci.Services)
	}
	other, err := s.Import("other", src)
	if err != nil {
		t.Fatal(err)
	}
	if len(other.Services) != 0 {
		t.Fatalf("services of other = %v", other.Services)
	}
	// EnsureNamed finds the existing name without building.
	got, err := s.EnsureNamed(context.Background(), CodeInterpreterName, nil)
	if err != nil || got.Image != ci.Image {
		t.Fatalf("EnsureNamed = %v, %v", got, err)
	}
	if err := s.setServices("other", []string{"x"}); err != nil {
		t.Fatal(err)
	}
	if o, _ := s.Get("other"); !slices.Equal(o.Services, []string{"x"}) {
		t.Fatalf("recorded services = %v", o.Services)
	}
}

// The builtin templates give user passwordless sudo, as E2B's do, when the
// image has sudo (its sudoers.d), and write nothing when it has not.
func TestGrantSudo(t *testing.T) {
	for _, p := range []string{"sudo", "python-is-python3", "git", "curl"} {
		if !slices.Contains(BaseRecipe.Packages, p) {
			t.Errorf("base recipe lacks %s", p)
		}
	}
	root := t.TempDir()
	if err := grantSudo(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, sudoersFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("sudoers written without sudo: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/sudoers.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := grantSudo(root); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(root, sudoersFile))
	if err != nil || st.Mode().Perm() != 0o440 {
		t.Fatalf("sudoers file: %v %v (sudoers files are 0440)", st, err)
	}
	b, _ := os.ReadFile(filepath.Join(root, sudoersFile))
	if string(b) != "user ALL=(ALL:ALL) NOPASSWD: ALL\n" {
		t.Fatalf("sudoers = %q", b)
	}
}

// seedRecipeImage leaves recipe r's image in s's cache, unnamed, as a
// debootstrap build of it leaves it (what EnsureNamed then finds cached):
// without debootstrap, which a test cannot afford twice.
func seedRecipeImage(t *testing.T, s *Store, r Recipe) {
	t.Helper()
	tmp, err := s.tempImageDir(".build-" + r.Key())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tinyRoot(t), filepath.Join(tmp, "rootfs")); err != nil {
		t.Fatal(err)
	}
	meta := newTemplate(r.Key())
	meta.Recipe = &r
	meta.Size = dirSize(filepath.Join(tmp, "rootfs"))
	if err := writeImageMeta(tmp, meta); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.imageDir(r.Key())); err != nil {
		t.Fatal(err)
	}
}

// holdEnv makes the test binary a daemon stand-in that holds its builtins
// (recipe: the packages in the variable) on the cache dir, then waits to
// be killed (TestBuiltinPerRecipe).
const holdEnv = "CELLA_TEST_HOLD_BUILTINS"

func TestHoldBuiltinsChild(t *testing.T) {
	spec := os.Getenv(holdEnv)
	if spec == "" {
		t.Skip("run by TestBuiltinPerRecipe")
	}
	dir, pkgs, _ := strings.Cut(spec, "|")
	s, err := NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Builtins = map[string]Builtin{BaseName: {Recipe: Recipe{Suite: "bookworm", Packages: strings.Split(pkgs, ",")}}}
	if _, err := s.HoldBuiltins(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("held")
	select {} // until killed
}

// Two cella versions with different recipes of the builtin base share one
// cache: each resolves base to its own recipe's image, in turns, and
// neither flips the other (no shared name is written; an older cella's
// names/base.json changes nothing). An image stays while a daemon of its
// recipe runs (its hold, in another process too), while a sandbox of any
// daemon leases it, and for the grace period after its recipe was last
// used; then the GC collects it.
func TestBuiltinPerRecipe(t *testing.T) {
	dir := t.TempDir()
	rA := Recipe{Suite: "bookworm", Packages: []string{"bash", "curl"}}
	rB := Recipe{Suite: "bookworm", Packages: []string{"bash", "git"}}
	store := func(r Recipe) *Store {
		s, err := NewStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		s.Builtins = map[string]Builtin{BaseName: {Recipe: r}}
		return s
	}
	a, b := store(rA), store(rB)
	seedRecipeImage(t, a, rA)
	seedRecipeImage(t, b, rB)
	ctx := context.Background()
	want := func(s *Store, r Recipe) *Template {
		t.Helper()
		got, err := s.EnsureNamed(ctx, BaseName, nil)
		if err != nil || got.Image != r.Key() || got.Name != BaseName {
			t.Fatalf("EnsureNamed(base) = %+v, %v; want image %s", got, err, r.Key())
		}
		if got, err := s.Get(BaseName); err != nil || got.Image != r.Key() {
			t.Fatalf("Get(base) = %+v, %v; want image %s", got, err, r.Key())
		}
		return got
	}
	for range 2 { // in turns: nothing flips
		want(a, rA)
		want(b, rB)
	}
	if _, err := os.Stat(filepath.Join(dir, "names", "base.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a shared name was written: %v", err)
	}
	// An older cella points the shared name at its own recipe's image.
	if err := os.WriteFile(filepath.Join(dir, "names", "base.json"), []byte(`{"image":"`+rB.Key()+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	want(a, rA)
	want(b, rB)
	list, err := a.List()
	if err != nil || len(list) != 1 || list[0].Name != BaseName || list[0].Image != rA.Key() {
		t.Fatalf("List: %+v, %v", list, err)
	}

	exists := func(r Recipe) bool {
		_, err := os.Stat(a.imageDir(r.Key()))
		return err == nil
	}
	backdate := func(rs ...Recipe) {
		t.Helper()
		old := time.Now().Add(-DefaultBuiltinGrace - time.Hour)
		for _, r := range rs {
			if err := os.Chtimes(a.rootPath(BaseName, r.Key()), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	gc := func() {
		t.Helper()
		if _, err := a.GC(); err != nil {
			t.Fatal(err)
		}
	}
	// Used within the grace period, held by nobody: both stay.
	gc()
	if !exists(rA) || !exists(rB) {
		t.Fatal("an image used within the grace period was collected")
	}

	// A runs (this process holds A's recipe), B's daemon runs in another
	// process; both last used long ago.
	relA, err := a.HoldBuiltins()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^TestHoldBuiltinsChild$", "-test.count=1")
	child.Env = append(os.Environ(), holdEnv+"="+dir+"|"+strings.Join(rB.Packages, ","))
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("child: %q %v", line, err)
	}
	backdate(rA, rB)
	gc()
	if !exists(rA) || !exists(rB) {
		t.Fatal("an image a running daemon holds was collected")
	}
	if err := a.Delete(BaseName); !errors.Is(err, ErrInUse) {
		t.Fatalf("Delete of a held builtin: %v", err)
	}

	// B's daemon dies (kill -9: no release). Its recipe's image is still
	// leased by a sandbox of it, and named by the older cella.
	tb := want(b, rB)
	sandbox := t.TempDir()
	if _, err := b.Acquire(sandbox, tb); err != nil {
		t.Fatal(err)
	}
	child.Process.Kill()
	child.Wait()
	backdate(rB)
	gc()
	if !exists(rB) {
		t.Fatal("a leased image was collected")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "builtins")); len(ents) != 1 {
		t.Fatalf("the dead daemon's hold is still there: %v", ents)
	}
	if err := os.Remove(filepath.Join(dir, "names", "base.json")); err != nil { // the older cella's name goes
		t.Fatal(err)
	}
	gc()
	if !exists(rB) {
		t.Fatal("a leased image was collected")
	}
	os.RemoveAll(sandbox) // the sandbox is gone
	gc()
	if exists(rB) || !exists(rA) {
		t.Fatalf("after B's last use: A %v, B %v; want only A", exists(rA), exists(rB))
	}
	if _, err := b.Get(BaseName); !errors.Is(err, ErrNotFound) {
		t.Fatalf("B's base after its image was collected: %v", err)
	}

	// A stops: the grace period starts from then.
	relA()
	gc()
	if !exists(rA) {
		t.Fatal("the image of a daemon that just stopped was collected")
	}
	backdate(rA)
	gc()
	if exists(rA) {
		t.Fatal("an image unused past the grace period was kept")
	}
}

func TestDockerRecipe(t *testing.T) {
	for _, p := range BaseRecipe.Packages {
		if !slices.Contains(DockerRecipe.Packages, p) {
			t.Errorf("docker recipe lacks base package %s", p)
		}
	}
	if err := DockerRecipe.Validate(); err != nil {
		t.Fatal(err)
	}
	noSetup := DockerRecipe
	noSetup.Setup = ""
	if noSetup.Key() == DockerRecipe.Key() {
		t.Fatal("the setup script is not part of the docker recipe's key")
	}
	if !IsBuiltin(DockerName) || !slices.Equal(Builtins[DockerName].Services, []string{ServiceDocker}) {
		t.Fatalf("docker builtin: %+v", Builtins[DockerName])
	}
	// The script never comes from JSON (a request cannot run one on the host).
	var r Recipe
	if err := json.Unmarshal([]byte(`{"suite":"bookworm","Setup":"touch /pwned","setup":"touch /pwned"}`), &r); err != nil || r.Setup != "" {
		t.Fatalf("a recipe's setup was read from JSON: %q %v", r.Setup, err)
	}
}

// The desktop recipe is base plus what @e2b/desktop runs, and recipe files
// leave the keys of recipes without files (base, code-interpreter) as they
// were: their cached images stay valid.
func TestDesktopRecipe(t *testing.T) {
	for _, p := range append(slices.Clone(BaseRecipe.Packages), "xvfb", "xdotool", "scrot", "x11vnc", "novnc", "websockify", "xfce4-session", "net-tools", "x11-xserver-utils", "x11-utils") {
		if !slices.Contains(DesktopRecipe.Packages, p) {
			t.Errorf("desktop recipe lacks %s", p)
		}
	}
	if err := DesktopRecipe.Validate(); err != nil {
		t.Fatal(err)
	}
	if BaseRecipe.Key() != "r-90ec4ee5dbe247685efb" || CodeInterpreterRecipe.Key() != "r-9a841ac9846148abd3ea" {
		t.Fatalf("the keys of base (%s) and code-interpreter-v1 (%s) changed", BaseRecipe.Key(), CodeInterpreterRecipe.Key())
	}
	noFiles := DesktopRecipe
	noFiles.Files = nil
	if noFiles.Key() == DesktopRecipe.Key() {
		t.Fatal("recipe files are not part of the key")
	}
	if !IsBuiltin(DesktopName) || BuiltinMemoryMB(DesktopName) != DesktopMemoryMB || BuiltinMemoryMB(BaseName) != 0 {
		t.Fatal("desktop builtin")
	}
	for _, bad := range []RecipeFile{{Path: "opt/x", Link: "/y"}, {Path: "/opt/../etc/x", Content: "x"}, {Path: "/"}, {Path: "/x", Link: "/y", Content: "z"}, {Path: "/x", CopyOf: "rel"}} {
		r := BaseRecipe
		r.Files = []RecipeFile{bad}
		if err := r.Validate(); err == nil {
			t.Errorf("recipe file %+v accepted", bad)
		}
	}
}

// Recipe files are made inside the image: a link, a copy of the image's
// own file, content with its mode; a path through the image's symlink to
// outside it is refused and writes nothing there.
func TestAddRecipeFiles(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc/xdg/panel"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/xdg/panel/default.xml"), []byte("<panel/>"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	err := addRecipeFiles(root, []RecipeFile{
		{Path: "/opt/noVNC", Link: "/usr/share/novnc"},
		{Path: "/etc/xdg/conf/panel.xml", CopyOf: "/etc/xdg/panel/default.xml"},
		{Path: "/usr/local/bin/tool", Content: "#!/bin/sh\n", Mode: 0o755},
	})
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := os.Readlink(filepath.Join(root, "opt/noVNC")); l != "/usr/share/novnc" {
		t.Errorf("link = %q", l)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/xdg/conf/panel.xml")); string(b) != "<panel/>" {
		t.Errorf("copy = %q", b)
	}
	if st, err := os.Stat(filepath.Join(root, "usr/local/bin/tool")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("content file: %v %v", st, err)
	}
	for _, f := range []RecipeFile{{Path: "/escape/planted", Content: "x"}, {Path: "/etc/x", CopyOf: "/escape/../../etc/passwd"}} {
		if err := addRecipeFiles(root, []RecipeFile{f}); err == nil {
			t.Errorf("%+v: written through the image's symlink", f)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written outside the image: %v", ents)
	}
}
