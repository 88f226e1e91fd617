package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/envd/filesystem"
)

// userAttack is a sandbox where uid 1000 planted symlinks from its home to
// root's files, as it can from any shell.
type userAttack struct {
	*testEnv
	passwd  string // root's, 0644: readable, not writable by the user
	shadow  string // root's, 0640
	private string // root's 0700 directory
	secret  string // root's 0600 file in private
}

func newUserAttack(t *testing.T) *userAttack {
	e := newTestEnv(t)
	a := &userAttack{
		testEnv: e,
		passwd:  filepath.Join(e.rootDir, "passwd"),
		shadow:  filepath.Join(e.rootDir, "shadow"),
		private: filepath.Join(e.rootDir, "root"),
	}
	a.secret = filepath.Join(a.private, "secret")
	writeFile(t, a.passwd, "root:x:0:0:root:/root:/bin/bash\n")
	writeFile(t, a.shadow, "root:$6$hash\n")
	if err := os.Chmod(a.shadow, 0o640); err != nil {
		t.Fatal(err)
	}
	writeFile(t, a.secret, "s3cret")
	if err := os.Chmod(a.secret, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(a.private, 0o700); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"out.txt": a.passwd, "shadow": a.shadow, "secret": a.secret, "rootdir": a.private} {
		p := filepath.Join(e.home, link)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, testUID, testUID); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// unchanged fails unless p still has the content, owner root and mode.
func unchanged(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	s := st.Sys().(*syscall.Stat_t)
	if string(b) != content || s.Uid != 0 || s.Gid != 0 || st.Mode().Perm() != mode {
		t.Fatalf("%s changed: %q owner %d:%d mode %v", p, b, s.Uid, s.Gid, st.Mode().Perm())
	}
}

// wantE2BError checks envd's error shape {"code":N,"message":"..."}.
func wantE2BError(t *testing.T, resp *http.Response, body []byte, code int, words ...string) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if resp.StatusCode != code || json.Unmarshal(body, &e) != nil || e.Code != code {
		t.Fatalf("want %d in E2B's error shape, got %d %s", code, resp.StatusCode, body)
	}
	for _, w := range words {
		if !strings.Contains(e.Message, w) {
			t.Fatalf("message %q does not say %q", e.Message, w)
		}
	}
}

func TestFilesUploadThroughPlantedSymlink(t *testing.T) {
	a := newUserAttack(t)
	const passwd = "root:x:0:0:root:/root:/bin/bash\n"
	link := filepath.Join(a.home, "out.txt")

	// Multipart (the SDK's files.write) and octet-stream, through the link
	// and straight at the target.
	for _, target := range []string{link, "~/out.txt", a.passwd} {
		ct, body := multipartBody(t, map[string]string{target: "pwned::0:0::/:/bin/sh\n"})
		req := mustReq("POST", a.ts.URL+"/files?username=user&path="+url.QueryEscape(target), body)
		req.Header.Set("Content-Type", ct)
		resp, b := do(t, req)
		wantE2BError(t, resp, b, http.StatusForbidden, "permission denied", "user 'user'")

		req = mustReq("POST", a.ts.URL+"/files?username=user&path="+url.QueryEscape(target), strings.NewReader("pwned"))
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, b = do(t, req)
		wantE2BError(t, resp, b, http.StatusForbidden, "permission denied")
		unchanged(t, a.passwd, passwd, 0o644)
	}
	// Into a directory the user cannot write, through a linked directory.
	ct, body := multipartBody(t, map[string]string{filepath.Join(a.home, "rootdir", "new", "x"): "x"})
	req := mustReq("POST", a.ts.URL+"/files?username=user", body)
	req.Header.Set("Content-Type", ct)
	resp, b := do(t, req)
	wantE2BError(t, resp, b, http.StatusForbidden, "permission denied")
	if _, err := os.Lstat(filepath.Join(a.private, "new")); err == nil {
		t.Fatal("the user created a directory in root's 0700 directory")
	}

	// The user's own writes still work, and are the user's.
	ct, body = multipartBody(t, map[string]string{"~/mine/a.txt": "mine"})
	req = mustReq("POST", a.ts.URL+"/files?username=user", body)
	req.Header.Set("Content-Type", ct)
	if resp, b := do(t, req); resp.StatusCode != 200 {
		t.Fatalf("own write: %d %s", resp.StatusCode, b)
	}
	for _, p := range []string{filepath.Join(a.home, "mine"), filepath.Join(a.home, "mine", "a.txt")} {
		if ownerOf(t, p) != testUID {
			t.Fatalf("%s not owned by the user", p)
		}
	}
}

// Writing a file never changes its owner, whoever writes it.
func TestFilesUploadKeepsOwner(t *testing.T) {
	a := newUserAttack(t)
	shared := filepath.Join(a.rootDir, "shared.txt") // someone else's, world-writable
	writeFile(t, shared, "old")
	if err := os.Chmod(shared, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(shared, 2000, 2000); err != nil {
		t.Fatal(err)
	}
	users := filepath.Join(a.home, "users.txt")
	writeFile(t, users, "old")
	if err := os.Chown(users, testUID, testUID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ user, path string }{{"user", shared}, {"root", shared}, {"root", users}} {
		req := mustReq("POST", a.ts.URL+"/files?username="+c.user+"&path="+url.QueryEscape(c.path), strings.NewReader("new"))
		req.Header.Set("Content-Type", "application/octet-stream")
		if resp, b := do(t, req); resp.StatusCode != 200 {
			t.Fatalf("%s writes %s: %d %s", c.user, c.path, resp.StatusCode, b)
		}
	}
	if got, _ := os.ReadFile(shared); string(got) != "new" {
		t.Fatalf("shared.txt %q", got)
	}
	if ownerOf(t, shared) != 2000 || ownerOf(t, users) != testUID {
		t.Fatalf("owners changed: shared.txt %d, users.txt %d", ownerOf(t, shared), ownerOf(t, users))
	}
}

func TestFilesDownloadThroughPlantedSymlink(t *testing.T) {
	a := newUserAttack(t)
	for _, p := range []string{"~/secret", "~/shadow", "~/rootdir/secret", a.secret, a.shadow} {
		resp, b := do(t, mustReq("GET", a.ts.URL+"/files?username=user&path="+url.QueryEscape(p), nil))
		wantE2BError(t, resp, b, http.StatusForbidden, "permission denied", "user 'user' cannot read")
		if bytes.Contains(b, []byte("s3cret")) || bytes.Contains(b, []byte("$6$")) {
			t.Fatalf("%s leaked: %s", p, b)
		}
	}
	// What the user may read it still reads, symlink or not; root reads all.
	if resp, b := do(t, mustReq("GET", a.ts.URL+"/files?username=user&path="+url.QueryEscape("~/out.txt"), nil)); resp.StatusCode != 200 || !strings.HasPrefix(string(b), "root:x:0:0") {
		t.Fatalf("readable file through a symlink: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, mustReq("GET", a.ts.URL+"/files?username=root&path="+url.QueryEscape(a.secret), nil)); resp.StatusCode != 200 || string(b) != "s3cret" {
		t.Fatalf("root read: %d %s", resp.StatusCode, b)
	}
	// Tar of root's directory, through the link.
	resp, b := do(t, mustReq("GET", a.ts.URL+"/cella/tar?username=user&path="+url.QueryEscape("~/rootdir"), nil))
	wantE2BError(t, resp, b, http.StatusForbidden, "permission denied")
}

func TestFilesystemRPCsActAsUser(t *testing.T) {
	a := newUserAttack(t)
	ctx := ctxT(t, 30*time.Second)
	asUser := func(req connect.AnyRequest) {
		req.Header().Set("Authorization", basicAuth("user"))
	}
	denied := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "user 'user'") {
			t.Fatalf("%s: want permission_denied naming the user, got %v", what, err)
		}
	}
	linked := filepath.Join(a.home, "rootdir")

	statReq := connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(linked, "secret")})
	asUser(statReq)
	_, err := a.fs.Stat(ctx, statReq)
	denied("stat", err)

	listReq := connect.NewRequest(&filesystem.ListDirRequest{Path: linked, Depth: 1})
	asUser(listReq)
	_, err = a.fs.ListDir(ctx, listReq)
	denied("list", err)

	mkReq := connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(linked, "made")})
	asUser(mkReq)
	_, err = a.fs.MakeDir(ctx, mkReq)
	denied("mkdir", err)

	mvReq := connect.NewRequest(&filesystem.MoveRequest{Source: filepath.Join(linked, "secret"), Destination: "~/stolen"})
	asUser(mvReq)
	_, err = a.fs.Move(ctx, mvReq)
	denied("move out", err)

	writeFile(t, filepath.Join(a.home, "evil"), "pwned")
	mvReq = connect.NewRequest(&filesystem.MoveRequest{Source: "~/evil", Destination: a.passwd})
	asUser(mvReq)
	_, err = a.fs.Move(ctx, mvReq)
	denied("move over", err)

	for _, p := range []string{filepath.Join(linked, "secret"), a.passwd} {
		rmReq := connect.NewRequest(&filesystem.RemoveRequest{Path: p})
		asUser(rmReq)
		_, err = a.fs.Remove(ctx, rmReq)
		denied("remove "+p, err)
	}

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wReq := connect.NewRequest(&filesystem.WatchDirRequest{Path: linked})
	asUser(wReq)
	stream, err := a.fs.WatchDir(wctx, wReq)
	if err == nil {
		for stream.Receive() {
			t.Fatalf("watch of root's directory as the user started: %v", stream.Msg())
		}
		err = stream.Err()
		stream.Close()
	}
	denied("watch", err)

	unchanged(t, a.passwd, "root:x:0:0:root:/root:/bin/bash\n", 0o644)
	unchanged(t, a.secret, "s3cret", 0o600)
	for _, p := range []string{filepath.Join(a.private, "made"), filepath.Join(a.home, "stolen")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s exists", p)
		}
	}

	// The user's own tree: made, moved and removed as the user.
	mkReq = connect.NewRequest(&filesystem.MakeDirRequest{Path: "~/d/e"})
	asUser(mkReq)
	if _, err := a.fs.MakeDir(ctx, mkReq); err != nil {
		t.Fatal(err)
	}
	if ownerOf(t, filepath.Join(a.home, "d")) != testUID || ownerOf(t, filepath.Join(a.home, "d", "e")) != testUID {
		t.Fatal("made directories not owned by the user")
	}
}

func TestTarPutActsAsUser(t *testing.T) {
	a := newUserAttack(t)
	put := func(user, dir string, entries func(tw *tar.Writer)) (*http.Response, []byte) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		entries(tw)
		tw.Close()
		req := mustReq("POST", a.ts.URL+"/cella/tar?username="+user+"&path="+url.QueryEscape(dir), &buf)
		req.Header.Set("Content-Type", "application/x-tar")
		return do(t, req)
	}
	file := func(tw *tar.Writer, name, data string, mode int64) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg})
		tw.Write([]byte(data))
	}
	// Into root's directory through the user's link: refused by the kernel.
	resp, b := put("user", "~/rootdir", func(tw *tar.Writer) { file(tw, "x", "x", 0o644) })
	wantE2BError(t, resp, b, http.StatusForbidden, "permission denied")
	// An absolute symlink entry, then an entry through it; a hard link to
	// a file outside; an entry over the planted link.
	for _, evil := range []func(tw *tar.Writer){
		func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Name: "etc", Linkname: a.rootDir, Typeflag: tar.TypeSymlink})
			file(tw, "etc/passwd", "pwned", 0o644)
		},
		func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Name: "pw", Linkname: "../../scratch/passwd", Typeflag: tar.TypeLink})
		},
		func(tw *tar.Writer) { file(tw, "/../../scratch/passwd", "pwned", 0o644) },
	} {
		resp, b := put("root", filepath.Join(a.home, "t"), evil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("tar-slip as root: %d %s", resp.StatusCode, b)
		}
	}
	// The planted link in the target is replaced, not written through.
	resp, b = put("user", a.home, func(tw *tar.Writer) { file(tw, "out.txt", "mine", 0o644) })
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	unchanged(t, a.passwd, "root:x:0:0:root:/root:/bin/bash\n", 0o644)

	// No devices, no setuid bits; what is created belongs to the user.
	resp, b = put("user", "~/u", func(tw *tar.Writer) {
		tw.WriteHeader(&tar.Header{Name: "sda", Mode: 0o666, Typeflag: tar.TypeBlock, Devmajor: 8})
		tw.WriteHeader(&tar.Header{Name: "d/", Mode: 0o1777, Typeflag: tar.TypeDir})
		file(tw, "d/suid", "#!/bin/sh\n", 0o4755)
	})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if _, err := os.Lstat(filepath.Join(a.home, "u", "sda")); err == nil {
		t.Fatal("a device node was created")
	}
	st, err := os.Stat(filepath.Join(a.home, "u", "d", "suid"))
	if err != nil || st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || st.Mode().Perm() != 0o755 {
		t.Fatalf("suid entry: %v %v", st.Mode(), err)
	}
	for _, p := range []string{"u", "u/d", "u/d/suid", "out.txt"} {
		if ownerOf(t, filepath.Join(a.home, p)) != testUID {
			t.Fatalf("%s not owned by the user", p)
		}
	}
}

// A fifo where a file is expected is refused at once, not waited on.
func TestFilesFifo(t *testing.T) {
	e := newTestEnv(t)
	fifo := filepath.Join(e.home, "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(fifo, testUID, testUID); err != nil {
		t.Fatal(err)
	}
	req := mustReq("POST", e.ts.URL+"/files?username=user&path="+url.QueryEscape(fifo), strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, b := do(t, req)
	wantE2BError(t, resp, b, http.StatusBadRequest, "not a regular file")
	resp, b = do(t, mustReq("GET", e.ts.URL+"/files?username=user&path="+url.QueryEscape(fifo), nil))
	wantE2BError(t, resp, b, http.StatusBadRequest, "not a regular file")
}

// A recursive watch as the user follows new directories the user may read,
// and not root's.
func TestWatchDirActsAsUser(t *testing.T) {
	e := newTestEnv(t)
	dir := filepath.Join(e.home, "w")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, Recursive: true})
	req.Header().Set("Authorization", basicAuth("user"))
	stream, err := e.fs.WatchDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first event %v %v", stream.Msg(), stream.Err())
	}
	// next returns the names of the events up to and including want's.
	next := func(want string) []string {
		t.Helper()
		var seen []string
		for stream.Receive() {
			if ev := stream.Msg().GetFilesystem(); ev != nil && ev.Type == filesystem.EventType_EVENT_TYPE_CREATE {
				seen = append(seen, ev.Name)
				if ev.Name == want {
					return seen
				}
			}
		}
		t.Fatalf("stream ended before %s: %v (saw %v)", want, stream.Err(), seen)
		return nil
	}
	// The event of a new directory is sent after the watcher tried to add
	// it, so what is written in it afterwards is seen or not for good.
	if err := os.Mkdir(filepath.Join(dir, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	next("private")
	writeFile(t, filepath.Join(dir, "private", "secret"), "s")
	writeFile(t, filepath.Join(dir, "marker"), "m")
	if seen := next("marker"); len(seen) != 1 {
		t.Fatalf("events from root's 0700 directory reached the user: %v", seen)
	}
	if err := os.Mkdir(filepath.Join(dir, "mine"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "mine"), testUID, testUID); err != nil {
		t.Fatal(err)
	}
	next("mine")
	writeFile(t, filepath.Join(dir, "mine", "x"), "x")
	next("mine/x")
}
