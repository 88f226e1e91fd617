package volume

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cella-sandbox/cella/internal/errdefs"
)

// TestContentConfined plants what a sandbox can plant in a volume (symlinks
// out of it, absolute and relative, a symlink loop, a FIFO) and drives
// every file operation through them: none reads, writes, chmods, chowns or
// removes a host file outside the volume, none blocks on the FIFO, and
// ".." in an API path stays inside.
func TestContentConfined(t *testing.T) {
	host := t.TempDir()
	outside := filepath.Join(host, "outside")
	data := filepath.Join(host, "vol", "data")
	for _, d := range []string{outside, data} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	secret := filepath.Join(outside, "secret")
	const secretText = "host secret\n"
	if err := os.WriteFile(secret, []byte(secretText), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "real.txt"), []byte("inside\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"abs":    secret,           // absolute, out
		"absdir": outside,          // absolute directory, out
		"up":     "../../outside",  // relative, out
		"dotdot": "..",             // the volume's parent
		"loop":   "loop",           // itself
		"ok":     "real.txt",       // inside: followed for reads
		"okdir":  ".",              // inside
		"dang":   "/nonexistent/x", // dangling absolute: a write must not create it
	} {
		if err := os.Symlink(target, filepath.Join(data, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(data, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(data)
	if err != nil {
		t.Fatal(err)
	}
	c := &Content{root: root, name: "v", size: 1 << 30}
	defer c.Close()

	hostUnchanged := func(t *testing.T) {
		t.Helper()
		b, err := os.ReadFile(secret)
		if err != nil || string(b) != secretText {
			t.Fatalf("the host file changed: %q %v", b, err)
		}
		fi, err := os.Stat(secret)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the host file's mode changed: %v %v", fi.Mode(), err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 0 || st.Gid != 0 {
			t.Fatalf("the host file's owner changed: %d:%d", st.Uid, st.Gid)
		}
		ents, _ := os.ReadDir(outside)
		if len(ents) != 1 {
			t.Fatalf("something was created outside the volume: %v", ents)
		}
		if _, err := os.Lstat("/nonexistent"); err == nil {
			t.Fatal("/nonexistent was created")
		}
	}
	refused := func(t *testing.T, what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s succeeded", what)
		}
		if k := errdefs.KindOf(err); k == errdefs.KindInternal {
			t.Fatalf("%s: want a client error, got %v", what, err)
		}
		hostUnchanged(t)
	}
	mode := uint32(0o777)
	uid := uint32(1234)
	body := func() io.Reader { return strings.NewReader("pwned\n") }

	for _, p := range []string{"abs", "up/secret", "absdir/secret", "dotdot/data/real.txt", "loop", "dang"} {
		f, _, err := c.Open(p)
		if err == nil {
			b, _ := io.ReadAll(f)
			f.Close()
			t.Fatalf("read %s: got %q", p, b)
		}
		refused(t, "read "+p, err)
	}
	for _, p := range []string{"abs", "up/secret", "up/new", "absdir/new", "dotdot/x", "dang"} {
		for _, force := range []bool{false, true} {
			_, err := c.WriteFile(p, body(), Attrs{}, force)
			refused(t, "write "+p, err)
		}
	}
	for _, p := range []string{"up/newdir", "absdir/newdir", "absdir/a/b", "dotdot/x"} {
		_, err := c.MakeDir(p, Attrs{}, true)
		refused(t, "mkdir "+p, err)
	}
	for _, p := range []string{"up/secret", "absdir/secret", "dotdot/data/real.txt"} {
		_, err := c.SetAttrs(p, Attrs{Mode: &mode, UID: &uid})
		refused(t, "update "+p, err)
		refused(t, "remove "+p, c.Remove(p))
		_, err = c.Stat(p)
		refused(t, "stat "+p, err)
	}
	for _, p := range []string{"up", "absdir", "dotdot"} {
		_, err := c.List(p, 2)
		refused(t, "list "+p, err)
	}
	// The symlinks themselves can be described, updated and removed
	// without reaching their targets.
	e, err := c.Stat("abs")
	if err != nil || e.Type != "symlink" || e.Target != secret {
		t.Fatalf("stat abs: %+v %v", e, err)
	}
	if _, err := c.SetAttrs("abs", Attrs{Mode: &mode, UID: &uid}); err != nil {
		t.Fatalf("update the symlink abs: %v", err)
	}
	hostUnchanged(t)
	es, err := c.List("/", 3)
	if err != nil {
		t.Fatalf("list /: %v", err)
	}
	for _, e := range es {
		if strings.Contains(e.Path, "outside") || strings.Contains(e.Path, "secret") {
			t.Fatalf("list / went through a symlink: %+v", e)
		}
	}
	if err := c.Remove("abs"); err != nil {
		t.Fatalf("remove the symlink abs: %v", err)
	}
	if err := c.Remove("absdir"); err != nil {
		t.Fatalf("remove the symlink absdir: %v", err)
	}
	hostUnchanged(t)

	// A FIFO is refused at once, for reading and writing.
	_, _, err = c.Open("pipe")
	if !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("read a FIFO: %v", err)
	}
	if _, err := c.WriteFile("pipe", body(), Attrs{}, true); err == nil {
		t.Fatal("write a FIFO succeeded")
	}

	// ".." in the API path stays inside, and symlinks inside are followed.
	f, _, err := c.Open("../../outside/secret")
	if err == nil {
		f.Close()
		t.Fatal("read ../../outside/secret succeeded")
	}
	for _, p := range []string{"ok", "okdir/real.txt", "/../real.txt"} {
		f, _, err := c.Open(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		b, _ := io.ReadAll(f)
		f.Close()
		if !bytes.Equal(b, []byte("inside\n")) {
			t.Fatalf("read %s: %q", p, b)
		}
	}

	// set-ID modes are refused.
	suid := uint32(0o4755)
	if _, err := c.WriteFile("x", body(), Attrs{Mode: &suid}, true); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("setuid mode: %v", err)
	}
}

// TestContentListBounded: a directory with more entries than an answer may
// hold is refused with the limit named, without reading it all.
func TestContentListBounded(t *testing.T) {
	data := t.TempDir()
	for i := range MaxListEntries + 1 {
		f, err := os.Create(filepath.Join(data, fmt.Sprintf("f%05d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	root, err := os.OpenRoot(data)
	if err != nil {
		t.Fatal(err)
	}
	c := &Content{root: root, name: "v"}
	defer c.Close()
	if _, err := c.List("/", 1); !errdefs.Is(err, errdefs.KindResourceExhausted) || !strings.Contains(err.Error(), "10000") {
		t.Fatalf("list of %d entries: %v", MaxListEntries+1, err)
	}
	if err := os.Remove(filepath.Join(data, "f00000")); err != nil {
		t.Fatal(err)
	}
	es, err := c.List("/", 1)
	if err != nil || len(es) != MaxListEntries || es[0].Name != "f00001" {
		t.Fatalf("list of %d entries: %d %v", MaxListEntries, len(es), err)
	}
}
