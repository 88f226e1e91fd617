package template

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/rootfs"
)

// finalized is what finalize decided.
type finalized struct {
	user     string
	uid, gid int
	home     string
	changed  bool     // the finalize layer holds something
	notes    []string // what it did, for the build log
}

// finalize writes, in dst, the small layer that sits on top of an image's
// layers (lowers, top first) and gives it E2B's conventions: a `user`
// account (uid/gid 1000, /home/user, bash or else sh) unless the image has
// one, its home, and /tmp. imageUser is the image config's User; when it
// names an account of the image, that account is the template's default
// user instead.
//
// The image's files are read through a read-only overlay of its layers,
// mounted in a private mount namespace on a thread of its own (the mount
// vanishes with the thread, even if the daemon dies), and every path is
// resolved inside that root (openat2 RESOLVE_IN_ROOT), so the image's
// symlinks cannot make the host's files be read. What is written goes to
// dst, a fresh directory nothing in the image can point into.
func finalize(lowers []string, dst, scratch, imageUser string) (finalized, error) {
	var fin finalized
	mnt, err := os.MkdirTemp(scratch, "finalize-mnt-")
	if err != nil {
		return fin, err
	}
	defer os.Remove(mnt)
	emptyDir, err := os.MkdirTemp(scratch, "finalize-empty-")
	if err != nil {
		return fin, err
	}
	defer os.Remove(emptyDir)
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fin, err
	}
	err = rootfs.OnThrowawayThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("private mount namespace: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("private mount namespace: %w", err)
		}
		// An empty bottom layer: a read-only overlay needs two lowers.
		if err := rootfs.MountOverlay(mnt, append(lowers, emptyDir), "", "", unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return err
		}
		img, err := openImageRoot(mnt)
		if err != nil {
			return err
		}
		defer img.close()
		fin, err = finalizeIn(img, &layerWriter{root: dst}, imageUser)
		return err
	})
	return fin, err
}

func finalizeIn(img *imageRoot, out *layerWriter, imageUser string) (finalized, error) {
	fin := finalized{user: DefaultUser, uid: DefaultUID, gid: DefaultGID, home: DefaultWorkdir}
	for _, d := range []string{"etc", "home", "tmp"} {
		if img.isSymlink(d) {
			return fin, fmt.Errorf("the image's /%s is a symlink; cella needs a real /%s", d, d)
		}
	}
	passwd, _, err := img.read("etc/passwd")
	if err != nil {
		return fin, err
	}
	if imageUser != "" {
		if name, uid, gid, home, ok := lookupUser(passwd, imageUser); ok {
			fin.user, fin.uid, fin.gid, fin.home = name, uid, gid, home
			fin.notes = append(fin.notes, fmt.Sprintf("default user %s (the image's User)", name))
			return fin, ensureTmp(img, out, &fin)
		}
		fin.notes = append(fin.notes, fmt.Sprintf("the image's User %q has no account in its /etc/passwd; the default user is %s", imageUser, DefaultUser))
	}
	if name, uid, gid, home, ok := lookupUser(passwd, DefaultUser); ok {
		fin.user, fin.uid, fin.gid, fin.home = name, uid, gid, home
		fin.notes = append(fin.notes, fmt.Sprintf("the image has user %s (uid %d)", name, uid))
		return fin, ensureTmp(img, out, &fin)
	}
	shell := DefaultShell
	if !img.exists("bin/bash") {
		shell = "/bin/sh"
	}
	days := time.Now().Unix() / 86400
	for _, f := range []struct {
		path, line string
		mode       os.FileMode
		create     bool
	}{
		{"etc/passwd", fmt.Sprintf("%s:x:%d:%d::%s:%s", DefaultUser, DefaultUID, DefaultGID, DefaultWorkdir, shell), 0o644, true},
		{"etc/group", fmt.Sprintf("%s:x:%d:", DefaultUser, DefaultGID), 0o644, true},
		{"etc/shadow", fmt.Sprintf("%s:*:%d:0:99999:7:::", DefaultUser, days), 0o640, false},
	} {
		b, st, err := img.read(f.path)
		if err != nil {
			return fin, err
		}
		if st == nil && !f.create {
			continue
		}
		if hasEntry(b, DefaultUser) {
			continue
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			b = append(b, '\n')
		}
		b = append(b, f.line+"\n"...)
		if err := out.file(img, f.path, b, f.mode, st); err != nil {
			return fin, err
		}
	}
	fin.notes = append(fin.notes, fmt.Sprintf("added user %s (uid %d, shell %s)", DefaultUser, DefaultUID, shell))
	if !img.exists(strings.TrimPrefix(DefaultWorkdir, "/")) {
		if err := out.dir(img, "home/user", 0o750, DefaultUID, DefaultGID); err != nil {
			return fin, err
		}
		for _, name := range img.list("etc/skel") {
			b, st, err := img.read("etc/skel/" + name)
			if err != nil || st == nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
				continue
			}
			if err := out.write("home/user/"+name, b, 0o644, DefaultUID, DefaultGID); err != nil {
				return fin, err
			}
		}
		fin.notes = append(fin.notes, "created "+DefaultWorkdir)
	}
	fin.changed = true
	return fin, ensureTmp(img, out, &fin)
}

func ensureTmp(img *imageRoot, out *layerWriter, fin *finalized) error {
	if img.exists("tmp") {
		return nil
	}
	fin.changed = true
	fin.notes = append(fin.notes, "created /tmp")
	return out.dir(img, "tmp", 0o1777, 0, 0)
}

// lookupUser finds spec ("name", "uid", "name:group", "uid:gid") in a
// passwd file.
func lookupUser(passwd []byte, spec string) (name string, uid, gid int, home string, ok bool) {
	u, _, _ := strings.Cut(spec, ":")
	sc := bufio.NewScanner(bytes.NewReader(passwd))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 || (f[0] != u && f[2] != u) {
			continue
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		home := f[5]
		if home == "" {
			home = "/"
		}
		return f[0], uid, gid, home, true
	}
	return "", 0, 0, "", false
}

func hasEntry(db []byte, name string) bool {
	sc := bufio.NewScanner(bytes.NewReader(db))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name+":") {
			return true
		}
	}
	return false
}

// imageRoot reads an image's merged files, every path resolved inside it.
type imageRoot struct{ fd int }

func openImageRoot(dir string) (*imageRoot, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open image root: %w", err)
	}
	return &imageRoot{fd: fd}, nil
}

func (r *imageRoot) close() { unix.Close(r.fd) }

func (r *imageRoot) open(p string, flags int, resolve uint64) (int, error) {
	return unix.Openat2(r.fd, p, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolve | unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
}

// read returns p's content and stat, or (nil, nil, nil) if it does not exist.
func (r *imageRoot) read(p string) ([]byte, *unix.Stat_t, error) {
	fd, err := r.open(p, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read the image's /%s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, &st, nil
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	return b, &st, err
}

func (r *imageRoot) stat(p string, resolve uint64) (*unix.Stat_t, error) {
	fd, err := r.open(p, unix.O_PATH, resolve)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	return &st, unix.Fstat(fd, &st)
}

// exists follows symlinks inside the image (/bin -> usr/bin).
func (r *imageRoot) exists(p string) bool {
	_, err := r.stat(p, 0)
	return err == nil
}

func (r *imageRoot) isSymlink(p string) bool {
	_, err := r.stat(p, unix.RESOLVE_NO_SYMLINKS)
	return errors.Is(err, unix.ELOOP)
}

func (r *imageRoot) list(p string) []string {
	fd, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return names
}

// layerWriter writes the finalize layer: fixed paths under a fresh dir.
type layerWriter struct{ root string }

// parents creates p's parent dirs in the layer with the image's owner and
// mode for each (overlay shows the top layer's dir attributes).
func (w *layerWriter) parents(img *imageRoot, p string) error {
	parts := strings.Split(filepath.Dir(p), "/")
	for i := range parts {
		if parts[i] == "." {
			continue
		}
		rel := strings.Join(parts[:i+1], "/")
		if _, err := os.Lstat(filepath.Join(w.root, rel)); err == nil {
			continue
		}
		mode, uid, gid := uint32(0o755), 0, 0
		if st, err := img.stat(rel, unix.RESOLVE_NO_SYMLINKS); err == nil {
			mode, uid, gid = st.Mode&0o7777, int(st.Uid), int(st.Gid)
		}
		if err := w.mkdir(rel, mode, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

func (w *layerWriter) mkdir(rel string, mode uint32, uid, gid int) error {
	p := filepath.Join(w.root, rel)
	if err := os.Mkdir(p, 0o700); err != nil {
		return fmt.Errorf("finalize layer: %w", err)
	}
	if err := os.Lchown(p, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(p, mode)
}

func (w *layerWriter) dir(img *imageRoot, rel string, mode uint32, uid, gid int) error {
	if err := w.parents(img, rel); err != nil {
		return err
	}
	return w.mkdir(rel, mode, uid, gid)
}

// file writes a changed copy of the image's file rel, keeping its owner
// and mode (st; nil for a new file: mode, root-owned).
func (w *layerWriter) file(img *imageRoot, rel string, b []byte, mode os.FileMode, st *unix.Stat_t) error {
	if err := w.parents(img, rel); err != nil {
		return err
	}
	uid, gid, m := 0, 0, uint32(mode)
	if st != nil {
		uid, gid, m = int(st.Uid), int(st.Gid), st.Mode&0o7777
	}
	return w.write(rel, b, m, uid, gid)
}

func (w *layerWriter) write(rel string, b []byte, mode uint32, uid, gid int) error {
	p := filepath.Join(w.root, rel)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		return fmt.Errorf("finalize layer: %w", err)
	}
	if err := os.Lchown(p, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(p, mode)
}
