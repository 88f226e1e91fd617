package agent

// Fuzz targets of the uploads a sandbox's client controls: tar streams
// (POST /cella/tar, `cella cp` of a directory) and multipart or raw /files
// uploads. The agent runs as root, so a bug here could write anywhere: the
// targets serve their requests from a child process chrooted into a
// scratch tree (a jail), where "anywhere" is that tree, and check after
// every request that nothing outside what the request's user may write
// changed, and that no device node or setuid/setgid file appeared. They go
// through the HTTP handlers only, so they hold whatever the handlers do
// inside. `go test` runs the seeds and testdata/fuzz; `go test -run=^$
// -fuzz=FuzzTarUpload ./internal/agent/` explores.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// jailEnv names the jail's root in the environment of the child that
// serves requests inside it (see TestMain).
const jailEnv = "CELLA_TEST_FUZZ_JAIL"

// The jail's layout: uid 1000 owns its home and nothing else; rootdir in
// the home is root's.
const (
	jailHome    = "/home/user"
	jailRootDir = "/home/user/rootdir"
)

// runJail is the child: chrooted into root, it serves the agent's handler
// for requests read from stdin, each answer written to stdout.
func runJail(root string) int {
	if err := syscall.Chroot(root); err != nil {
		fmt.Fprintln(os.Stderr, "chroot:", err)
		return 1
	}
	if err := os.Chdir("/"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := NewServer(agentapi.Config{SandboxID: "sbxfuzz", TemplateID: "tpl", Runtime: "gvisor", DefaultUser: "root"},
		Options{PasswdPath: "/etc/passwd", GroupPath: "/etc/group"})
	defer srv.Close()
	h := srv.Handler()
	in, out := bufio.NewReader(os.Stdin), bufio.NewWriter(os.Stdout)
	for {
		req, err := http.ReadRequest(in)
		if err != nil {
			return 0 // the parent closed stdin
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		_, _ = io.Copy(io.Discard, req.Body)
		body := rec.Body.Bytes()
		resp := &http.Response{StatusCode: rec.Code, ProtoMajor: 1, ProtoMinor: 1, Header: rec.Header(),
			ContentLength: int64(len(body)), Body: io.NopCloser(bytes.NewReader(body))}
		if err := resp.Write(out); err != nil || out.Flush() != nil {
			return 1
		}
	}
}

type jail struct {
	root string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	n    int // target directories made
}

// newJail starts a jail's child (agent tests run as root: chroot needs
// it, and so does acting as another user).
func newJail(tb testing.TB) *jail {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("agent tests run as root")
	}
	j := &jail{root: tb.TempDir()}
	j.layout(tb)
	j.cmd = exec.Command(os.Args[0], "-test.run=^$")
	j.cmd.Env = append(os.Environ(), jailEnv+"="+j.root)
	j.cmd.Stderr = os.Stderr
	var err error
	if j.in, err = j.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	stdout, err := j.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	j.out = bufio.NewReader(stdout)
	if err := j.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		j.in.Close()
		_ = j.cmd.Wait()
	})
	return j
}

// layout (re)makes the jail's tree from scratch, so that no request sees
// what an earlier one did (an escape that rewrote /etc/passwd would hide
// the next).
func (j *jail) layout(tb testing.TB) {
	tb.Helper()
	entries, err := os.ReadDir(j.root)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(j.root, e.Name())); err != nil {
			tb.Fatal(err)
		}
	}
	for _, d := range []string{"etc", "outside/dir", jailRootDir} {
		mkdir(tb, filepath.Join(j.root, d), 0o755, 0)
	}
	if err := os.Chown(filepath.Join(j.root, jailHome), testUID, testUID); err != nil {
		tb.Fatal(err)
	}
	for p, data := range map[string]string{
		"etc/passwd":          fmt.Sprintf("root:x:0:0:root:/root:/bin/bash\nuser:x:%d:%d::%s:/bin/bash\n", testUID, testUID, jailHome),
		"etc/group":           fmt.Sprintf("root:x:0:\nuser:x:%d:\n", testUID),
		"outside/sentinel":    "sentinel",
		"outside/dir/file":    "file",
		jailRootDir + "/file": "root's",
	} {
		if err := os.WriteFile(filepath.Join(j.root, p), []byte(data), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	// Symlinks the user planted out of their home, to a directory and to
	// a file.
	for name, to := range map[string]string{"link": "/outside", "flink": "/outside/sentinel"} {
		p := filepath.Join(j.root, jailHome, name)
		if err := os.Symlink(to, p); err != nil {
			tb.Fatal(err)
		}
		if err := os.Lchown(p, testUID, testUID); err != nil {
			tb.Fatal(err)
		}
	}
}

func mkdir(tb testing.TB, p string, mode os.FileMode, uid int) {
	tb.Helper()
	if err := os.MkdirAll(p, mode); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chown(p, uid, uid); err != nil {
		tb.Fatal(err)
	}
}

// do sends one request to the jail's agent.
func (j *jail) do(t *testing.T, method, target string, hdr http.Header, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://agent"+target, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if err := req.Write(j.in); err != nil {
		t.Fatalf("send to the jail: %v", err)
	}
	resp, err := http.ReadResponse(j.out, req)
	if err != nil {
		t.Fatalf("the jail's agent did not answer (did it crash?): %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// fileState is what a request must not change about a path it may not
// write.
type fileState struct {
	Mode     fs.FileMode
	UID, GID uint32
	Nlink    uint64
	Size     int64
	MTime    time.Time
	Data     string // regular files' content; symlinks' target
}

// snapshot records every path below the jail root (as the jail sees it)
// that keep says is not the request's to change.
func (j *jail) snapshot(t *testing.T, keep func(p string) bool) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.WalkDir(j.root, func(hp string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		p := "/" + strings.TrimPrefix(strings.TrimPrefix(hp, j.root), "/")
		if !keep(p) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(hp, &st); err != nil {
			return err
		}
		fi, _ := d.Info()
		s := fileState{Mode: fi.Mode(), UID: st.Uid, GID: st.Gid, Nlink: uint64(st.Nlink), Size: st.Size, MTime: fi.ModTime()}
		switch {
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(hp)
			s.Data = string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			s.Data, _ = os.Readlink(hp)
		}
		if d.IsDir() {
			s.MTime, s.Size, s.Nlink = time.Time{}, 0, 0 // a listing may change them; nothing in it may
		}
		out[p] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffStates(t *testing.T, what string, before, after map[string]fileState) {
	t.Helper()
	for p, b := range before {
		if a, ok := after[p]; !ok {
			t.Errorf("%s: %s was removed", what, p)
		} else if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: %s changed: %+v → %+v", what, p, b, a)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s: %s was created", what, p)
		}
	}
}

// checkCreated walks what the request may have created below dir: no
// device node, fifo or socket, no setuid/setgid bit, and everything owned
// by uid.
func (j *jail) checkCreated(t *testing.T, what, dir string, uid uint32, skip func(p string) bool) {
	t.Helper()
	_ = filepath.WalkDir(filepath.Join(j.root, dir), func(hp string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		p := "/" + strings.TrimPrefix(strings.TrimPrefix(hp, j.root), "/")
		if skip != nil && skip(p) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var st syscall.Stat_t
		if syscall.Lstat(hp, &st) != nil {
			return nil
		}
		fi, _ := d.Info()
		if m := fi.Mode(); m&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
			t.Errorf("%s: %s is a %v", what, p, m.Type())
		}
		if st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 && fi.Mode().IsRegular() {
			t.Errorf("%s: %s has mode %o (setuid/setgid)", what, p, st.Mode)
		}
		if st.Uid != uid {
			t.Errorf("%s: %s is owned by uid %d, not %d", what, p, st.Uid, uid)
		}
		return nil
	})
}

// next lays the jail out afresh and makes a target directory for one
// request, owned by uid.
func (j *jail) next(t *testing.T, parent string, uid int) string {
	t.Helper()
	j.layout(t)
	dir := filepath.Join(parent, "t"+strconv.Itoa(j.n))
	j.n++
	mkdir(t, filepath.Join(j.root, dir), 0o755, uid)
	return dir
}

// buildTar turns a script into a tar stream: one entry per line,
// "TYPE|MODE|NAME|LINK|DATA" with TYPE a tar type flag character and MODE
// octal (setuid bits included). Lines that do not parse are skipped, so
// the fuzzer explores entries rather than checksums.
func buildTar(script string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, line := range strings.Split(script, "\n") {
		f := strings.SplitN(line, "|", 5)
		if len(f) != 5 || len(f[0]) != 1 {
			continue
		}
		mode, err := strconv.ParseInt(f[1], 8, 64)
		if err != nil {
			continue
		}
		hdr := &tar.Header{Typeflag: f[0][0], Mode: mode & 0o7777, Name: f[2], Linkname: f[3], ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeRegA:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f[4]))
		case tar.TypeChar, tar.TypeBlock:
			hdr.Devmajor, hdr.Devminor = 1, 3 // /dev/null
		}
		if tw.WriteHeader(hdr) != nil {
			continue
		}
		if hdr.Size > 0 {
			_, _ = io.WriteString(tw, f[4])
		}
	}
	_ = tw.Close()
	return buf.Bytes()
}

var tarSeeds = []string{
	"5|755|sub/||\n0|644|sub/a.txt||hello\n2|777|sub/link|a.txt|\n0|755|b.sh||#!/bin/sh",
	"0|644|../escape.txt||x",
	"0|644|/abs.txt||x\n0|644|./././c.txt||y",
	"2|777|out|/outside|\n0|644|out/escape2.txt||x",
	"2|777|out|../../../../outside|\n0|644|out/escape3.txt||x",
	"2|777|d|/outside|\n1|644|x|d/sentinel|",
	"1|644|x|../../outside/sentinel|",
	"1|644|x|/outside/sentinel|",
	"0|644|a||1\n1|644|b|a|\n0|644|b||2",
	"2|777|f|/outside/sentinel|\n0|644|f||overwrite",
	"2|777|d|/outside/dir|\n5|755|d/||\n0|644|d/file||overwrite",
	"3|666|null||\n4|660|blk||\n6|644|fifo||",
	"0|4755|suid||x\n0|2755|sgid||x\n5|1777|sticky/||\n0|6777|both||x",
	"0|644|a||1\n5|755|a/||\n0|644|a/b||2",
	"5|755|d/||\n2|777|d|/outside|\n0|644|d/x||y",
	"2|777|l|.|\n0|644|l/l/l/x||y",
	"2|777|up|..|\n0|644|up/escape4.txt||x",
}

// FuzzTarUpload: whatever tar stream a client sends, as root or as the
// sandbox user, nothing outside the target directory (root) or outside
// what the user may write (user) changes, and what is created there has
// no device node, no setuid/setgid bit, and the requesting user's owner.
func FuzzTarUpload(f *testing.F) {
	for _, s := range tarSeeds {
		f.Add([]byte(s), false, false)
		f.Add([]byte(s), false, true)
	}
	// Raw streams: a real archive, and archives cut short.
	whole := buildTar(tarSeeds[0])
	f.Add(whole, true, false)
	f.Add(whole[:700], true, true)
	f.Add([]byte("not a tar at all"), true, false)
	j := newJail(f)
	f.Fuzz(func(t *testing.T, data []byte, raw, asUser bool) {
		body := data
		if !raw {
			body = buildTar(string(data))
		}
		user, parent, uid := "root", "/", 0
		if asUser {
			user, parent, uid = "user", jailHome, testUID
		}
		dir := j.next(t, parent, uid)
		keep := func(p string) bool { return p != dir && !strings.HasPrefix(p, dir+"/") }
		if asUser {
			keep = userMayNotWrite
		}
		before := j.snapshot(t, keep)
		code, resp := j.do(t, "POST", "/cella/tar?username="+user+"&path="+url.QueryEscape(dir), http.Header{"Content-Type": {"application/x-tar"}}, body)
		if code >= 500 {
			t.Errorf("status %d for a client's archive: %s", code, resp)
		}
		diffStates(t, "outside the target", before, j.snapshot(t, keep))
		j.checkCreated(t, "in the target", dir, uint32(uid), nil)
	})
}

// userMayNotWrite is everything in the jail but what is in the user's
// home, minus the root-owned directory there.
func userMayNotWrite(p string) bool {
	switch {
	case p == jailRootDir || strings.HasPrefix(p, jailRootDir+"/"):
		return true
	case p == jailHome:
		return true // itself, not its listing (fileState ignores that)
	}
	return !strings.HasPrefix(p, jailHome+"/")
}

// multipartForm builds the SDK's upload form: one "file" part per entry,
// the filename being the destination path.
func multipartForm(boundary string, files ...[2]string) []byte {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if mw.SetBoundary(boundary) != nil {
		_ = mw.SetBoundary("fuzzboundary")
	}
	for _, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename="%s"`, f[0]))
		h.Set("Content-Type", "application/octet-stream")
		w, _ := mw.CreatePart(h)
		_, _ = io.WriteString(w, f[1])
	}
	_ = mw.Close()
	return buf.Bytes()
}

// FuzzFilesUpload: a /files upload as the sandbox user (multipart, with
// or without the path query, or a raw body) writes only where the user
// may: nothing outside their home (and nothing in root's directory inside
// it) changes, whatever the form, its filenames or the planted symlinks
// (~/link → /outside, ~/flink → /outside/sentinel) say; what it creates is
// the user's, and a client's form is never a 5xx.
func FuzzFilesUpload(f *testing.F) {
	for _, dst := range []string{"a.txt", "/home/user/b.txt", "new/dir/c.txt", "../../outside/x", "/outside/x", "/etc/passwd",
		"link/x", "flink", "/home/user/link/dir/file", "rootdir/file", "rootdir/new", "~/d.txt", "~root/x", "", "/home/user",
		"/home/user/../user/e.txt", "new/../../../outside/sentinel"} {
		f.Add(multipartForm("fuzzboundary", [2]string{dst, "data"}), "fuzzboundary", "", false, false)
		f.Add([]byte("raw data"), "", dst, true, true)
	}
	f.Add(multipartForm("b", [2]string{"one.txt", "1"}, [2]string{"one.txt", "2"}), "b", "", false, false)
	f.Add(multipartForm("b", [2]string{"x.txt", "1"}, [2]string{"link/y", "2"}), "b", "", false, false)
	f.Add(multipartForm("b", [2]string{"x.txt", "1"}), "b", "q.txt", true, false)
	f.Add([]byte("--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nno filename\r\n--b--\r\n"), "b", "", false, false)
	f.Add([]byte("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"unterminated"), "b", "", false, false)
	j := newJail(f)
	f.Fuzz(func(t *testing.T, body []byte, boundary, path string, withPath, raw bool) {
		q := url.Values{"username": {"user"}}
		if withPath {
			q.Set("path", path)
		}
		ct := "multipart/form-data; boundary=" + boundary
		if raw {
			ct = "application/octet-stream"
		}
		if !httpguts.ValidHeaderFieldValue(ct) {
			return // no HTTP client sends it
		}
		j.layout(t)
		keep := userMayNotWrite
		before := j.snapshot(t, keep)
		code, resp := j.do(t, "POST", "/files?"+q.Encode(), http.Header{"Content-Type": {ct}}, body)
		if code >= 500 {
			t.Errorf("status %d for a client's upload: %s", code, resp)
		}
		diffStates(t, "where the user may not write", before, j.snapshot(t, keep))
		j.checkCreated(t, "in the user's home", jailHome, testUID, func(p string) bool {
			return p == jailRootDir || strings.HasPrefix(p, jailRootDir+"/")
		})
	})
}
