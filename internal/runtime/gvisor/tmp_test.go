package gvisor

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTmpOnDisk: the root's /tmp is bound only when it is a real directory
// of the root (made, sticky, if missing); a link an image or an earlier
// boot left there is never handed to runsc, which would follow it on the
// host.
func TestTmpOnDisk(t *testing.T) {
	missing := t.TempDir()
	m, ok := tmpOnDisk(missing)
	if !ok || m.Source != filepath.Join(missing, "tmp") || m.Destination != "/tmp" {
		t.Fatalf("missing /tmp: %+v %v", m, ok)
	}
	if st, err := os.Stat(m.Source); err != nil || st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Fatalf("made /tmp: %v %v", st.Mode(), err)
	}
	for _, target := range []string{"/", "/etc", "../../"} {
		root := t.TempDir()
		if err := os.Symlink(target, filepath.Join(root, "tmp")); err != nil {
			t.Fatal(err)
		}
		if m, ok := tmpOnDisk(root); ok {
			t.Fatalf("/tmp -> %s was bound: %+v", target, m)
		}
	}
	file := t.TempDir()
	if err := os.WriteFile(filepath.Join(file, "tmp"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if m, ok := tmpOnDisk(file); ok {
		t.Fatalf("a file at /tmp was bound: %+v", m)
	}
}
