package builds

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// chattyBuilder is a test double of the engine (the real one is
// internal/build): it sends lines of lineBytes until it has sent total
// bytes, then succeeds.
type chattyBuilder struct{ total, lineBytes int }

func (b chattyBuilder) Build(ctx context.Context, p tenant.Principal, spec build.Spec, files build.Files, log func(build.LogEntry)) (build.Result, error) {
	line := strings.Repeat("x", b.lineBytes)
	for sent := 0; sent < b.total; sent += b.lineBytes {
		log(build.LogEntry{Level: build.LevelInfo, Message: line, Step: "1"})
	}
	log(build.LogEntry{Level: build.LevelInfo, Message: "Build finished, took 0s"}) // as the engine does
	return build.Result{Template: spec.Name}, nil
}

func newTestService(t *testing.T, b build.Builder) (*Service, *store.Store) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "cella.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tpls, err := template.NewStore(filepath.Join(dir, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Store: st, Templates: tpls, Builder: b, Dir: filepath.Join(dir, "builds")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, st
}

func waitDone(t *testing.T, s *Service, c Caller, tid, bid string) Status {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := s.Status(context.Background(), c, tid, bid, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == StatusReady || st.Status == StatusError {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %s still %s", bid, st.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLogBounded: a RUN printing 100 MB keeps at most DefaultMaxLogBytes
// of it (plus the lines saying so), in SQLite and in memory, and the build
// goes on to ready, its last words kept past the cap.
func TestLogBounded(t *testing.T) {
	s, st := newTestService(t, chattyBuilder{total: 100 << 20, lineBytes: 1000})
	c := Caller{P: tenant.Principal{Key: "k1", Team: "t1"}, TeamName: "t1"}
	ctx := context.Background()
	req, err := s.RequestBuild(ctx, c, Request{Name: "chatty"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StartBuild(ctx, c, req.TemplateID, req.BuildID, Start{FromTemplate: "base"}); err != nil {
		t.Fatal(err)
	}
	if got := waitDone(t, s, c, req.TemplateID, req.BuildID); got.Status != StatusReady {
		t.Fatalf("status %+v", got)
	}
	n, err := st.CountBuildLogs(ctx, req.BuildID)
	if err != nil {
		t.Fatal(err)
	}
	all, err := st.BuildLogs(ctx, req.BuildID, 0, n)
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, l := range all {
		bytes += int64(len(l.Message))
	}
	if bytes > DefaultMaxLogBytes+4096 {
		t.Fatalf("the log kept %d bytes, more than its cap %d", bytes, DefaultMaxLogBytes)
	}
	var text []string
	for _, l := range all[len(all)-3:] {
		text = append(text, l.Message)
	}
	joined := strings.Join(text, "\n")
	for _, want := range []string{"reached its limit of 8 MiB", "log lines past the 8 MiB limit were not kept", "Build finished"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the log's end does not say %q:\n%s", want, joined)
		}
	}
}

// TestParseName: E2B's name rules.
func TestParseName(t *testing.T) {
	for in, want := range map[string]Name{
		"cella-demo":         {Alias: "cella-demo"},
		" Cella-Demo:V1 ":    {Alias: "cella-demo", Tag: "v1"},
		"acme/demo:1.2":      {Namespace: "acme", Alias: "demo", Tag: "1.2"},
		"demo:default":       {Alias: "demo"},
		"under_score:a-b_c.": {Alias: "under_score", Tag: "a-b_c."},
	} {
		got, err := ParseName(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Bad Name!", "a/b/c", "a:b:c", "a:", ":t", "/a", "a.b", "x:0b46bb07-b429-41b8-820e-861c28b9f6d9",
		strings.Repeat("a", 129)} {
		if _, err := ParseName(in); err == nil || !strings.HasPrefix(err.Error(), "Invalid template name") {
			t.Errorf("%q: %v, want Invalid template name", in, err)
		}
	}
}

// TestUploadToken: the URL's token binds template, hash, team and expiry;
// any change, or a URL past its expiry, is refused.
func TestUploadToken(t *testing.T) {
	s, _ := newTestService(t, nil)
	hash := strings.Repeat("ab", 32)
	exp := time.Now().Add(time.Hour).Unix()
	good := map[string]string{"team": "t1", "expires": fmt.Sprint(exp), "token": s.sign("tpl", hash, "t1", exp)}
	put := func(tid, h string, q map[string]string) error {
		v := map[string][]string{}
		for k, x := range q {
			v[k] = []string{x}
		}
		return s.Upload(context.Background(), tid, h, v, strings.NewReader("data"))
	}
	if err := put("tpl", hash, good); err != nil {
		t.Fatalf("a good token: %v", err)
	}
	with := func(k, v string) map[string]string {
		q := map[string]string{}
		for a, b := range good {
			q[a] = b
		}
		q[k] = v
		return q
	}
	past := time.Now().Add(-time.Second).Unix()
	for name, c := range map[string]struct {
		tid, hash string
		q         map[string]string
	}{
		"other template": {"tpl2", hash, good},
		"other hash":     {"tpl", strings.Repeat("cd", 32), good},
		"other team":     {"tpl", hash, with("team", "t2")},
		"later expiry":   {"tpl", hash, with("expires", fmt.Sprint(exp+1))},
		"flipped token":  {"tpl", hash, with("token", strings.Repeat("0", 64))},
		"expired":        {"tpl", hash, map[string]string{"team": "t1", "expires": fmt.Sprint(past), "token": s.sign("tpl", hash, "t1", past)}},
	} {
		err := put(c.tid, c.hash, c.q)
		if err == nil || !strings.Contains(err.Error(), "invalid or expired upload token") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
	f, err := teamFiles{s: s, team: "t1"}.Open(context.Background(), hash)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "data" {
		t.Fatalf("stored %q", b)
	}
	if _, err := (teamFiles{s: s, team: "t2"}).Open(context.Background(), hash); err == nil {
		t.Fatal("another team's cache has the file")
	}
	if err := put("tpl", hash, map[string]string{"team": "t1"}); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("a URL without its token: %v, want a 400", err)
	}
}
