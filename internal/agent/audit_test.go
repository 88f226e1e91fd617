package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/filesystem"
)

// The audit feed carries every process start and exit and every file
// written through the API, in order, and a follower that comes back with
// ?after= gets only what it has not seen.
func TestAuditFeed(t *testing.T) {
	e := newTestEnv(t)
	ctx := ctxT(t, 30*time.Second)
	e.run(ctx, bashReq("exit 3"))
	target := filepath.Join(e.home, "audited.txt")
	req, _ := http.NewRequest("POST", e.ts.URL+"/files?username=user&path="+url.QueryEscape(target), strings.NewReader("12345"))
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, b := do(t, req); resp.StatusCode != 200 {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: target})); err != nil {
		t.Fatal(err)
	}

	evs := follow(t, e, 0, 4)
	kinds := []string{}
	for _, ev := range evs {
		kinds = append(kinds, ev.Kind)
	}
	if strings.Join(kinds, ",") != "process.start,process.exit,file.write,file.remove" {
		t.Fatalf("kinds %v", kinds)
	}
	if !strings.Contains(evs[0].Cmd, "exit 3") || evs[0].PID == 0 || evs[1].PID != evs[0].PID {
		t.Fatalf("process events %+v %+v", evs[0], evs[1])
	}
	if evs[1].ExitCode == nil || *evs[1].ExitCode != 3 {
		t.Fatalf("exit event %+v", evs[1])
	}
	if evs[2].Path != target || evs[2].Size != 5 {
		t.Fatalf("file event %+v", evs[2])
	}
	// Resuming after the second event gives the third and fourth only.
	again := follow(t, e, evs[1].Seq, 2)
	if again[0].Seq != evs[2].Seq || again[1].Seq != evs[3].Seq {
		t.Fatalf("resume after %d: %+v", evs[1].Seq, again)
	}
	// Programs inside the sandbox (the local handler) cannot read it.
	ts := httptestServer(t, e.srv.LocalHandler())
	resp, err := http.Get(ts + "/cella/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("local /cella/events: %d", resp.StatusCode)
	}
}

// follow reads n audit events (skipping keepalives) after seq.
func follow(t *testing.T, e *testEnv, seq uint64, n int) []agentapi.AuditEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.ts.URL+"/cella/events?after="+strings.TrimSpace(jsonNum(seq)), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []agentapi.AuditEvent
	sc := bufio.NewScanner(resp.Body)
	for len(out) < n && sc.Scan() {
		var ev agentapi.AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if ev.Kind != "keepalive" {
			out = append(out, ev)
		}
	}
	if len(out) < n {
		t.Fatalf("got %d events, want %d: %+v (%v)", len(out), n, out, sc.Err())
	}
	return out
}

func jsonNum(n uint64) string { b, _ := json.Marshal(n); return string(b) }

func httptestServer(t *testing.T, h http.Handler) string {
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// TestAuditFeedKeepsTheNewest: past auditKeep events the oldest go, the
// sequence shows the gap, and since finds its place among those left.
func TestAuditFeedKeepsTheNewest(t *testing.T) {
	var f auditFeed
	const n = auditKeep + 904
	for range n {
		f.emit(agentapi.AuditEvent{Kind: "file.write"})
	}
	all, _ := f.since(0)
	if len(all) != auditKeep || all[0].Seq != n-auditKeep+1 || all[len(all)-1].Seq != n {
		t.Fatalf("since(0): %d events, seq %d..%d; want the newest %d, %d..%d", len(all), all[0].Seq, all[len(all)-1].Seq, auditKeep, n-auditKeep+1, n)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Seq != all[i-1].Seq+1 {
			t.Fatalf("seq %d follows %d", all[i].Seq, all[i-1].Seq)
		}
	}
	if tail, _ := f.since(n - 10); len(tail) != 10 || tail[0].Seq != n-9 {
		t.Fatalf("since(n-10): %d events from %d", len(tail), tail[0].Seq)
	}
	if none, _ := f.since(n); len(none) != 0 {
		t.Fatalf("since(n): %d events", len(none))
	}
	// A returned slice is the caller's: later emits do not change it.
	tail, _ := f.since(n - 1)
	f.emit(agentapi.AuditEvent{Kind: "file.mkdir"})
	if len(tail) != 1 || tail[0].Seq != n || tail[0].Kind != "file.write" {
		t.Fatalf("returned events changed: %+v", tail)
	}
}

// TestAuditFeedForgetsAnotherSandboxsEvents: a sandbox restored from
// another's snapshot is told its own identity through /init; the events its
// restored feed still holds are the other sandbox's and are not followed.
func TestAuditFeedForgetsAnotherSandboxsEvents(t *testing.T) {
	e := newTestEnv(t)
	init := func(id string) {
		t.Helper()
		req, _ := http.NewRequest("POST", e.ts.URL+"/init", strings.NewReader(`{"cellaSandboxID":"`+id+`"}`))
		if resp, b := do(t, req); resp.StatusCode != 204 {
			t.Fatalf("init %s: %d %s", id, resp.StatusCode, b)
		}
	}
	e.srv.audit.emit(agentapi.AuditEvent{Kind: "file.write", Path: "/home/user/original"})
	init("sbxtest") // the same identity (a warm sandbox handed out): kept
	if evs := follow(t, e, 0, 1); evs[0].Path != "/home/user/original" {
		t.Fatalf("after an init with the same identity: %+v", evs)
	}
	init("sbxfork")
	e.srv.audit.emit(agentapi.AuditEvent{Kind: "file.write", Path: "/home/user/fork"})
	evs := follow(t, e, 0, 1)
	if evs[0].Path != "/home/user/fork" || evs[0].Seq != 2 {
		t.Fatalf("the fork's feed from the start: first event %+v, want its own write with seq 2", evs[0])
	}
}
