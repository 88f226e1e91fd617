package audit_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
)

func newLog(t *testing.T, o audit.Options) (*audit.Log, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "audit")
	l, err := audit.New(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, dir
}

func TestAppendRead(t *testing.T) {
	l, dir := newLog(t, audit.Options{})
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	code := 0
	in := []audit.Entry{
		{Time: t0, SandboxID: "sb1", Kind: audit.KindLifecycle, Source: audit.SourceDaemon, Message: "created"},
		{Time: t0.Add(1 * time.Second), SandboxID: "sb1", Kind: audit.KindDNS, Source: audit.SourceProxy, Host: "github.com", Decision: audit.DecisionAllowed},
		{Time: t0.Add(2 * time.Second), SandboxID: "sb1", Kind: audit.KindConnect, Source: audit.SourceProxy, Host: "evil.example", Dst: "203.0.113.9:443", Decision: audit.DecisionBlocked, Rule: "default", Reason: "not in the allowlist"},
		{Time: t0.Add(3 * time.Second), SandboxID: "sb1", Kind: audit.KindConnect, Source: audit.SourceProxy, Host: "github.com", Dst: "140.82.112.3:443", Decision: audit.DecisionAllowed, BytesOut: 100, BytesIn: 2000},
		{Time: t0.Add(4 * time.Second), SandboxID: "sb1", Kind: audit.KindProcessExit, Source: audit.SourceAgent, PID: 42, Cmd: "curl https://evil.example", ExitCode: &code},
		{Time: t0.Add(5 * time.Second), SandboxID: "sb2", Kind: audit.KindFileWrite, Source: audit.SourceDaemon, Path: "/home/user/a", Size: 5},
	}
	for _, e := range in {
		l.Append(e)
	}
	all, err := l.Read("sb1", audit.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 || all[0].Message != "created" || all[4].ExitCode == nil || *all[4].ExitCode != 0 || all[3].BytesIn != 2000 {
		t.Fatalf("read all: %+v", all)
	}
	for _, tc := range []struct {
		name string
		q    audit.Query
		want []int // indexes into in
	}{
		{"since", audit.Query{Since: t0.Add(3 * time.Second)}, []int{3, 4}},
		{"until", audit.Query{Until: t0.Add(1 * time.Second)}, []int{0, 1}},
		{"kind", audit.Query{Kind: []string{audit.KindConnect, audit.KindDNS}}, []int{1, 2, 3}},
		{"decision", audit.Query{Decision: audit.DecisionBlocked}, []int{2}},
		{"kind+decision", audit.Query{Kind: []string{audit.KindConnect}, Decision: audit.DecisionAllowed}, []int{3}},
		{"limit keeps the newest", audit.Query{Limit: 2}, []int{3, 4}},
	} {
		got, err := l.Read("sb1", tc.q)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %d entries, want %d: %+v", tc.name, len(got), len(tc.want), got)
		}
		for i, w := range tc.want {
			if !got[i].Time.Equal(in[w].Time) || got[i].Kind != in[w].Kind {
				t.Fatalf("%s: entry %d = %+v, want %+v", tc.name, i, got[i], in[w])
			}
		}
	}
	if got, _ := l.Read("sb2", audit.Query{}); len(got) != 1 || got[0].Path != "/home/user/a" {
		t.Fatalf("sb2: %+v", got)
	}
	if got, err := l.Read("nobody", audit.Query{}); err != nil || len(got) != 0 {
		t.Fatalf("no file: %v %v", got, err)
	}
	if !l.Exists("sb1") || l.Exists("nobody") || l.Exists("../etc") {
		t.Fatal("Exists")
	}

	// Files are JSONL, one entry a line, private to the daemon.
	fi, err := os.Stat(filepath.Join(dir, "sb1.jsonl"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("file: %v %v", fi, err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "sb1.jsonl"))
	if n := strings.Count(string(data), "\n"); n != 5 || !strings.Contains(string(data), `"sandboxId":"sb1","kind":"connect","source":"proxy"`) {
		t.Fatalf("file content (%d lines): %s", n, data)
	}
	if strings.Contains(string(data), `"pid":0`) || strings.Contains(string(data), `"path":""`) {
		t.Fatalf("empty fields written: %s", data)
	}

	if got := in[2].Line(); got != `connect blocked host=evil.example dst=203.0.113.9:443 rule=default reason="not in the allowlist"` {
		t.Fatalf("line: %s", got)
	}
	if got := in[0].Line(); got != "lifecycle: created" {
		t.Fatalf("line: %s", got)
	}
	if f := in[4].Fields(); f["exitCode"] != "0" || f["pid"] != "42" || f["kind"] != "process.exit" || f["time"] != "2026-01-02T03:04:09Z" {
		t.Fatalf("fields: %v", f)
	}

	if err := l.Remove("sb1"); err != nil {
		t.Fatal(err)
	}
	if l.Exists("sb1") {
		t.Fatal("file left after Remove")
	}
	if l.Remove("../x") == nil {
		t.Fatal("Remove accepted a path")
	}
}

func TestInvalidSandboxIDs(t *testing.T) {
	l, dir := newLog(t, audit.Options{})
	for _, id := range []string{"", ".", "..", "../x", "a/b", "-x", ".hidden"} {
		l.Append(audit.Entry{SandboxID: id, Kind: audit.KindDNS})
		if _, err := l.Read(id, audit.Query{}); err == nil {
			t.Errorf("Read(%q) accepted", id)
		}
	}
	l.Flush()
	if l.Invalid() != 7 {
		t.Fatalf("invalid count %d", l.Invalid())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("files made for invalid IDs: %v", entries)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "x.jsonl")); err == nil {
		t.Fatal("escaped the log dir")
	}
}

func TestConcurrentAppends(t *testing.T) {
	l, dir := newLog(t, audit.Options{Rate: -1})
	const writers, each = 32, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				l.Append(audit.Entry{SandboxID: fmt.Sprintf("sb%d", w%4), Kind: audit.KindConnect, Source: audit.SourceProxy,
					Host: fmt.Sprintf("w%d-%d", w, i), Message: strings.Repeat("m", i)})
			}
		})
	}
	wg.Wait()
	total := 0
	for s := range 4 {
		got, err := l.Read(fmt.Sprintf("sb%d", s), audit.Query{Limit: writers * each})
		if err != nil {
			t.Fatal(err)
		}
		total += len(got)
		// Each writer's entries keep their order.
		last := map[string]int{}
		for _, e := range got {
			var w, i int
			fmt.Sscanf(e.Host, "w%d-%d", &w, &i)
			k := fmt.Sprint(w)
			if prev, ok := last[k]; ok && i <= prev {
				t.Fatalf("writer %d: entry %d after %d", w, i, prev)
			}
			last[k] = i
		}
		// Every line is whole.
		f, _ := os.Open(filepath.Join(dir, fmt.Sprintf("sb%d.jsonl", s)))
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if !strings.HasPrefix(sc.Text(), "{") || !strings.HasSuffix(sc.Text(), "}") {
				t.Fatalf("torn line: %q", sc.Text())
			}
		}
		f.Close()
	}
	if total != writers*each {
		t.Fatalf("%d entries, want %d", total, writers*each)
	}
}

// An entry reaches its file promptly without anyone reading or flushing.
// The writer is woken at once; the 1 s bound leaves room for a loaded
// machine and still catches entries held back for a batch or until a
// Flush/Close.
func TestAppendVisibleWithin1s(t *testing.T) {
	l, dir := newLog(t, audit.Options{})
	for i := range 5 {
		start := time.Now()
		l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindDNS, Source: audit.SourceProxy, Host: fmt.Sprintf("h%d.example", i)})
		want := fmt.Sprintf(`"host":"h%d.example"`, i)
		for {
			data, _ := os.ReadFile(filepath.Join(dir, "sb.jsonl"))
			if strings.Contains(string(data), want) {
				break
			}
			if time.Since(start) > time.Second {
				t.Fatalf("entry %d not in the file after 1s", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func TestRedaction(t *testing.T) {
	redact := strings.NewReplacer("ghp_SECRET", "[secret:GH_TOKEN]").Replace
	l, dir := newLog(t, audit.Options{Redact: redact})
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindProcessStart, Source: audit.SourceAgent,
		Cmd: "curl -H 'Authorization: token ghp_SECRET' https://api.github.com", Message: "ghp_SECRET", Reason: "x ghp_SECRET",
		Host: "ghp_SECRET.example", Path: "/tmp/ghp_SECRET", Dst: "ghp_SECRET", Upstream: "ghp_SECRET", Rule: "ghp_SECRET"})
	got, err := l.Read("sb", audit.Query{})
	if err != nil || len(got) != 1 {
		t.Fatalf("%v %v", got, err)
	}
	if got[0].Cmd != "curl -H 'Authorization: token [secret:GH_TOKEN]' https://api.github.com" || got[0].Message != "[secret:GH_TOKEN]" {
		t.Fatalf("not redacted: %+v", got[0])
	}
	data, _ := os.ReadFile(filepath.Join(dir, "sb.jsonl"))
	if strings.Contains(string(data), "ghp_SECRET") {
		t.Fatalf("file holds the secret: %s", data)
	}

	// A long field is cut after redaction, so no partial value remains.
	l.Append(audit.Entry{SandboxID: "sb2", Kind: audit.KindProcessStart, Cmd: strings.Repeat("x", 4090) + "ghp_SECRET" + strings.Repeat("y", 5000)})
	got, _ = l.Read("sb2", audit.Query{})
	if len(got[0].Cmd) > 4096 || !strings.HasSuffix(got[0].Cmd, "…[truncated]") || strings.Contains(got[0].Cmd, "ghp_") {
		t.Fatalf("truncated cmd: len %d, tail %q", len(got[0].Cmd), got[0].Cmd[len(got[0].Cmd)-40:])
	}
}

// Past the cap the file keeps its newest half and says so at its end.
func TestSizeCap(t *testing.T) {
	const capBytes = 64 << 10
	l, dir := newLog(t, audit.Options{MaxFileBytes: capBytes, Rate: -1})
	path := filepath.Join(dir, "sb.jsonl")
	const n = 2000
	for i := range n {
		l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindDNS, Source: audit.SourceProxy, Host: fmt.Sprintf("host-%05d.example", i)})
		if i%100 == 0 {
			l.Flush() // several batches, so the cap is crossed more than once
		}
	}
	l.Flush()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > capBytes {
		t.Fatalf("file is %d bytes, cap %d", fi.Size(), capBytes)
	}
	got, err := l.Read("sb", audit.Query{Limit: n})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || len(got) >= n {
		t.Fatalf("%d entries after the cap", len(got))
	}
	var notes, prev int
	prev = -1
	for _, e := range got {
		if e.Kind == audit.KindLifecycle {
			notes++
			if !strings.Contains(e.Message, "cap") || !strings.Contains(e.Message, "dropped") {
				t.Fatalf("note: %q", e.Message)
			}
			continue
		}
		var i int
		fmt.Sscanf(e.Host, "host-%05d.example", &i)
		if i <= prev {
			t.Fatalf("order broken: %d after %d", i, prev)
		}
		prev = i
	}
	if notes == 0 {
		t.Fatal("no note of the cut")
	}
	if prev != n-1 {
		t.Fatalf("newest entry %d, want %d", prev, n-1)
	}
	if _, err := os.Stat(path + ".tmp"); err == nil {
		t.Fatal("temporary file left")
	}
}

func TestCloseFlushesAndDropsLater(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	l, err := audit.New(dir, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindDNS, Host: fmt.Sprint(i)})
	}
	l.Close()
	l.Close()
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindDNS, Host: "late"})
	got, err := l.Read("sb", audit.Query{Limit: 5000})
	if err != nil || len(got) != 1000 {
		t.Fatalf("after close: %d entries, %v", len(got), err)
	}
}

func TestLastSeqAndAgentFields(t *testing.T) {
	l, _ := newLog(t, audit.Options{Redact: strings.NewReplacer("s3cret", "[secret:X]").Replace})
	if n, err := l.LastSeq("sb", audit.SourceAgent); err != nil || n != 0 {
		t.Fatalf("no file: %d %v", n, err)
	}
	code := 137
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindProcessStart, Source: audit.SourceAgent, Seq: 7, PID: 9, Cmd: "sleep 1", User: "user", Cwd: "/home/s3cret"})
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindProcessExit, Source: audit.SourceAgent, Seq: 8, PID: 9, ExitCode: &code, Status: "signal: killed"})
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindFileRemove, Source: audit.SourceAgent, Seq: 9, Path: "/x", Error: "open /x: s3cret"})
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindConnect, Source: audit.SourceProxy, Seq: 100, Proto: "tls"})
	if n, err := l.LastSeq("sb", audit.SourceAgent); err != nil || n != 9 {
		t.Fatalf("last agent seq: %d %v", n, err)
	}
	got, _ := l.Read("sb", audit.Query{Kind: []string{audit.KindProcessStart, audit.KindFileRemove}})
	if len(got) != 2 || got[0].Cwd != "/home/[secret:X]" || got[0].User != "user" || got[1].Error != "open /x: [secret:X]" {
		t.Fatalf("agent fields: %+v", got)
	}
	all, _ := l.Read("sb", audit.Query{})
	if line := all[1].Line(); line != `process.exit pid=9 exitCode=137 status="signal: killed" seq=8` {
		t.Fatalf("line: %s", line)
	}
	if f := all[3].Fields(); f["proto"] != "tls" || f["seq"] != "100" {
		t.Fatalf("fields: %v", f)
	}
}

// Prune removes old logs of sandboxes that are gone and nothing else.
func TestPrune(t *testing.T) {
	dir := t.TempDir()
	l, err := audit.New(dir, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, id := range []string{"gone", "alive", "recent"} {
		l.Append(audit.Entry{SandboxID: id, Kind: audit.KindLifecycle, Source: audit.SourceDaemon, Message: "x"})
	}
	l.Flush()
	old := time.Now().Add(-48 * time.Hour)
	for _, id := range []string{"gone", "alive"} {
		if err := os.Chtimes(filepath.Join(dir, id+".jsonl"), old, old); err != nil {
			t.Fatal(err)
		}
	}
	n, err := l.Prune(24*time.Hour, func(id string) bool { return id == "alive" })
	if err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1", n, err)
	}
	if l.Exists("gone") || !l.Exists("alive") || !l.Exists("recent") {
		t.Fatalf("after prune: gone=%v alive=%v recent=%v", l.Exists("gone"), l.Exists("alive"), l.Exists("recent"))
	}
}

// TestBlockedSinceIndex: the "anything blocked since T?" question of every
// exec is answered from memory for a sandbox whose whole log this process
// wrote, and from the file for one whose log it found.
func TestBlockedSinceIndex(t *testing.T) {
	l, dir := newLog(t, audit.Options{})
	t0 := time.Now().Add(-time.Minute)
	blocked := func(id string, at time.Time) audit.Entry {
		return audit.Entry{Time: at, SandboxID: id, Kind: audit.KindConnect, Decision: audit.DecisionBlocked, Host: "x.test"}
	}
	read := func(l *audit.Log, id string, since time.Time) []audit.Entry {
		t.Helper()
		got, err := l.Read(id, audit.Query{Since: since, Decision: audit.DecisionBlocked})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	l.Append(blocked("fresh", t0))
	l.Append(audit.Entry{Time: t0.Add(time.Second), SandboxID: "fresh", Kind: audit.KindConnect, Decision: audit.DecisionAllowed})
	if got := read(l, "fresh", t0); len(got) != 1 {
		t.Fatalf("blocked since t0: %d entries, want 1", len(got))
	}
	// Asked after its last block, the log does not read the file: replacing
	// it with a directory (unreadable as a log) changes nothing.
	path := filepath.Join(dir, "fresh.jsonl")
	if err := os.Rename(path, path+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if got := read(l, "fresh", t0.Add(time.Nanosecond)); len(got) != 0 {
		t.Fatalf("blocked after the last block: %d entries", len(got))
	}
	// A block queued now is seen at once (the read then goes to the file).
	os.Remove(path)
	os.Rename(path+".moved", path)
	l.Append(blocked("fresh", t0.Add(2*time.Second)))
	if got := read(l, "fresh", t0.Add(time.Nanosecond)); len(got) != 1 || !got[0].Time.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("a new block: %+v", got)
	}

	// A log this process did not write in full (a daemon restart): its
	// older blocks are found in the file.
	l.Close()
	l2, err := audit.New(dir, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l2.Close() })
	l2.Append(audit.Entry{Time: t0.Add(3 * time.Second), SandboxID: "fresh", Kind: audit.KindConnect, Decision: audit.DecisionAllowed})
	if got := read(l2, "fresh", t0.Add(time.Nanosecond)); len(got) != 1 {
		t.Fatalf("after a restart: %d blocked entries, want the one in the file", len(got))
	}
	// Removing a log forgets its index too.
	if err := l2.Remove("fresh"); err != nil {
		t.Fatal(err)
	}
	l2.Append(blocked("fresh", t0.Add(4*time.Second)))
	if got := read(l2, "fresh", t0); len(got) != 1 {
		t.Fatalf("after Remove and a new block: %d entries, want 1", len(got))
	}
}
