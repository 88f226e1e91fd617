package layerstore

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/rootfs/layertar"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (owners, device nodes, trusted xattrs)")
	}
}

// entry is one tar entry of a test layer.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	uid, gid   int
	body       string
	size       int64 // for bombs: a body of zeros this long
	pax        map[string]string
}

func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		size := int64(len(e.body))
		if e.size > 0 {
			size = e.size
		}
		if typ != tar.TypeReg {
			size = 0
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode, Uid: e.uid, Gid: e.gid,
			Size: size, ModTime: mtime, PAXRecords: e.pax, Format: tar.FormatPAX}
		if typ == tar.TypeChar {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.size > 0 {
			if _, err := io.CopyN(tw, zeros{}, e.size); err != nil {
				t.Fatal(err)
			}
		} else if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func gz(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func zst(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// fixture is a store inside a directory that also holds "outside", a
// directory attacks aim at: nothing may ever appear there.
type fixture struct {
	s       *Store
	outside string
	passwd  []byte
}

func newFixture(t *testing.T, max int64) *fixture {
	t.Helper()
	needRoot(t)
	base := t.TempDir()
	s, err := Open(filepath.Join(base, "layers"), max)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(base, "outside")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	pw, _ := os.ReadFile("/etc/passwd")
	f := &fixture{s: s, outside: out, passwd: pw}
	t.Cleanup(func() { f.checkClean(t) })
	return f
}

// checkClean: nothing outside the store was written, no temp dir is left.
func (f *fixture) checkClean(t *testing.T) {
	t.Helper()
	if ents, _ := os.ReadDir(f.outside); len(ents) != 0 {
		t.Errorf("something was written outside the store: %v", ents)
	}
	if pw, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(pw, f.passwd) {
		t.Errorf("/etc/passwd changed")
	}
	ents, _ := os.ReadDir(f.s.tmpDir())
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("temp dir left behind: %s", e.Name())
		}
	}
}

func (f *fixture) unpack(t *testing.T, blob []byte, diffID string) (Info, bool, error) {
	t.Helper()
	return f.s.Unpack(context.Background(), diffID, Blob{R: bytes.NewReader(blob), Digest: digest(blob), Size: int64(len(blob))}, nil)
}

func TestUnpackLayer(t *testing.T) {
	f := newFixture(t, 0)
	layer := tarOf(t,
		entry{name: "./", typ: tar.TypeDir, mode: 0o755},
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/hostname", body: "img\n", pax: map[string]string{
			"SCHILY.xattr.user.note":                "kept",
			"SCHILY.xattr.trusted.overlay.redirect": "/elsewhere", // overlay's namespace: dropped
		}},
		entry{name: "usr/bin/sudo", body: "#!/bin/sh\n", mode: 0o4755}, // parent dirs implicit
		entry{name: "usr/bin/sh", typ: tar.TypeSymlink, link: "/bin/dash"},
		entry{name: "usr/bin/sh2", typ: tar.TypeLink, link: "usr/bin/sudo"},
		entry{name: "home/u/", typ: tar.TypeDir, uid: 1000, gid: 1000, mode: 0o750},
		entry{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		entry{name: "var/.wh.gone"},                // whiteout of a lower file
		entry{name: "opt/.wh..wh..opq"},            // opaque dir
		entry{name: "opt/new", body: "x"},          // stays: only lower layers are hidden
		entry{name: "srv/.wh.keep"},                // whiteout of ...
		entry{name: "srv/keep", body: "mine"},      // ... a file this layer then adds: the file wins
		entry{name: "lib/kept", body: "mine"},      //
		entry{name: "lib/.wh.kept"},                // whiteout after the file: the file stays
		entry{name: "data/.wh.d"},                  // whiteout then a new dir: the dir is opaque
		entry{name: "data/d/", typ: tar.TypeDir},   //
		entry{name: "data/.wh..wh.plnk"},           // aufs metadata: ignored
		entry{name: "etc/hostname", body: "two\n"}, // a later entry replaces an earlier one
	)
	diffID := digest(layer)
	in, cached, err := f.unpack(t, gz(t, layer), diffID)
	if err != nil || cached {
		t.Fatalf("unpack: %v cached=%v", err, cached)
	}
	if in.Entries != 20 || in.SkippedDevices != 1 || in.Size != int64(len(layer)) {
		t.Fatalf("info %+v", in)
	}
	dir, _ := f.s.Path(diffID)
	read := func(p string) string { b, _ := os.ReadFile(filepath.Join(dir, p)); return string(b) }
	if read("etc/hostname") != "two\n" {
		t.Fatalf("hostname %q", read("etc/hostname"))
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "usr/bin/sudo"), &st); err != nil || st.Mode&0o7777 != 0o4755 {
		t.Fatalf("setuid file mode %o, %v", st.Mode&0o7777, err)
	}
	ino := st.Ino
	if unix.Lstat(filepath.Join(dir, "usr/bin/sh2"), &st); st.Ino != ino {
		t.Fatal("hard link not a link")
	}
	if l, _ := os.Readlink(filepath.Join(dir, "usr/bin/sh")); l != "/bin/dash" {
		t.Fatalf("symlink -> %q", l)
	}
	if unix.Lstat(filepath.Join(dir, "home/u"), &st); st.Uid != 1000 || st.Mode&0o7777 != 0o750 {
		t.Fatalf("home/u %d %o", st.Uid, st.Mode&0o7777)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "run/fifo")); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		t.Fatalf("fifo %v %v", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "dev/null")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("device node created: %v", err)
	}
	isWO := func(p string) bool { fi, err := os.Lstat(filepath.Join(dir, p)); return err == nil && isWhiteout(fi) }
	opaque := func(p string) bool {
		b := make([]byte, 8)
		n, err := unix.Lgetxattr(filepath.Join(dir, p), overlayOpaque, b)
		return err == nil && string(b[:n]) == "y"
	}
	if !isWO("var/gone") || isWO("srv/keep") || read("srv/keep") != "mine" || read("lib/kept") != "mine" {
		t.Fatal("whiteouts not applied as the spec says")
	}
	if !opaque("opt") || read("opt/new") != "x" || !opaque("data/d") || opaque("etc") {
		t.Fatal("opaque dirs wrong")
	}
	if _, err := os.Lstat(filepath.Join(dir, "data/.wh..wh.plnk")); err == nil {
		t.Fatal("aufs metadata unpacked")
	}
	b := make([]byte, 64)
	if n, err := unix.Lgetxattr(filepath.Join(dir, "etc/hostname"), "user.note", b); err == nil {
		t.Fatalf("xattr of the replaced file survived: %q", b[:n])
	}
	if _, err := unix.Lgetxattr(filepath.Join(dir, "etc/hostname"), "trusted.overlay.redirect", b); err == nil {
		t.Fatal("trusted xattr from the tar was set")
	}
	if fi, _ := os.Stat(f.s.Dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("store mode %v: host users could reach setuid files", fi.Mode())
	}

	// The same layer, compressed otherwise, is the same entry: cached.
	for _, blob := range [][]byte{layer, zst(t, layer)} {
		if _, cached, err := f.unpack(t, blob, diffID); err != nil || !cached {
			t.Fatalf("second unpack: %v cached=%v", err, cached)
		}
	}
	ids, _ := f.s.List()
	if len(ids) != 1 || ids[0] != diffID {
		t.Fatalf("list %v", ids)
	}
}

func TestUnpackXattrsKept(t *testing.T) {
	f := newFixture(t, 0)
	layer := tarOf(t, entry{name: "f", body: "x", pax: map[string]string{"SCHILY.xattr.user.note": "kept"}})
	if _, _, err := f.unpack(t, layer, digest(layer)); err != nil {
		t.Fatal(err)
	}
	dir, _ := f.s.Path(digest(layer))
	b := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(dir, "f"), "user.note", b); err != nil || string(b[:n]) != "kept" {
		t.Fatalf("user xattr: %q %v", b[:n], err)
	}
}

func TestUnpackCompressions(t *testing.T) {
	f := newFixture(t, 0)
	for name, enc := range map[string]func(testing.TB, []byte) []byte{
		"gzip": gz, "zstd": zst, "none": func(_ testing.TB, b []byte) []byte { return b },
	} {
		layer := tarOf(t, entry{name: "which", body: name})
		if _, _, err := f.unpack(t, enc(t, layer), digest(layer)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		dir, _ := f.s.Path(digest(layer))
		if b, _ := os.ReadFile(filepath.Join(dir, "which")); string(b) != name {
			t.Fatalf("%s: read %q", name, b)
		}
	}
}

// Each crafted layer is refused with a clear error, nothing is written
// outside the store and the store holds no entry for it.
func TestUnpackAttacks(t *testing.T) {
	f := newFixture(t, 1<<20)
	shadow := "/etc/shadow"
	cases := []struct {
		name    string
		entries []entry
		want    error
		words   string
	}{
		{"dotdot", []entry{{name: "../x", body: "escaped"}}, ErrUnsafe, "'..' in name"},
		{"dotdot-deep", []entry{{name: "a/../../outside/x", body: "escaped"}}, ErrUnsafe, "'..' in name"},
		{"absolute", []entry{{name: "/etc/passwd", body: "root::0:0::/:/bin/sh\n"}}, ErrUnsafe, "absolute name"},
		{"symlink-escape-abs", []entry{
			{name: "a", typ: tar.TypeSymlink, link: f.outside},
			{name: "a/passwd", body: "escaped"},
		}, ErrUnsafe, "leads out of the layer"},
		{"symlink-etc", []entry{
			{name: "a", typ: tar.TypeSymlink, link: "/etc"},
			{name: "a/passwd", body: "root::0:0::/:/bin/sh\n"},
		}, ErrUnsafe, "leads out of the layer"},
		{"symlink-escape-rel", []entry{
			{name: "d/", typ: tar.TypeDir},
			{name: "d/up", typ: tar.TypeSymlink, link: "../../../../../../../../" + strings.TrimPrefix(f.outside, "/")},
			{name: "d/up/x", body: "escaped"},
		}, ErrUnsafe, "leads out of the layer"},
		{"symlink-dir-escape", []entry{
			{name: "a", typ: tar.TypeSymlink, link: f.outside},
			{name: "a/sub/", typ: tar.TypeDir},
		}, ErrUnsafe, "leads out of the layer"},
		{"symlink-whiteout-escape", []entry{
			{name: "a", typ: tar.TypeSymlink, link: f.outside},
			{name: "a/.wh.x"},
		}, ErrUnsafe, "leads out of the layer"},
		{"hardlink-abs", []entry{{name: "s", typ: tar.TypeLink, link: shadow}}, ErrUnsafe, "absolute name"},
		{"hardlink-dotdot", []entry{{name: "s", typ: tar.TypeLink, link: "../../../../../../etc/shadow"}}, ErrUnsafe, "'..' in name"},
		{"hardlink-through-symlink", []entry{
			{name: "e", typ: tar.TypeSymlink, link: "/etc"},
			{name: "s", typ: tar.TypeLink, link: "e/shadow"},
		}, ErrUnsafe, "not in this layer"},
		{"hardlink-missing", []entry{{name: "s", typ: tar.TypeLink, link: "nope"}}, ErrUnsafe, "not in this layer"},
		{"bomb", []entry{{name: "zeros", size: 64 << 20}}, ErrTooLarge, "--max-layer-size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			layer := tarOf(t, c.entries...)
			blob := gz(t, layer)
			_, _, err := f.unpack(t, blob, digest(layer))
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.words) {
				t.Fatalf("err = %v, want %v mentioning %q", err, c.want, c.words)
			}
			t.Log(err)
			if f.s.Has(digest(layer)) {
				t.Fatal("a refused layer is in the store")
			}
			f.checkClean(t)
		})
	}
	if ids, _ := f.s.List(); len(ids) != 0 {
		t.Fatalf("store holds %v", ids)
	}
}

// A symlink into the host is unpacked as a symlink (images are full of
// absolute symlinks; they resolve inside the sandbox), and a hard link to
// such a symlink links the symlink, not the host file.
func TestUnpackHostSymlinkStaysASymlink(t *testing.T) {
	f := newFixture(t, 0)
	layer := tarOf(t,
		entry{name: "s", typ: tar.TypeSymlink, link: "/etc/shadow"},
		entry{name: "h", typ: tar.TypeLink, link: "s"},
	)
	if _, _, err := f.unpack(t, layer, digest(layer)); err != nil {
		t.Fatal(err)
	}
	dir, _ := f.s.Path(digest(layer))
	var host, got unix.Stat_t
	if err := unix.Stat("/etc/shadow", &host); err != nil {
		t.Skip("no /etc/shadow")
	}
	if err := unix.Lstat(filepath.Join(dir, "h"), &got); err != nil {
		t.Fatal(err)
	}
	if got.Mode&unix.S_IFMT != unix.S_IFLNK || got.Ino == host.Ino {
		t.Fatalf("h is mode %o ino %d (host shadow ino %d)", got.Mode, got.Ino, host.Ino)
	}
}

// An entry that lands where the layer put a symlink replaces the symlink;
// it never writes through it.
func TestUnpackReplacesSymlinks(t *testing.T) {
	f := newFixture(t, 0)
	victim := filepath.Join(f.outside, "victim")
	layer := tarOf(t,
		entry{name: "a", typ: tar.TypeSymlink, link: victim},
		entry{name: "a", body: "mine"},
		entry{name: "d", typ: tar.TypeSymlink, link: f.outside},
		entry{name: "d/", typ: tar.TypeDir},
		entry{name: "d/x", body: "inside"},
	)
	if _, _, err := f.unpack(t, layer, digest(layer)); err != nil {
		t.Fatal(err)
	}
	dir, _ := f.s.Path(digest(layer))
	if b, err := os.ReadFile(filepath.Join(dir, "a")); err != nil || string(b) != "mine" {
		t.Fatalf("a: %q %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "d")); err != nil || !fi.IsDir() {
		t.Fatalf("d: %v %v", fi, err)
	}
}

func TestUnpackBadBlobs(t *testing.T) {
	f := newFixture(t, 1<<20)
	layer := tarOf(t, entry{name: "a", body: strings.Repeat("data ", 1000)}, entry{name: "b", body: "x"})
	blob := gz(t, layer)
	diffID := digest(layer)
	try := func(name string, b Blob, words string) {
		t.Helper()
		_, _, err := f.s.Unpack(context.Background(), diffID, b, nil)
		if err == nil || !strings.Contains(err.Error(), words) {
			t.Fatalf("%s: err = %v, want one mentioning %q", name, err, words)
		}
		t.Logf("%s: %v", name, err)
		if f.s.Has(diffID) {
			t.Fatalf("%s: layer is in the store", name)
		}
		f.checkClean(t)
	}
	other := gz(t, tarOf(t, entry{name: "c", body: "other"}))
	try("wrong digest", Blob{R: bytes.NewReader(blob), Digest: digest(other), Size: int64(len(blob))}, "corrupt or tampered blob")
	try("wrong diffID", Blob{R: bytes.NewReader(other), Digest: digest(other), Size: int64(len(other))}, "not the diffID")
	half := blob[:len(blob)/2]
	try("truncated", Blob{R: bytes.NewReader(half), Digest: digest(blob), Size: int64(len(blob))}, "truncated")
	try("truncated, size unknown", Blob{R: bytes.NewReader(half), Size: -1}, "truncated")
	try("declared too big", Blob{R: bytes.NewReader(blob), Size: 2 << 20}, "--max-layer-size")
	try("garbage", Blob{R: strings.NewReader("this is not a layer at all, not even close"), Size: -1}, "read tar")
	if _, _, err := f.s.Unpack(context.Background(), "md5:x", Blob{R: bytes.NewReader(blob)}, nil); err == nil || !strings.Contains(err.Error(), "invalid layer diffID") {
		t.Fatalf("bad diffID: %v", err)
	}
}

func TestUnpackConcurrentAndSweep(t *testing.T) {
	f := newFixture(t, 0)
	layer := tarOf(t, entry{name: "f", body: strings.Repeat("x", 1<<16)})
	blob := gz(t, layer)
	var wg sync.WaitGroup
	var mu sync.Mutex
	fresh := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, cached, err := f.unpack(t, blob, digest(layer))
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			if !cached {
				fresh++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if fresh != 1 {
		t.Fatalf("%d unpacks of one layer, want 1", fresh)
	}
	other := tarOf(t, entry{name: "g", body: "y"})
	if _, _, err := f.unpack(t, other, digest(other)); err != nil {
		t.Fatal(err)
	}
	// A crashed unpack's temp dir.
	if err := os.MkdirAll(filepath.Join(f.s.tmpDir(), "deadbeef-123", "fs"), 0o700); err != nil {
		t.Fatal(err)
	}
	removed, err := f.s.Sweep(func(id string) bool { return id == digest(layer) })
	if err != nil || len(removed) != 1 || removed[0] != digest(other) {
		t.Fatalf("sweep removed %v, %v", removed, err)
	}
	if !f.s.Has(digest(layer)) || f.s.Has(digest(other)) {
		t.Fatal("sweep kept the wrong layers")
	}
}

// A layer exported again (cella template push) unpacks to the same tree:
// whiteouts, opaque dirs, hard links, modes and kept xattrs survive.
func TestWriteTarRoundTrip(t *testing.T) {
	f := newFixture(t, 0)
	layer := tarOf(t,
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/a", body: "a", mode: 0o4755, pax: map[string]string{"SCHILY.xattr.user.k": "v"}},
		entry{name: "etc/b", typ: tar.TypeLink, link: "etc/a"},
		entry{name: "etc/s", typ: tar.TypeSymlink, link: "/etc/a"},
		entry{name: "gone/.wh.x"},
		entry{name: "op/.wh..wh..opq"},
		entry{name: "op/y", body: "y", uid: 1000, gid: 1000},
	)
	if _, _, err := f.unpack(t, layer, digest(layer)); err != nil {
		t.Fatal(err)
	}
	dir, _ := f.s.Path(digest(layer))
	var out bytes.Buffer
	if err := WriteTar(&out, dir); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := WriteTar(&again, dir); err != nil || !bytes.Equal(out.Bytes(), again.Bytes()) {
		t.Fatalf("export is not stable: %v", err)
	}
	exported := out.Bytes()
	if _, _, err := f.unpack(t, exported, digest(exported)); err != nil {
		t.Fatal(err)
	}
	dir2, _ := f.s.Path(digest(exported))
	var st1, st2 unix.Stat_t
	for _, p := range []string{"etc/a", "etc/s", "gone/x", "op", "op/y"} {
		if err := unix.Lstat(filepath.Join(dir, p), &st1); err != nil {
			t.Fatal(err)
		}
		if err := unix.Lstat(filepath.Join(dir2, p), &st2); err != nil {
			t.Fatalf("%s lost: %v", p, err)
		}
		if st1.Mode != st2.Mode || st1.Uid != st2.Uid || st1.Rdev != st2.Rdev {
			t.Fatalf("%s: mode %o/%o uid %d/%d", p, st1.Mode, st2.Mode, st1.Uid, st2.Uid)
		}
	}
	unix.Lstat(filepath.Join(dir2, "etc/a"), &st1)
	unix.Lstat(filepath.Join(dir2, "etc/b"), &st2)
	if st1.Ino != st2.Ino {
		t.Fatal("hard link lost")
	}
	if !layertar.IsOpaque(filepath.Join(dir2, "op")) {
		t.Fatal("opaque dir lost")
	}
	b := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(dir2, "etc/a"), "user.k", b); err != nil || string(b[:n]) != "v" {
		t.Fatal("xattr lost")
	}
}
