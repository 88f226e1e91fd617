package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// guestHostname is the hostname of every sandbox (runtime.Spec.Hostname).
const guestHostname = "cella"

// guestHosts is the /etc/hosts a sandbox gets when its template has none:
// debootstrap's minbase and many images write none, and without it
// `localhost` does not resolve (nor does the hostname), where an E2B
// sandbox resolves both.
var guestHosts = []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + guestHostname + "\n")

// prepareGuestHosts writes guestHosts into the sandbox's own layer when
// its template has no /etc/hosts (a template's own, even a symlink, is
// kept). Done at start, so templates and their cache keys are untouched;
// CaptureLayer leaves it out of a build's layer (ownFiles).
func prepareGuestHosts(root string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("open root %s: %w", root, err)
	}
	_, err = r.Lstat("etc/hosts")
	r.Close()
	if err == nil {
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("/etc/hosts: %w", err)
	}
	return writeGuestFile(root, "/etc/hosts", guestHosts, 0o644)
}

// ownHosts reports whether the /etc/hosts in upper is the one
// prepareGuestHosts wrote, not one the sandbox wrote.
func ownHosts(upper string) bool {
	b, err := os.ReadFile(filepath.Join(upper, "etc/hosts"))
	return err == nil && bytes.Equal(b, guestHosts)
}
