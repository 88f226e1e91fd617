package agent

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/envd/filesystem"
)

// TestSymlinkEntries: ListDir and Stat encode symlinks as envd does, so that
// every SDK parses a listing of a Debian root (/bin -> usr/bin): a link to a
// directory is a directory with symlink_target, a dangling link has no type
// (the SDKs skip it), FILE_TYPE_SYMLINK never appears.
func TestSymlinkEntries(t *testing.T) {
	e := newTestEnv(t)
	ctx := ctxT(t, 10*time.Second)
	base := e.rootDir
	writeFile(t, filepath.Join(base, "usr", "bin", "tool"), "x")
	for link, target := range map[string]string{"bin": "usr/bin", "chain": "bin", "dangling": "nowhere", "tool": "usr/bin/tool"} {
		if err := os.Symlink(target, filepath.Join(base, link)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := e.fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: base}))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*filesystem.EntryInfo{}
	for _, en := range resp.Msg.Entries {
		if en.Type == filesystem.FileType_FILE_TYPE_SYMLINK {
			t.Errorf("%s: FILE_TYPE_SYMLINK sent", en.Path)
		}
		got[en.Name] = en
	}
	want := map[string]struct {
		typ    filesystem.FileType
		target string
	}{
		"bin":      {filesystem.FileType_FILE_TYPE_DIRECTORY, filepath.Join(base, "usr/bin")},
		"chain":    {filesystem.FileType_FILE_TYPE_DIRECTORY, filepath.Join(base, "usr/bin")},
		"tool":     {filesystem.FileType_FILE_TYPE_FILE, filepath.Join(base, "usr/bin/tool")},
		"dangling": {filesystem.FileType_FILE_TYPE_UNSPECIFIED, filepath.Join(base, "dangling")},
		"usr":      {filesystem.FileType_FILE_TYPE_DIRECTORY, ""},
	}
	for name, w := range want {
		en := got[name]
		if en == nil || en.Type != w.typ || en.GetSymlinkTarget() != w.target || en.Path != filepath.Join(base, name) {
			t.Errorf("%s: got %+v, want type %v target %q", name, en, w.typ, w.target)
		}
	}
	if m := got["bin"].GetMode(); m != 0o755 {
		t.Errorf("bin: mode %o, want the directory's 755", m)
	}
	st, err := e.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(base, "bin")}))
	if err != nil || st.Msg.Entry.Type != filesystem.FileType_FILE_TYPE_DIRECTORY || st.Msg.Entry.GetSymlinkTarget() != filepath.Join(base, "usr/bin") {
		t.Fatalf("stat of a directory link: %+v %v", st, err)
	}
	// Listing through the link lists the target, paths as requested.
	resp, err = e.fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Join(base, "bin")}))
	if err != nil || len(resp.Msg.Entries) != 1 || resp.Msg.Entries[0].Path != filepath.Join(base, "bin", "tool") {
		t.Fatalf("list through a link: %+v %v", resp, err)
	}
}

func TestFilesystemRPCs(t *testing.T) {
	e := newTestEnv(t)
	ctx := ctxT(t, 10*time.Second)
	base := e.rootDir
	writeFile(t, filepath.Join(base, "a.txt"), "hello")
	writeFile(t, filepath.Join(base, "d", "b.txt"), "b")
	writeFile(t, filepath.Join(base, "d", "e", "c.txt"), "c")
	if err := os.Symlink("a.txt", filepath.Join(base, "ln")); err != nil {
		t.Fatal(err)
	}

	list := func(depth uint32) []string {
		t.Helper()
		resp, err := e.fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: base, Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range resp.Msg.Entries {
			if en.Type == filesystem.FileType_FILE_TYPE_UNSPECIFIED {
				t.Errorf("unspecified type for %s", en.Path)
			}
			out = append(out, strings.TrimPrefix(en.Path, base+"/"))
		}
		sort.Strings(out)
		return out
	}
	if got := strings.Join(list(1), ","); got != "a.txt,d,ln" {
		t.Fatalf("depth 1: %s", got)
	}
	if got := strings.Join(list(2), ","); got != "a.txt,d,d/b.txt,d/e,ln" {
		t.Fatalf("depth 2: %s", got)
	}
	if got := strings.Join(list(0), ","); got != "a.txt,d,ln" {
		t.Fatalf("depth 0 (default 1): %s", got)
	}

	st, err := e.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(base, "a.txt")}))
	if err != nil {
		t.Fatal(err)
	}
	en := st.Msg.Entry
	if en.Name != "a.txt" || en.Type != filesystem.FileType_FILE_TYPE_FILE || en.Size != 5 || en.Mode != 0o644 ||
		en.Permissions != "-rw-r--r--" || en.Owner != "root" || en.Group != "root" || en.ModifiedTime == nil {
		t.Fatalf("stat %+v", en)
	}
	// envd's encoding of a symlink: its target's type and mode, the
	// resolved target, the link's own permissions string.
	st, err = e.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(base, "ln")}))
	if err != nil || st.Msg.Entry.Type != filesystem.FileType_FILE_TYPE_FILE || st.Msg.Entry.GetSymlinkTarget() != filepath.Join(base, "a.txt") ||
		st.Msg.Entry.Mode != 0o644 || !strings.HasPrefix(st.Msg.Entry.Permissions, "L") {
		t.Fatalf("symlink stat %+v %v", st, err)
	}
	_, err = e.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/nope"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat missing: %v", err)
	}
	// Unary errors are 404 JSON with a string code.
	req, _ := http.NewRequest("POST", e.ts.URL+"/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/nope"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(b), `"code":"not_found"`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}

	// MakeDir as the user: created, owned by the user; again: already_exists.
	mk := connect.NewRequest(&filesystem.MakeDirRequest{Path: "x/y"})
	mk.Header().Set("Authorization", basicAuth("user"))
	md, err := e.fs.MakeDir(ctx, mk)
	if err != nil {
		t.Fatal(err)
	}
	if md.Msg.Entry.Path != filepath.Join(e.home, "x/y") || md.Msg.Entry.Owner != "user" || md.Msg.Entry.Type != filesystem.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("mkdir %+v", md.Msg.Entry)
	}
	if ownerOf(t, filepath.Join(e.home, "x")) != testUID {
		t.Fatal("parent not owned by the user")
	}
	mk = connect.NewRequest(&filesystem.MakeDirRequest{Path: "x/y"})
	mk.Header().Set("Authorization", basicAuth("user"))
	if _, err := e.fs.MakeDir(ctx, mk); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("mkdir again: %v", err)
	}
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(base, "a.txt")})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("mkdir on file: %v", err)
	}

	// ListDir on a file.
	if _, err := e.fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Join(base, "a.txt")})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("listdir on file: %v", err)
	}

	// Move, into a new directory.
	mv, err := e.fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: filepath.Join(base, "a.txt"), Destination: filepath.Join(base, "new", "moved.txt")}))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.Entry.Name != "moved.txt" || mv.Msg.Entry.Size != 5 {
		t.Fatalf("move %+v", mv.Msg.Entry)
	}
	if _, err := e.fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: filepath.Join(base, "gone"), Destination: filepath.Join(base, "x")})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("move missing: %v", err)
	}

	// Remove: recursive, and a missing path is fine.
	for _, p := range []string{filepath.Join(base, "d"), filepath.Join(base, "d")} {
		if _, err := e.fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: p})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "d")); !os.IsNotExist(err) {
		t.Fatal("not removed")
	}
}

func TestWatchDir(t *testing.T) {
	e := newTestEnv(t)
	dir := filepath.Join(e.rootDir, "w")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stream, err := e.fs.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first event %v %v", stream.Msg(), stream.Err())
	}
	events := make(chan string, 100)
	go func() {
		for stream.Receive() {
			if ev := stream.Msg().GetFilesystem(); ev != nil {
				events <- strings.TrimPrefix(ev.Type.String(), "EVENT_TYPE_") + " " + ev.Name
			}
		}
		close(events)
	}()
	expect := func(want ...string) {
		t.Helper()
		pending := map[string]bool{}
		for _, w := range want {
			pending[w] = true
		}
		var seen []string
		for len(pending) > 0 {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended; saw %q, missing %v", seen, pending)
				}
				seen = append(seen, ev)
				delete(pending, ev)
			case <-time.After(3 * time.Second):
				t.Fatalf("saw %q, missing %v", seen, pending)
			}
		}
	}
	writeFile(t, filepath.Join(dir, "f.txt"), "x")
	expect("CREATE f.txt", "WRITE f.txt")
	if err := os.Rename(filepath.Join(dir, "f.txt"), filepath.Join(dir, "g.txt")); err != nil {
		t.Fatal(err)
	}
	expect("RENAME f.txt", "CREATE g.txt")
	if err := os.Chmod(filepath.Join(dir, "g.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	expect("CHMOD g.txt")
	os.Remove(filepath.Join(dir, "g.txt"))
	expect("REMOVE g.txt")
	// Recursive: existing and newly created subdirectories.
	writeFile(t, filepath.Join(dir, "sub", "s.txt"), "s")
	expect("CREATE sub/s.txt")
	if err := os.Mkdir(filepath.Join(dir, "later"), 0o755); err != nil {
		t.Fatal(err)
	}
	expect("CREATE later")
	time.Sleep(50 * time.Millisecond)
	writeFile(t, filepath.Join(dir, "later", "l.txt"), "l")
	expect("CREATE later/l.txt")

	// Errors.
	ws, err := e.fs.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: "/nope"}))
	if err == nil {
		for ws.Receive() {
		}
		err = ws.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("watch missing: %v", err)
	}
}

func TestNonStreamingWatcher(t *testing.T) {
	e := newTestEnv(t)
	ctx := ctxT(t, 10*time.Second)
	dir := filepath.Join(e.rootDir, "nw")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.WatcherId
	writeFile(t, filepath.Join(dir, "a"), "1")
	var got []*filesystem.FilesystemEvent
	eventually(t, 3*time.Second, "watcher events", func() bool {
		r, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Msg.Events...)
		return len(got) >= 2
	})
	if got[0].Name != "a" || got[0].Type != filesystem.EventType_EVENT_TYPE_CREATE || got[0].Entry == nil || got[0].Entry.Name != "a" {
		t.Fatalf("events %v", got)
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("after remove: %v", err)
	}
}
