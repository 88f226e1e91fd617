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
