package agent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

func do(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// multipartBody builds the SDK's form: parts named "file" whose filename is
// the full destination path.
func multipartBody(t *testing.T, files map[string]string) (string, *bytes.Buffer) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for path, data := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename="%s"`, path))
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, data)
	}
	mw.Close()
	return mw.FormDataContentType(), &buf
}

func ownerOf(t *testing.T, p string) uint32 {
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Uid
}

func TestUploadMultipart(t *testing.T) {
	e := newTestEnv(t)
	target := filepath.Join(e.home, "new", "dir", "a.txt")
	ct, body := multipartBody(t, map[string]string{target: "hello"})
	req, _ := http.NewRequest("POST", e.ts.URL+"/files?username=user&path="+url.QueryEscape(target), body)
	req.Header.Set("Content-Type", ct)
	resp, b := do(t, req)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	jsonEqual(t, b, fmt.Sprintf(`[{"path":%q,"name":"a.txt","type":"file"}]`, target))
	if got, _ := os.ReadFile(target); string(got) != "hello" {
		t.Fatalf("content %q", got)
	}
	// File and created parents belong to the user.
	for _, p := range []string{target, filepath.Dir(target), filepath.Dir(filepath.Dir(target))} {
		if ownerOf(t, p) != testUID {
			t.Errorf("%s not owned by %d", p, testUID)
		}
	}

	// Multi-file: no path query, each filename is its path; relative names
	// resolve against the user's home.
	ct, body = multipartBody(t, map[string]string{filepath.Join(e.home, "m", "1.txt"): "one", "rel/2.txt": "two"})
	req, _ = http.NewRequest("POST", e.ts.URL+"/files?username=user", body)
	req.Header.Set("Content-Type", ct)
	resp, b = do(t, req)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var entries []fileEntry
	if err := json.Unmarshal(b, &entries); err != nil || len(entries) != 2 {
		t.Fatalf("%s", b)
	}
	if got, _ := os.ReadFile(filepath.Join(e.home, "m", "1.txt")); string(got) != "one" {
		t.Fatalf("1.txt %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(e.home, "rel", "2.txt")); string(got) != "two" {
		t.Fatalf("2.txt %q", got)
	}

	// Writing onto a directory is 400.
	ct, body = multipartBody(t, map[string]string{e.home: "x"})
	req, _ = http.NewRequest("POST", e.ts.URL+"/files", body)
	req.Header.Set("Content-Type", ct)
	if resp, b := do(t, req); resp.StatusCode != 400 || !strings.Contains(string(b), `"code":400`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

func TestUploadOctetStreamGzipAndDownload(t *testing.T) {
	e := newTestEnv(t)
	target := filepath.Join(e.rootDir, "g.txt")
	var zbuf bytes.Buffer
	zw := gzip.NewWriter(&zbuf)
	io.WriteString(zw, strings.Repeat("gzipped ", 1000))
	zw.Close()
	req, _ := http.NewRequest("POST", e.ts.URL+"/files?path="+url.QueryEscape(target), &zbuf)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("X-Metadata-Origin", "test")
	resp, b := do(t, req)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	want := strings.Repeat("gzipped ", 1000)
	if got, _ := os.ReadFile(target); string(got) != want {
		t.Fatalf("content %d bytes", len(got))
	}

	// Plain download (http.ServeContent: Content-Length, ranges).
	req, _ = http.NewRequest("GET", e.ts.URL+"/files?path="+url.QueryEscape(target), nil)
	req.Header.Set("Accept-Encoding", "identity")
	resp, b = do(t, req)
	if resp.StatusCode != 200 || string(b) != want || resp.Header.Get("Content-Length") != fmt.Sprint(len(want)) {
		t.Fatalf("%d %d %v", resp.StatusCode, len(b), resp.Header)
	}
	req, _ = http.NewRequest("GET", e.ts.URL+"/files?path="+url.QueryEscape(target), nil)
	req.Header.Set("Range", "bytes=0-6")
	if resp, b := do(t, req); resp.StatusCode != 206 || string(b) != "gzipped" {
		t.Fatalf("range: %d %q", resp.StatusCode, b)
	}

	// Gzip download when asked.
	req, _ = http.NewRequest("GET", e.ts.URL+"/files?path="+url.QueryEscape(target), nil)
	req.Header.Set("Accept-Encoding", "gzip")
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	gresp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer gresp.Body.Close()
	if gresp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("headers %v", gresp.Header)
	}
	zr, err := gzip.NewReader(gresp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(zr); string(got) != want {
		t.Fatalf("gunzipped %d bytes", len(got))
	}

	// Missing file: 404 JSON; directory: 400.
	req, _ = http.NewRequest("GET", e.ts.URL+"/files?path=/nope/x", nil)
	resp, b = do(t, req)
	if resp.StatusCode != 404 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	jsonEqual(t, b, `{"code":404,"message":"path '/nope/x' does not exist"}`)
	req, _ = http.NewRequest("GET", e.ts.URL+"/files?path="+url.QueryEscape(e.rootDir), nil)
	if resp, _ := do(t, req); resp.StatusCode != 400 {
		t.Fatalf("dir: %d", resp.StatusCode)
	}
	// Octet-stream needs a path.
	req, _ = http.NewRequest("POST", e.ts.URL+"/files", strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, _ := do(t, req); resp.StatusCode != 400 {
		t.Fatalf("no path: %d", resp.StatusCode)
	}
}

func TestAuth(t *testing.T) {
	const token = "s3cret"
	e := newTestEnv(t, func(c *agentapi.Config, _ *Options) { c.AccessToken = token })
	get := func(path string, hdr ...string) (*http.Response, []byte) {
		req, _ := http.NewRequest("GET", e.ts.URL+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		return do(t, req)
	}
	if resp, _ := get("/health"); resp.StatusCode != 204 {
		t.Fatalf("health %d", resp.StatusCode)
	}
	resp, b := get("/envs")
	if resp.StatusCode != 401 {
		t.Fatalf("envs without token: %d", resp.StatusCode)
	}
	jsonEqual(t, b, `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}`)
	resp, b = get("/envs", "X-Access-Token", token)
	if resp.StatusCode != 200 {
		t.Fatalf("envs: %d", resp.StatusCode)
	}
	jsonEqual(t, b, `{"GLOBAL_VAR":"g","E2B_SANDBOX":"true","E2B_SANDBOX_ID":"sbxtest","E2B_TEMPLATE_ID":"tpl"}`)

	// RPCs need the token.
	req, _ := http.NewRequest("POST", e.ts.URL+"/process.Process/List", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	if resp, _ := do(t, req); resp.StatusCode != 401 {
		t.Fatalf("rpc without token: %d", resp.StatusCode)
	}
	req.Header.Set("X-Access-Token", token)
	req.Body = io.NopCloser(strings.NewReader("{}"))
	if resp, b := do(t, req); resp.StatusCode != 200 {
		t.Fatalf("rpc with token: %d %s", resp.StatusCode, b)
	}

	// /files: token or signature.
	target := filepath.Join(e.rootDir, "s.txt")
	writeFile(t, target, "signed")
	q := "/files?path=" + url.QueryEscape(target)
	if resp, _ := get(q); resp.StatusCode != 401 {
		t.Fatalf("files without auth: %d", resp.StatusCode)
	}
	if resp, _ := get(q, "X-Access-Token", "wrong"); resp.StatusCode != 401 {
		t.Fatalf("files with wrong token: %d", resp.StatusCode)
	}
	if resp, b := get(q, "X-Access-Token", token); resp.StatusCode != 200 || string(b) != "signed" {
		t.Fatalf("files with token: %d", resp.StatusCode)
	}
	sig := agentapi.Signature(target, "read", "", token, 0)
	if resp, b := get(q + "&signature=" + url.QueryEscape(sig)); resp.StatusCode != 200 || string(b) != "signed" {
		t.Fatalf("signed: %d %s", resp.StatusCode, b)
	}
	exp := time.Now().Add(time.Minute).Unix()
	sig = agentapi.Signature(target, "read", "root", token, exp)
	if resp, b := get(fmt.Sprintf("%s&username=root&signature=%s&signature_expiration=%d", q, url.QueryEscape(sig), exp)); resp.StatusCode != 200 {
		t.Fatalf("signed with user and expiry: %d %s", resp.StatusCode, b)
	}
	old := time.Now().Add(-time.Minute).Unix()
	sig = agentapi.Signature(target, "read", "", token, old)
	if resp, _ := get(fmt.Sprintf("%s&signature=%s&signature_expiration=%d", q, url.QueryEscape(sig), old)); resp.StatusCode != 401 {
		t.Fatalf("expired: %d", resp.StatusCode)
	}
	// A read signature does not allow writing.
	sig = agentapi.Signature(target, "read", "", token, 0)
	req, _ = http.NewRequest("POST", e.ts.URL+q+"&signature="+url.QueryEscape(sig), strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, _ := do(t, req); resp.StatusCode != 401 {
		t.Fatalf("write with read signature: %d", resp.StatusCode)
	}
	sig = agentapi.Signature(target, "write", "", token, 0)
	req, _ = http.NewRequest("POST", e.ts.URL+q+"&signature="+url.QueryEscape(sig), strings.NewReader("rewritten"))
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, b := do(t, req); resp.StatusCode != 200 {
		t.Fatalf("write with write signature: %d %s", resp.StatusCode, b)
	}

	// /init with the token rotates it and sets env vars.
	req, _ = http.NewRequest("POST", e.ts.URL+"/init", strings.NewReader(`{"envVars":{"NEW":"1"},"accessToken":"rotated","defaultUser":"user","timestamp":"2026-01-01T00:00:00Z"}`))
	if resp, _ := do(t, req); resp.StatusCode != 401 {
		t.Fatalf("init without token: %d", resp.StatusCode)
	}
	req, _ = http.NewRequest("POST", e.ts.URL+"/init", strings.NewReader(`{"envVars":{"NEW":"1"},"accessToken":"rotated","defaultUser":"user","timestamp":"2026-01-01T00:00:00Z"}`))
	req.Header.Set("X-Access-Token", token)
	if resp, _ := do(t, req); resp.StatusCode != 204 || resp.Header.Get("X-Envd-Version") != agentapi.Version {
		t.Fatalf("init: %d", resp.StatusCode)
	}
	resp, b = get("/envs", "X-Access-Token", "rotated")
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"NEW":"1"`) {
		t.Fatalf("envs after init: %d %s", resp.StatusCode, b)
	}
	if e.srv.config().DefaultUser != "user" {
		t.Fatal("default user not updated")
	}
}

func TestTarRoundTrip(t *testing.T) {
	e := newTestEnv(t)
	src := filepath.Join(e.rootDir, "src")
	writeFile(t, filepath.Join(src, "a.txt"), "A")
	writeFile(t, filepath.Join(src, "sub", "deep", "b.txt"), "B")
	if err := os.Chmod(filepath.Join(src, "a.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}

	resp, body := do(t, mustReq("GET", e.ts.URL+"/cella/tar?path="+url.QueryEscape(src), nil))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	names := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(body))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
	for _, n := range []string{"a.txt", "link", "empty/", "sub/", "sub/deep/", "sub/deep/b.txt"} {
		if !names[n] {
			t.Errorf("tar lacks %s (has %v)", n, names)
		}
	}

	dst := filepath.Join(e.home, "dst")
	req := mustReq("POST", e.ts.URL+"/cella/tar?username=user&path="+url.QueryEscape(dst), bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-tar")
	if resp, b := do(t, req); resp.StatusCode != 200 {
		t.Fatalf("put: %d %s", resp.StatusCode, b)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "sub", "deep", "b.txt")); string(b) != "B" {
		t.Fatalf("b.txt %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "link")); l != "a.txt" {
		t.Fatalf("link %q", l)
	}
	if st, _ := os.Stat(filepath.Join(dst, "a.txt")); st == nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", st)
	}
	if st, _ := os.Stat(filepath.Join(dst, "empty")); st == nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("empty %v", st)
	}
	for _, p := range []string{dst, filepath.Join(dst, "a.txt"), filepath.Join(dst, "sub", "deep", "b.txt"), filepath.Join(dst, "empty")} {
		if ownerOf(t, p) != testUID {
			t.Errorf("%s not owned by user", p)
		}
	}

	// Entries that escape the target are refused.
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../escape.txt", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	req = mustReq("POST", e.ts.URL+"/cella/tar?path="+url.QueryEscape(dst), &evil)
	if resp, _ := do(t, req); resp.StatusCode != 400 {
		t.Fatalf("escape: %d", resp.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(e.home, "escape.txt")); err == nil {
		t.Fatal("escaped")
	}
	// Through a symlink placed by an earlier entry.
	evil.Reset()
	tw = tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "out", Linkname: e.rootDir, Typeflag: tar.TypeSymlink})
	tw.WriteHeader(&tar.Header{Name: "out/escape2.txt", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	req = mustReq("POST", e.ts.URL+"/cella/tar?path="+url.QueryEscape(filepath.Join(e.home, "dst2")), &evil)
	if resp, _ := do(t, req); resp.StatusCode != 400 {
		t.Fatalf("symlink escape: %d", resp.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(e.rootDir, "escape2.txt")); err == nil {
		t.Fatal("escaped through symlink")
	}
	// Missing dir: 404.
	if resp, _ := do(t, mustReq("GET", e.ts.URL+"/cella/tar?path=/nope", nil)); resp.StatusCode != 404 {
		t.Fatalf("missing: %d", resp.StatusCode)
	}
}

func mustReq(method, u string, body io.Reader) *http.Request {
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		panic(err)
	}
	return req
}

func TestUploadDiskFull(t *testing.T) {
	e := newTestEnv(t, func(c *agentapi.Config, o *Options) { c.Limits.DiskBytes = 1 << 30 })
	mnt := filepath.Join(e.rootDir, "small")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=256k"); err != nil {
		t.Skipf("cannot mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	target := filepath.Join(mnt, "big")
	req, _ := http.NewRequest("POST", e.ts.URL+"/files?path="+url.QueryEscape(target), bytes.NewReader(make([]byte, 1<<20)))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, b := do(t, req)
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(b), `"message":"sandbox disk limit 1024 MiB reached (raise with --disk / diskSizeMB)`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// A command failing on the full disk gets the named error too.
	e.srv.opts.DiskPath = mnt
	r := e.run(ctxT(t, 10*time.Second), bashReq("head -c 1M /dev/zero > "+filepath.Join(mnt, "big2")+" 2>/dev/null"))
	if r.end.GetError() != "sandbox disk limit 1 GiB reached (raise with --disk)" {
		t.Fatalf("end %+v", r.end)
	}
}
