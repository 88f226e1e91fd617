package agentpin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/rootfs"
)

// open makes a store on a temp data dir whose tmpfs goes with the test.
func open(t *testing.T, dataDir string) *Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs")
	}
	s, err := Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		if m, _ := rootfs.FindMounts(dataDir); len(m) > 0 {
			t.Errorf("mounts left under the data dir: %v", m)
		}
	})
	return s
}

func hashOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestStore(t *testing.T) {
	dataDir := t.TempDir()
	s := open(t, dataDir)
	a, b := []byte("agent A\n"), []byte("agent B\n")
	ha, err := s.Add(a)
	if err != nil || ha != hashOf(a) {
		t.Fatalf("Add(A) = %q, %v; want %s", ha, err, hashOf(a))
	}
	if again, err := s.Add(a); err != nil || again != ha {
		t.Fatalf("Add(A) again = %q, %v", again, err)
	}
	hb, err := s.Add(b)
	if err != nil {
		t.Fatal(err)
	}

	p, err := s.Path(ha)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(p) != filepath.Join(dataDir, memDirName) {
		t.Fatalf("Path = %s, want a file of the tmpfs", p)
	}
	if m, _ := rootfs.FindMounts(filepath.Join(dataDir, memDirName)); len(m) != 1 {
		t.Fatalf("the agent dir is not a mount of its own: %v", m)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, a) {
		t.Fatalf("the tmpfs copy holds %q", got)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o555 {
		t.Fatalf("mode %v, %v; want 0555", st.Mode(), err)
	}

	// Not even root writes, renames or removes the file sandboxes share.
	if f, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
		f.Close()
		t.Fatal("root opened the shared agent binary for writing")
	} else if !errors.Is(err, unix.EPERM) {
		t.Fatalf("open for writing: %v, want EPERM (immutable)", err)
	}
	if err := os.Rename(p, p+".x"); err == nil {
		t.Fatal("root renamed the shared agent binary")
	}
	if err := os.Remove(p); err == nil {
		t.Fatal("root removed the shared agent binary")
	}

	// A copy a daemon died before making immutable is made so.
	if err := setImmutable(p, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Path(ha); err != nil {
		t.Fatal(err)
	}
	if f, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
		f.Close()
		t.Fatal("Path returned a copy that is not immutable")
	}

	// A new tmpfs (the next daemon's) is filled from the disk copies.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dataDir)
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a new tmpfs holds %s already: %v", p, err)
	}
	if p2, err := s.Path(ha); err != nil || p2 != p {
		t.Fatalf("Path after a restart = %q, %v", p2, err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, a) {
		t.Fatalf("the tmpfs copy holds %q", got)
	}

	// A disk copy that no longer matches its name is refused.
	diskB := filepath.Join(dataDir, diskDirName, hb)
	if err := os.Chmod(diskB, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(diskB, []byte("not agent B"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Path(hb); err == nil || !strings.Contains(err.Error(), "altered") {
		t.Fatalf("Path of an altered copy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, memDirName, hb)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an altered copy reached the tmpfs: %v", err)
	}
	if _, err := s.Path("../../etc/passwd"); err == nil {
		t.Fatal("Path took a name that is no sha256")
	}

	// Prune keeps what it is told to, both copies.
	removed, err := s.Prune(map[string]bool{ha: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{hb}) {
		t.Fatalf("Prune removed %v, want [%s]", removed, hb)
	}
	if got, _ := s.Hashes(); !slices.Equal(got, []string{ha}) {
		t.Fatalf("stored after Prune: %v", got)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("Prune removed a kept binary: %v", err)
	}
	if _, err := s.Prune(map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{memDirName, diskDirName} {
		if e, _ := os.ReadDir(filepath.Join(dataDir, d)); len(e) != 0 {
			t.Fatalf("%s after pruning everything: %v", d, e)
		}
	}
}
