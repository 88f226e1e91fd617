package template

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
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
