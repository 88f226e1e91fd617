package agent

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/envd/filesystem"
)

// TestUploadMetadata: envd 0.6.2's file metadata. X-Metadata-* headers are
// stored as user.e2b.* xattrs (as the request's user), answered by the
// upload, stat, list and move; an overwrite replaces the whole set (without
// headers it clears it); a rename keeps it; other xattrs are left alone;
// an invalid set is a 400 naming the rule.
func TestUploadMetadata(t *testing.T) {
	e := newTestEnv(t)
	ctx := ctxT(t, 10*time.Second)
	target := filepath.Join(e.home, "m.txt")
	upload := func(body string, meta map[string]string) (int, []fileEntry) {
		t.Helper()
		req, _ := http.NewRequest("POST", e.ts.URL+"/files?username=user&path="+url.QueryEscape(target), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/octet-stream")
		for k, v := range meta {
			req.Header.Set("X-Metadata-"+k, v)
		}
		resp, b := do(t, req)
		var out []fileEntry
		if resp.StatusCode == 200 {
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
		}
		return resp.StatusCode, out
	}
	stat := func(p string) map[string]string {
		t.Helper()
		st, err := e.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: p}))
		if err != nil {
			t.Fatal(err)
		}
		return st.Msg.Entry.GetMetadata()
	}
	want := map[string]string{"origin": "agent-test", "kind": "text/plain; v=1"}
	code, entries := upload("one", map[string]string{"Origin": "agent-test", "Kind": "text/plain; v=1"})
	if code != 200 || len(entries) != 1 || !reflect.DeepEqual(entries[0].Metadata, want) {
		t.Fatalf("upload: %d %+v", code, entries)
	}
	if got := stat(target); !reflect.DeepEqual(got, want) {
		t.Fatalf("stat metadata %v, want %v", got, want)
	}
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil || st.Uid != 1000 {
		t.Fatalf("owner %d %v: written as the user", st.Uid, err)
	}
	list, err := e.fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: e.home}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, en := range list.Msg.Entries {
		if en.Name == "m.txt" {
			found = reflect.DeepEqual(en.GetMetadata(), want)
		}
	}
	if !found {
		t.Fatalf("list: no m.txt with %v: %v", want, list.Msg.Entries)
	}

	// Another tool's xattr survives; an overwrite replaces the set.
	if err := unix.Setxattr(target, "user.other", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	code, entries = upload("two", map[string]string{"Origin": "second"})
	if code != 200 || !reflect.DeepEqual(entries[0].Metadata, map[string]string{"origin": "second"}) {
		t.Fatalf("overwrite: %d %+v", code, entries)
	}
	if got := stat(target); !reflect.DeepEqual(got, map[string]string{"origin": "second"}) {
		t.Fatalf("after overwrite: %v", got)
	}
	code, entries = upload("three", nil)
	if code != 200 || entries[0].Metadata != nil || stat(target) != nil {
		t.Fatalf("overwrite without headers: %d %+v %v", code, entries, stat(target))
	}
	if v := make([]byte, 16); true {
		if n, err := unix.Getxattr(target, "user.other", v); err != nil || string(v[:n]) != "kept" {
			t.Fatalf("user.other: %q %v", v[:n], err)
		}
	}

	// A rename keeps the metadata.
	upload("four", map[string]string{"Origin": "moved"})
	moved := filepath.Join(e.home, "sub", "moved.txt")
	mv, err := e.fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: target, Destination: moved}))
	if err != nil || !reflect.DeepEqual(mv.Msg.Entry.GetMetadata(), map[string]string{"origin": "moved"}) {
		t.Fatalf("move: %+v %v", mv, err)
	}
	if got := stat(moved); !reflect.DeepEqual(got, map[string]string{"origin": "moved"}) {
		t.Fatalf("after rename: %v", got)
	}

	// Invalid sets are refused before anything is written.
	if code, _ := upload("x", map[string]string{"Big": strings.Repeat("v", 5000)}); code != 400 {
		t.Fatalf("oversized metadata: %d", code)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("a refused upload wrote the file: %v", err)
	}
}
