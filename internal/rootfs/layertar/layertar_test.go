package layertar

import (
	"archive/tar"
	"bytes"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tree makes an overlay upper with what an archive must keep: owners, a
// setuid file and a sticky dir, a hard link, symlinks, a whiteout device,
// a fifo, a socket (left out), an opaque dir, xattrs and an old mtime.
func tree(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (owners, devices, trusted xattrs)")
	}
	d := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := func(rel string) string { return filepath.Join(d, rel) }
	must(os.MkdirAll(p("etc/sticky"), 0o755))
	must(os.Chmod(p("etc/sticky"), 0o1777))
	must(os.WriteFile(p("etc/suid"), []byte("hello"), 0o644))
	must(os.Chmod(p("etc/suid"), 0o4755))
	must(os.Link(p("etc/suid"), p("etc/hard")))
	must(os.Symlink("/etc/suid", p("etc/abs")))
	must(os.MkdirAll(p("home/user"), 0o755))
	must(os.WriteFile(p("home/user/f"), bytes.Repeat([]byte("x"), 5000), 0o600))
	must(os.Lchown(p("home/user"), 1000, 1000))
	must(os.Lchown(p("home/user/f"), 1000, 1001))
	must(unix.Mknod(p("gone"), unix.S_IFCHR|0o600, 0))
	must(unix.Mkfifo(p("fifo"), 0o644))
	must(unix.Mknod(p("sock"), unix.S_IFSOCK|0o600, 0))
	must(os.MkdirAll(p("opq/in"), 0o755))
	must(unix.Lsetxattr(p("opq"), OverlayOpaque, []byte("y"), 0))
	must(unix.Lsetxattr(p("etc/suid"), "user.k", []byte("v"), 0))
	must(unix.Lsetxattr(p("etc/suid"), "trusted.other", []byte("t"), 0))
	old := time.Unix(1_600_000_000, 123_456_789)
	must(os.Chtimes(p("etc/suid"), old, old))
	must(os.Chtimes(p("etc"), old, old))
	return d
}

type node struct {
	mode, uid, gid uint32
	rdev, size     uint64
	ino            uint64
	mtime          int64
	link           string
	xattrs         map[string]string
}

func lstat(t *testing.T, p string) node {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	n := node{mode: st.Mode, uid: st.Uid, gid: st.Gid, rdev: st.Rdev, ino: st.Ino, mtime: st.Mtim.Nano()}
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		n.size = uint64(st.Size)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		n.link, _ = os.Readlink(p)
	}
	n.xattrs, _ = xattrs(p, nil)
	return n
}

// An upper written in overlay form and extracted into another dir comes
// back the same: every owner, mode, device, link, xattr and mtime.
func TestOverlayRoundTrip(t *testing.T) {
	src := tree(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := Write(tw, src, Options{Prefix: "upper"}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	tw = tar.NewWriter(&again)
	if err := Write(tw, src, Options{Prefix: "upper"}); err != nil || tw.Close() != nil || !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatalf("the same tree gave other bytes (%v)", err)
	}
	dst := t.TempDir()
	if err := Extract(tar.NewReader(bytes.NewReader(buf.Bytes())), map[string]string{"upper": dst}); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"etc", "etc/sticky", "etc/suid", "etc/hard", "etc/abs", "home/user", "home/user/f", "gone", "fifo", "opq", "opq/in"} {
		want, got := lstat(t, filepath.Join(src, rel)), lstat(t, filepath.Join(dst, rel))
		want.ino, got.ino = 0, 0
		if want.mode&unix.S_IFMT == unix.S_IFLNK {
			want.mtime, got.mtime = 0, 0 // symlink times are not restored
		}
		if want.link != got.link || want.mode != got.mode || want.uid != got.uid || want.gid != got.gid || want.rdev != got.rdev ||
			want.size != got.size || want.mtime != got.mtime || !maps.Equal(want.xattrs, got.xattrs) {
			t.Errorf("%s: extracted %+v, want %+v", rel, got, want)
		}
	}
	if a, b := lstat(t, filepath.Join(dst, "etc/suid")), lstat(t, filepath.Join(dst, "etc/hard")); a.ino != b.ino {
		t.Error("the hard link came back as a copy")
	}
	if _, err := os.Lstat(filepath.Join(dst, "sock")); err == nil {
		t.Error("a socket was archived")
	}
	// Entries outside the given prefixes, or leaving their dir, are refused.
	for _, bad := range []string{"other/x", "upper/../x"} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		_ = tw.WriteHeader(&tar.Header{Name: bad, Typeflag: tar.TypeReg, Mode: 0o644})
		_ = tw.Close()
		if err := Extract(tar.NewReader(&b), map[string]string{"upper": t.TempDir()}); err == nil {
			t.Errorf("entry %q extracted", bad)
		}
	}
}

// OCI form: whiteouts and opaque dirs become the spec's names, only the
// xattrs asked for travel, and the root is no entry.
func TestOCIForm(t *testing.T) {
	src := tree(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := Write(tw, src, Options{OCI: true, Xattr: func(n string) bool { return n == "user.k" }}); err != nil || tw.Close() != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		switch h.Name {
		case "etc/suid":
			if x := h.PAXRecords; x["SCHILY.xattr.user.k"] != "v" || x["SCHILY.xattr.trusted.other"] != "" {
				t.Errorf("etc/suid xattrs %v, want only user.k", x)
			}
		case "opq/":
			if _, ok := h.PAXRecords["SCHILY.xattr."+OverlayOpaque]; ok {
				t.Error("the overlay's opaque xattr travelled in OCI form")
			}
		}
	}
	for _, want := range []string{".wh.gone", "opq/.wh..wh..opq", "etc/hard", "home/user/f"} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s in %v", want, names)
		}
	}
	for _, bad := range []string{"gone", "sock", "./", "/"} {
		if slices.Contains(names, bad) {
			t.Errorf("%s in %v", bad, names)
		}
	}
}

// TestExtractRefusesEscapes: a crafted archive (an archived sandbox's
// state from an object store) never writes, chmods or links outside its
// destination: not through "..", not through a symlink an earlier entry
// made, not by a directory entry met again over such a symlink.
func TestExtractRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	type entry struct {
		hdr  tar.Header
		body string
	}
	cases := map[string][]entry{
		"dot-dot": {{hdr: tar.Header{Name: "upper/../victim", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}, body: "own"}},
		"file through a symlink": {
			{hdr: tar.Header{Name: "upper/a", Typeflag: tar.TypeSymlink, Linkname: outside}},
			{hdr: tar.Header{Name: "upper/a/victim2", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}, body: "own"},
		},
		"directory over a symlink": {
			{hdr: tar.Header{Name: "upper/a", Typeflag: tar.TypeSymlink, Linkname: victim}},
			{hdr: tar.Header{Name: "upper/a/", Typeflag: tar.TypeDir, Mode: 0o777}},
		},
		"hard link through a symlink": {
			{hdr: tar.Header{Name: "upper/a", Typeflag: tar.TypeSymlink, Linkname: outside}},
			{hdr: tar.Header{Name: "upper/l", Typeflag: tar.TypeLink, Linkname: "upper/a/victim"}},
		},
		"unknown prefix": {{hdr: tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}, body: "own"}},
	}
	for name, entries := range cases {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range entries {
			h := e.hdr
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		dest := t.TempDir()
		if err := Extract(tar.NewReader(&buf), map[string]string{"upper": dest}); err == nil {
			t.Errorf("%s: extracted", name)
		}
		st, err := os.Stat(victim)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: the host file changed: %v %v", name, st, err)
		}
		if b, _ := os.ReadFile(victim); string(b) != "host" {
			t.Fatalf("%s: the host file was written", name)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 1 {
			t.Fatalf("%s: files appeared outside: %v", name, ents)
		}
	}
}
