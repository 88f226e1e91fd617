package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// A template's symlinks never make the daemon write or read outside the
// sandbox root: a link at the file is replaced, a directory link that
// leaves the root is refused.
func TestGuestFilesStayInRoot(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	// /etc/resolv.conf -> the host file: replaced, the host file untouched.
	if err := os.Symlink(victim, filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	if b, err := readGuestFile(root, "/etc/resolv.conf"); err == nil {
		t.Fatalf("read through a symlink: %q", b)
	}
	if err := writeGuestFile(root, "/etc/resolv.conf", []byte("nameserver 10.200.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host" {
		t.Fatalf("the host file was written: %q", b)
	}
	if st, err := os.Lstat(filepath.Join(root, "etc/resolv.conf")); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("resolv.conf is not a regular file in the root: %v %v", st, err)
	}
	if b, err := readGuestFile(root, "/etc/resolv.conf"); err != nil || string(b) != "nameserver 10.200.0.1\n" {
		t.Fatalf("read back: %q %v", b, err)
	}
	// /etc/cella -> the host directory: refused, nothing written there.
	if err := os.Symlink(outside, filepath.Join(root, "etc/cella")); err != nil {
		t.Fatal(err)
	}
	if err := writeGuestFile(root, "/etc/cella/egress-ca.pem", []byte("ca"), 0o644); err == nil {
		t.Fatal("wrote through a directory symlink that leaves the root")
	}
	if _, err := os.Stat(filepath.Join(outside, "egress-ca.pem")); err == nil {
		t.Fatal("a file appeared outside the root")
	}
}
